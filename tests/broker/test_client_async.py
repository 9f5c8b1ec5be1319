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


def test_async_clients_delay_group_settings_and_later(tmp_path):
    """The async clients' delivery calls: a delayed send, group settings, and ``later`` through retry to the
    dead-letter topic."""

    async def main():
        import time

        async with group(tmp_path) as g:
            await g.leader()
            async with AsyncProducer(g.addresses) as prod, AsyncConsumer(g.addresses, "ag") as cons:
                await prod.create_topic("t", 1)
                assert (await prod.set_group_settings("ag", max_attempts=2, levels_ms=[100]))[
                    "max_attempts"
                ] == 2
                due = int(time.time() * 1000) + 300
                assert (await prod.send("t", b"d", deliver_at_ms=due)).topic == "%SYS%TIMER"
                got = []
                for _ in range(50):
                    got = await cons.pull("t", 0, 0, 8, 200)
                    if got:
                        break
                assert [m.body for m in got] == [b"d"] and time.time() * 1000 >= due
                first = await cons.later(got[0])
                assert (first.dead_lettered, first.attempt) == (False, 1)
                retried = []
                for _ in range(50):
                    if any(t.topic == cons.retry_topic for t in await prod.list_topics()):
                        retried = await cons.pull(cons.retry_topic, 0, 0, 8, 200)
                    if retried:
                        break
                    await asyncio.sleep(0.05)
                assert [m.body for m in retried] == [b"d"]
                assert (await cons.later(retried[0])).dead_lettered

    asyncio.run(main())


def test_a_closed_producer_leaves_no_completions_for_a_closed_loop(tmp_path):
    """An ``AsyncProducer`` closed at the end of one ``asyncio.run``, then another, and another: the
    completions of the session streams its close cancelled reach its own loop before that loop closes, so the
    next loop's gRPC poller is never handed them ("Exception in callback PollerCompletionQueue._handle_events
    ... RuntimeError: Event loop is closed", dledger/connections.py ``CLOSE_SETTLE_S``)."""
    from dledger import group as grp

    g = grp.create(tmp_path / "g", 1, None, state_machine="broker", flush="async")
    grp.start_node(g.nodes[0])
    seen: list[str] = []

    def record(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        seen.append(f"{context.get('message')}: {context.get('exception')!r}")

    async def burst(create: bool) -> None:
        asyncio.get_running_loop().set_exception_handler(record)
        async with AsyncProducer(g.addresses) as p:
            if create:
                await p.create_topic("T", 4)

            async def sender() -> None:
                for _ in range(20):
                    await p.send("T", b"x" * 1024)

            await asyncio.gather(*(sender() for _ in range(64)))

    try:
        grp.wait_for_leader(g, timeout_s=30)
        for i in range(12):
            asyncio.run(burst(i == 0))
    finally:
        grp.stop_group(g)
    assert seen == []
