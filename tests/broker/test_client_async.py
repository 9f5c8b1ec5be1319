"""``AsyncProducer`` / ``AsyncConsumer`` on an in-process group, and a ``Producer`` shared by many threads:
every concurrent send is acknowledged once with dense queue offsets, redirects from a follower are followed,
and a consumer group reads everything back and resumes from its committed offsets."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_adapter.client import AsyncConsumer, AsyncProducer, Producer
from dledger.errors import DLedgerError
from tests.broker.test_service import follower_of, group

pytestmark = pytest.mark.timeout(90)


def _dense(results) -> None:
    by_queue: dict[int, list[int]] = {}
    for r in results:
        by_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    assert all(sorted(offs) == list(range(len(offs))) for offs in by_queue.values()), by_queue
    assert len({r.commitlog_offset for r in results}) == len(results)
    assert len({r.msg_id for r in results}) == len(results)


def test_async_producer_and_consumer(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            leader = await g.leader()
            follower = await follower_of(g, leader)
            async with (
                AsyncProducer([follower.config.address]) as prod,
                AsyncConsumer(g.addresses, "readers") as cons,
            ):
                assert (await prod.create_topic("orders", 3)).queues == 3
                sent = await asyncio.gather(*(prod.send("orders", f"m{i}".encode(), "T") for i in range(200)))
                sent += await prod.send_batch("orders", [b"b0", (b"b1", None, ["k"])])
                _dense(sent)
                assert prod._router.leader == leader.config.address
                with pytest.raises(DLedgerError, match="unknown topic"):
                    await prod.send("nope", b"x")
                got = [m async for m in cons.messages("orders", idle_s=0.3)]
                assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in sent)
                assert {m.tags for m in got if m.body.startswith(b"m")} == {"T"}
                counts = [sum(r.queue_id == q for r in sent) for q in range(3)]
                assert [await cons.committed("orders", q) for q in range(3)] == counts
                assert [m async for m in cons.messages("orders", idle_s=0.3)] == []
                q = sent[0].queue_id
                pulled = await cons.pull(
                    "orders", q, 0, 500, allow_follower=True, address=follower.config.address
                )
                assert [m.queue_offset for m in pulled] == list(range(counts[q]))

    asyncio.run(main())


def test_a_producer_shared_by_threads(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            await g.leader()
            with Producer(g.addresses) as prod:
                await asyncio.to_thread(prod.create_topic, "t", 4)
                by_thread: list[list] = [[] for _ in range(16)]
                errors: list = []

                def worker(k: int) -> None:
                    try:
                        for i in range(20):
                            by_thread[k].append(prod.send("t", f"{k}/{i}".encode(), keys=[f"k{k}"]))
                    except Exception as e:  # reported below
                        errors.append(e)

                def run_all() -> None:
                    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join(60)

                await asyncio.to_thread(run_all)
                results = [r for rs in by_thread for r in rs]
                assert errors == [] and len(results) == 320
                _dense(results)
                # one key, one queue: each thread's messages are in its key's queue, in the order it sent them
                for rs in by_thread:
                    assert len({r.queue_id for r in rs}) == 1
                    assert [r.queue_offset for r in rs] == sorted(r.queue_offset for r in rs)

    asyncio.run(main())
