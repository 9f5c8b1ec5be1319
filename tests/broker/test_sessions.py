"""Producer sessions (docs/broker.md, "Producer sessions"): messages sent in their stored form over one
``SendStream``, checked by the leader without decoding, on in-process groups (real nodes, real gRPC on 127.0.0.1).

- ``message.check_stored`` refuses what the leader must not store, naming the field;
- one session carries sends to many topics at once, each caller gets its own results, and what a consumer reads
  is what was sent (ids, bodies, tags, keys, born time), with the leader's store time;
- a refused batch gets its reason and writes nothing, and the session goes on; a follower names the leader;
- a batch sent again is stored once (the first attempt's place, ``duplicate``);
- a producer whose leader is stopped under concurrent sends gets every send answered, and each message is in
  the log once.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter

import grpc
import pytest

from broker_adapter.client import AsyncProducer, BrokerConnection, Consumer
from broker_adapter.core import message
from broker_adapter.pulled import decode as decode_raw
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from tests.broker.test_service import follower_of, group, live_leader, run

pytestmark = pytest.mark.timeout(120)


def stored(topic: str, body: bytes = b"x", queue_id: int = 0, **kw) -> bytes:
    raw, _ = message.encode_send(topic, body, queue_id, kw.pop("msg_id", "ID"), **kw)
    return raw


def patched(raw: bytes, at: int, fmt: str, value: int) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, at, value)
    return bytes(buf)


def test_check_stored_refuses_what_the_leader_must_not_store():
    good = stored("t", b"hello", 1, tags="A", keys=["k"], producer_id="p", sequence=7)
    r = message.check_stored(good)
    assert (r.topic, r.queue_id, r.tags, r.producer, r.origin) == ("t", 1, "A", ("p", 7), None)
    body_at = message.FIXED_SIZE + 4
    uniq = message.PROPERTY_UNIQ_KEY.encode()
    bad = {
        "shorter than": good[:50],
        "TOTALSIZE": good + b"\0",
        "MAGICCODE": patched(good, 4, ">i", 0x1234),
        "BODYCRC": good[:body_at] + b"j" + good[body_at + 1 :],
        "QUEUEOFFSET and PHYSICALOFFSET": patched(good, message.QUEUE_OFFSET_OFFSET, ">q", 5),
        "SYSFLAG": patched(good, 36, ">i", 0x10),
        "negative": patched(good, 12, ">i", -1),
        "no value separator": stored("t").replace(uniq + b"\x01ID", uniq + b"_ID"),
        "PROPERTIES are not UTF-8": stored("t").replace(b"ID\x02", b"\xff\xfe\x02"),
        "TOPIC is not UTF-8": stored("tx").replace(b"\x02tx", b"\x02t\xff", 1),
        "TAGS appears twice": stored("t", tags="A", properties={"XXXX": "B"}).replace(b"XXXX", b"TAGS"),
    }
    for why, raw in bad.items():
        assert raw != good, why
        with pytest.raises(message.MessageFormatError, match=why):
            message.check_stored(raw)
            pytest.fail(f"accepted: {why}")


def test_one_session_carries_many_topics_and_each_caller_gets_its_own(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            await g.leader()
            with BrokerConnection(g.addresses) as admin:
                for t in range(5):
                    await asyncio.to_thread(admin.create_topic, f"t{t}", 2)
            async with AsyncProducer(g.addresses) as p:
                sends = [
                    p.send(f"t{i % 5}", b"body-%d" % i, tags=f"tag{i % 3}", keys=[f"k{i}"])
                    for i in range(300)
                ]
                results = await asyncio.gather(*sends)
            placed = Counter((r.topic, r.queue_id) for r in results)
            for (topic, q), n in placed.items():
                offsets = sorted(r.queue_offset for r in results if (r.topic, r.queue_id) == (topic, q))
                assert offsets == list(range(n)), f"{topic}/{q}: dense, each message once"
            assert len({r.commitlog_offset for r in results}) == 300 and not any(r.duplicate for r in results)
            sent = {r.msg_id: (i, r) for i, r in enumerate(results)}
            with Consumer(g.addresses, "reader") as c:
                for topic, q in placed:
                    for m in await asyncio.to_thread(c.pull, topic, q, 0, 512):
                        i, r = sent.pop(m.msg_id)
                        assert (m.topic, m.queue_offset, m.commitlog_offset) == (
                            r.topic,
                            r.queue_offset,
                            r.commitlog_offset,
                        )
                        assert (m.body, m.tags, tuple(m.keys)) == (b"body-%d" % i, f"tag{i % 3}", (f"k{i}",))
                        assert m.store_timestamp >= m.born_timestamp > 0, "the leader stamped its store time"
            assert not sent, "every acknowledged message is there"

    run(main())


def test_a_refused_batch_gets_its_reason_writes_nothing_and_the_session_goes_on(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            leader = await g.leader()
            follower = await follower_of(g, leader)
            with BrokerConnection(g.addresses) as admin:
                await asyncio.to_thread(admin.create_topic, "t", 2)
            before = leader.log_store.last_index
            origin = stored("t", properties={message.PROPERTY_ORIGIN: "elsewhere"})
            batches = {
                "empty": ([], "INVALID_ARGUMENT", "1..1024"),
                "garbage": ([b"not a message"], "INVALID_ARGUMENT", "message 0: message is 13 bytes"),
                "bad crc": (
                    [stored("t"), stored("t", b"abc").replace(b"abc", b"abd", 1)],
                    "INVALID_ARGUMENT",
                    "message 1: BODYCRC",
                ),
                "unknown topic": ([stored("nope")], "NOT_FOUND", "unknown topic"),
                "unknown queue": ([stored("t", queue_id=9)], "NOT_FOUND", "unknown queue t/9"),
                "the broker's own property": ([origin], "INVALID_ARGUMENT", message.PROPERTY_ORIGIN),
                "too big": (
                    [stored("t", b"x" * leader.config.max_body_bytes)],
                    "INVALID_ARGUMENT",
                    "max_body_bytes",
                ),
                "a system topic": ([stored("%SYS%TIMER")], "INVALID_ARGUMENT", "%SYS%"),
            }
            async with grpc.aio.insecure_channel(leader.config.address) as ch:
                call = broker_pb2_grpc.BrokerStub(ch).SendStream()
                for i, (raws, _, _) in enumerate(batches.values()):
                    await call.write(broker_pb2.SendBatch(batch_id=i, messages=raws))
                await call.write(broker_pb2.SendBatch(batch_id=99, messages=[stored("t", b"fine")]))
                await call.done_writing()
                answers = {r.batch_id: r async for r in call}
            for i, (what, (_, code, why)) in enumerate(batches.items()):
                e = answers[i].error
                assert e.code == code and why in e.message, f"{what}: {e}"
                assert not answers[i].queue_offsets, what
            assert leader.log_store.last_index == before + 1, "only the good batch was written"
            good = answers[99]
            assert not good.HasField("error") and list(good.duplicates) == [False]
            async with grpc.aio.insecure_channel(follower.config.address) as ch:
                call = broker_pb2_grpc.BrokerStub(ch).SendStream()
                await call.write(broker_pb2.SendBatch(batch_id=1, messages=[stored("t")]))
                await call.done_writing()
                (r,) = [r async for r in call]
            assert r.error.code == "FAILED_PRECONDITION" and r.error.leader_address == leader.config.address

    run(main())


def test_a_batch_sent_again_is_stored_once(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            leader = await g.leader()
            with BrokerConnection(g.addresses) as admin:
                await asyncio.to_thread(admin.create_topic, "t", 2)
            raws = [
                stored("t", b"m%d" % i, i % 2, msg_id=f"M{i}", producer_id="prod", sequence=i)
                for i in range(4)
            ]
            async with grpc.aio.insecure_channel(leader.config.address) as ch:
                call = broker_pb2_grpc.BrokerStub(ch).SendStream()
                await call.write(broker_pb2.SendBatch(batch_id=1, messages=raws))
                first = await call.read()
                await call.write(broker_pb2.SendBatch(batch_id=2, messages=[raws[3], raws[1]]))
                again = await call.read()
                await call.done_writing()
            assert list(first.duplicates) == [False] * 4 and list(again.duplicates) == [True, True]
            assert list(again.commitlog_offsets) == [first.commitlog_offsets[3], first.commitlog_offsets[1]]
            assert list(again.queue_offsets) == [first.queue_offsets[3], first.queue_offsets[1]]
            with Consumer(g.addresses, "reader") as c:
                got = [m for q in (0, 1) for m in await asyncio.to_thread(c.pull, "t", q, 0, 16)]
            assert sorted(m.msg_id for m in got) == ["M0", "M1", "M2", "M3"], "each message once"
            raw = await asyncio.to_thread(
                BrokerConnection(g.addresses).call,
                "Pull",
                broker_pb2.PullRequest(topic="t", queue_id=1, offset=0, max_messages=8, raw=True),
                retry_unknown=True,
            )
            assert [m.queue_offset for m in decode_raw(raw.raw, raw.raw_count)] == [0, 1]

    run(main())


def test_a_leader_stopped_under_concurrent_sends_loses_and_doubles_nothing(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            await g.leader()
            with BrokerConnection(g.addresses) as admin:
                await asyncio.to_thread(admin.create_topic, "t", 4)
            stopped = []
            async with AsyncProducer(g.addresses, timeout_s=5, retry_for_s=30) as p:
                acked_before_stop: list[int] = []

                async def sender(k: int) -> list:
                    return [await p.send("t", b"s%d-%d" % (k, i)) for i in range(60)]

                async def stop_the_leader(sending: list[asyncio.Task]) -> None:
                    while not p._sessions._streams:  # until the session is up
                        await asyncio.sleep(0.001)
                    await asyncio.sleep(0.02)
                    leader = await live_leader(g, stopped)
                    acked_before_stop.append(sum(t.done() for t in sending))
                    stopped.append(leader)
                    await leader.stop()

                sending = [asyncio.create_task(sender(k)) for k in range(8)]
                await stop_the_leader(sending)
                sent = await asyncio.gather(*sending)
            acked = [r for rs in sent for r in rs]
            assert len(acked) == 480, "every send was answered"
            assert acked_before_stop == [0], "the leader stopped while the senders were still sending"
            leader = await live_leader(g, stopped)
            with Consumer([leader.config.address], "reader") as c:
                got = [m for q in range(4) for m in await asyncio.to_thread(c.pull, "t", q, 0, 1024)]
            counts = Counter(m.body for m in got)
            assert set(counts) == {b"s%d-%d" % (k, i) for k in range(8) for i in range(60)}, "nothing lost"
            assert max(counts.values()) == 1, "nothing stored twice"
            by_id = {m.msg_id: m for m in got}
            for r in acked:  # an answer names where the message is, a retried one too
                m = by_id[r.msg_id]
                assert (m.queue_id, m.queue_offset, m.commitlog_offset) == (
                    r.queue_id,
                    r.queue_offset,
                    r.commitlog_offset,
                )

    run(main())
