"""The Broker service on in-process groups (real nodes, real gRPC on 127.0.0.1): sends get dense queue offsets
and CommitLog offsets that point at their entries, follower redirects, long polling, idempotent retries, bad
input, and queue offsets that stay dense and identical on every node when the leader is stopped."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from broker_adapter.client import BrokerConnection, Consumer, Producer
from broker_adapter.core import message
from broker_adapter.pulled import decode as decode_raw
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger.core.messages import Role
from storage.codec import HEADER_SIZE
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(90)


def run(coro):
    return asyncio.run(coro)


def group(tmp_path, n=3):
    return LocalGroup(tmp_path, n, state_machine_plugin="broker")


async def live_leader(g, stopped, timeout_s=15.0):
    """The one live node that leads (a stopped node keeps its last role in memory)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        leaders = [n for n in g.nodes.values() if n not in stopped and n.core.role is Role.LEADER]
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no single live leader within {timeout_s} s")


async def follower_of(g, leader):
    return next(n for n in g.nodes.values() if n is not leader)


def check_queues_everywhere(g, topic, queues, nodes=None):
    """Every node's ConsumeQueue units point at the entry holding the message with that queue and offset."""
    views = []
    for node in nodes or g.nodes.values():
        sm = node.plugin.state_machine
        view = []
        for q in range(queues):
            cq = sm.queue(topic, q)
            units = cq.read(0, cq.max_offset)
            assert [u.queue_offset for u in units] == list(range(cq.max_offset))
            for u in units:
                index = sm.index_of(u.commitlog_offset)
                e = node.log_store.entry(index)
                assert e.pos + HEADER_SIZE == u.commitlog_offset and e.header.body_length == u.size
                m = message.decode(bytes(e.body))
                assert (m.topic, m.queue_id, m.queue_offset, m.physical_offset) == (
                    topic,
                    q,
                    u.queue_offset,
                    u.commitlog_offset,
                )
            view.append([(u.commitlog_offset, u.size) for u in units])
        views.append(view)
    assert all(v == views[0] for v in views), "every node holds the same ConsumeQueues"
    return views[0]


def test_send_pull_commit_and_follower_redirect(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            leader = await g.leader()
            follower = await follower_of(g, leader)
            prod = Producer([follower.config.address])  # starts at a follower: redirected to the leader
            cons = Consumer(g.addresses, "g1")
            try:
                info = await asyncio.to_thread(prod.create_topic, "orders", 3)
                assert info.queues == 3
                results = []
                for i in range(12):
                    results.append(await asyncio.to_thread(prod.send, "orders", f"m{i}".encode(), "TagA"))
                batch = await asyncio.to_thread(
                    prod.send_batch, "orders", [b"b0", (b"b1", "T", ["k1"]), b"b2"]
                )
                results += batch
                by_queue = {}
                for r in results:
                    by_queue.setdefault(r.queue_id, []).append(r.queue_offset)
                assert all(offs == list(range(len(offs))) for offs in by_queue.values()), by_queue
                assert len({r.commitlog_offset for r in results}) == len(results)
                await g.until(
                    lambda: all(
                        sum(n.plugin.state_machine.next_offset("orders", q) for q in range(3)) == len(results)
                        for n in g.nodes.values()
                    ),
                    what="every node dispatched every acknowledged message",
                )
                check_queues_everywhere(g, "orders", 3)
                q = results[0].queue_id
                pulled = await asyncio.to_thread(
                    cons.pull, "orders", q, 0, 100, 0, True, follower.config.address
                )
                assert [m.queue_offset for m in pulled] == by_queue[q]
                assert {m.msg_id for m in pulled} <= {r.msg_id for r in results}
                assert pulled[0].tags == "TagA"
                raw = await asyncio.to_thread(
                    cons.call,
                    "Pull",
                    broker_pb2.PullRequest(topic="orders", queue_id=q, offset=0, max_messages=100, raw=True),
                    retry_unknown=True,
                )
                assert not raw.messages and raw.next_offset == len(pulled)
                assert decode_raw(raw.raw, raw.raw_count) == pulled
                got = [m async for m in _aiter(cons.messages("orders", idle_s=0.3))]
                assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in results)
                for qid in range(3):
                    assert await asyncio.to_thread(cons.committed, "orders", qid) == len(
                        by_queue.get(qid, [])
                    )
                again = [m async for m in _aiter(cons.messages("orders", idle_s=0.3))]
                assert again == [], "a group resumes from its committed offsets"
                # Every node's Route names its committed CommitLog end: just past its last applied entry.
                for n in g.nodes.values():
                    await g.until(
                        lambda n=n: n.plugin.state_machine.applied_index == n.log_store.last_index,
                        what=f"{n.id} applied its whole log",
                    )
                    r = await asyncio.to_thread(
                        prod.call,
                        "Route",
                        broker_pb2.RouteRequest(),
                        retry_unknown=True,
                        address=n.config.address,
                    )
                    assert r.node_id == n.id
                    assert r.max_commitlog_offset == n.log_store.tail().end_pos
                    assert r.max_commitlog_offset > max(x.commitlog_offset for x in results)
            finally:
                prod.close()
                cons.close()

    run(main())


async def _aiter(it):
    """Drive a blocking iterator in a thread, one item at a time."""
    sentinel = object()
    while True:
        item = await asyncio.to_thread(next, it, sentinel)
        if item is sentinel:
            return
        yield item


def test_long_poll_wakes_on_dispatch(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            await g.leader()
            prod = Producer(g.addresses)
            cons = Consumer(g.addresses, "g")
            try:
                await asyncio.to_thread(prod.create_topic, "t", 1)
                waiting = asyncio.ensure_future(asyncio.to_thread(cons.pull, "t", 0, 0, 10, 20_000))
                await asyncio.sleep(0)  # let the pull start; the send below wakes it long before 20 s
                r = await asyncio.to_thread(prod.send, "t", b"hello")
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                msgs = await asyncio.wait_for(waiting, 15)
                assert [m.body for m in msgs] in ([b"hello"], [])
                if not msgs:  # the pull may have started after the send: pull again, which returns at once
                    msgs = await asyncio.to_thread(cons.pull, "t", 0, 0, 10, 20_000)
                assert msgs[0].msg_id == r.msg_id and loop.time() - t0 < 15
            finally:
                prod.close()
                cons.close()

    run(main())


def test_retried_send_is_stored_once(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            leader = await g.leader()
            prod = Producer(g.addresses)
            try:
                await asyncio.to_thread(prod.create_topic, "t", 2)
                msg = await asyncio.to_thread(prod.outgoing, "t", b"once")
                first = await asyncio.to_thread(prod.send_messages, "t", [msg])
                again = await asyncio.to_thread(prod.send_messages, "t", [msg, prod.outgoing("t", b"two")])
                assert again[0].duplicate and not first[0].duplicate
                assert (again[0].queue_id, again[0].queue_offset, again[0].commitlog_offset) == (
                    first[0].queue_id,
                    first[0].queue_offset,
                    first[0].commitlog_offset,
                )
                assert not again[1].duplicate
                # concurrent retries of the same numbered message: exactly one is stored
                dup = await asyncio.to_thread(prod.outgoing, "t", b"racing")
                rs = await asyncio.gather(
                    *(asyncio.to_thread(prod.send_messages, "t", [dup]) for _ in range(4))
                )
                assert len({(r[0].queue_id, r[0].queue_offset) for r in rs}) == 1
                assert sum(not r[0].duplicate for r in rs) == 1
                sm = leader.plugin.state_machine
                last = leader.log_store.last_index
                await g.until(lambda: leader.metadata().applied_index >= last, what="applied")
                assert sum(sm.next_offset("t", q) for q in range(2)) == 3 and sm.duplicates == 0
            finally:
                prod.close()

    run(main())


def test_bad_input_is_rejected_and_nothing_written(tmp_path):
    async def main():
        async with group(tmp_path) as g:
            leader = await g.leader()
            follower = await follower_of(g, leader)
            conn = BrokerConnection(g.addresses)
            ch = grpc.aio.insecure_channel(leader.config.address)
            stub = broker_pb2_grpc.BrokerStub(ch)
            fstub = broker_pb2_grpc.BrokerStub(grpc.aio.insecure_channel(follower.config.address))
            try:
                await asyncio.to_thread(conn.create_topic, "t", 2)
                before = leader.log_store.last_index

                async def code(call, req, stub=stub):
                    with pytest.raises(grpc.aio.AioRpcError) as ei:
                        await getattr(stub, call)(req)
                    return ei.value.code(), ei.value.details(), dict(ei.value.trailing_metadata() or ())

                out = broker_pb2.OutgoingMessage
                c, d, _ = await code(
                    "CreateTopic", broker_pb2.CreateTopicRequest(topic="bad topic!", queues=1)
                )
                assert c == grpc.StatusCode.INVALID_ARGUMENT and "invalid topic" in d
                c, d, _ = await code("Send", broker_pb2.SendRequest(topic="nope", messages=[out(body=b"x")]))
                assert c == grpc.StatusCode.NOT_FOUND and "unknown topic" in d
                c, d, _ = await code("Send", broker_pb2.SendRequest(topic="t", messages=[out(queue_id=7)]))
                assert c == grpc.StatusCode.NOT_FOUND and "unknown queue" in d
                big = out(body=b"x" * (leader.config.max_body_bytes + 1))
                c, d, _ = await code("Send", broker_pb2.SendRequest(topic="t", messages=[big]))
                assert c == grpc.StatusCode.INVALID_ARGUMENT and "limit" in d
                c, d, _ = await code("Pull", broker_pb2.PullRequest(topic="t", queue_id=0, offset=-1))
                assert c == grpc.StatusCode.INVALID_ARGUMENT and "offset" in d
                c, d, _ = await code("Pull", broker_pb2.PullRequest(topic="t", queue_id=0, offset=5))
                assert c == grpc.StatusCode.INVALID_ARGUMENT and "beyond the end" in d
                c, d, _ = await code("Pull", broker_pb2.PullRequest(topic="t", queue_id=9, offset=0))
                assert c == grpc.StatusCode.NOT_FOUND
                req = broker_pb2.QueryOffsetRequest(group="nobody", topic="t", queue_id=0)
                c, d, _ = await code("QueryOffset", req)
                assert c == grpc.StatusCode.NOT_FOUND and "unknown consumer group" in d
                req = broker_pb2.CommitOffsetRequest(group="g", topic="t", queue_id=0, offset=3)
                c, d, _ = await code("CommitOffset", req)
                assert c == grpc.StatusCode.INVALID_ARGUMENT
                c, d, md = await code(
                    "Send", broker_pb2.SendRequest(topic="t", messages=[out(body=b"x")]), fstub
                )
                assert (
                    c == grpc.StatusCode.FAILED_PRECONDITION and md["leader-address"] == leader.config.address
                )
                assert leader.log_store.last_index == before, "rejected requests wrote nothing"
                route = await fstub.Route(broker_pb2.RouteRequest())
                assert (route.node_id, route.leader_id, route.leader_address) == (
                    follower.id,
                    leader.id,
                    leader.config.address,
                )
            finally:
                conn.close()
                await ch.close()

    run(main())


def test_offsets_dense_and_identical_across_leader_stops(tmp_path):
    async def main():
        async with group(tmp_path, 5) as g:
            await g.leader()
            prod = Producer(g.addresses, retry_for_s=30)
            acked = []
            try:
                await asyncio.to_thread(prod.create_topic, "t", 3)
                stopped = []
                for round_ in range(3):
                    sends = [
                        asyncio.to_thread(prod.send_batch, "t", [b"x%d" % i for i in range(8)])
                        for _ in range(3)
                    ]
                    if round_ < 2:
                        leader = await live_leader(g, stopped)
                        stopper = asyncio.ensure_future(leader.stop())
                        stopped.append(leader)
                    for r in await asyncio.gather(*sends, return_exceptions=True):
                        if not isinstance(r, BaseException):
                            acked += r
                    if round_ < 2:
                        await stopper
                live = [n for n in g.nodes.values() if n not in stopped]
                leader = await live_leader(g, stopped)
                acked += await asyncio.to_thread(prod.send_batch, "t", [b"tail"] * 5)
                last = leader.log_store.last_index  # acks come at commit; wait for every live node to apply
                await g.until(
                    lambda: all(n.metadata().applied_index >= last for n in live),
                    what="applied everywhere",
                )
                assert leader.core.role is Role.LEADER
                check_queues_everywhere(g, "t", 3, live)
                sm = leader.plugin.state_machine
                stored = {(q, o) for q in range(3) for o in range(sm.next_offset("t", q))}
                assert {(r.queue_id, r.queue_offset) for r in acked} <= stored
                assert sm.duplicates == 0
            finally:
                prod.close()

    run(main())


def test_topic_auto_create_is_off_by_default_and_goes_through_the_log_when_on(tmp_path):
    out = broker_pb2.OutgoingMessage

    async def main():
        async with LocalGroup(
            tmp_path / "on",
            3,
            state_machine_plugin="broker",
            sections={"broker": {"auto_create_topic_queues": 3}},
        ) as g:
            leader = await g.leader()
            async with grpc.aio.insecure_channel(leader.config.address) as ch:
                stub = broker_pb2_grpc.BrokerStub(ch)
                # Concurrent first sends to one new topic: each succeeds, the topic is created once.
                sends = [
                    stub.Send(
                        broker_pb2.SendRequest(topic="fresh", messages=[out(body=b"%d" % i, queue_id=i % 3)])
                    )
                    for i in range(6)
                ]
                results = await asyncio.gather(*sends)
                assert sorted((r.results[0].queue_id, r.results[0].queue_offset) for r in results) == [
                    (0, 0),
                    (0, 1),
                    (1, 0),
                    (1, 1),
                    (2, 0),
                    (2, 1),
                ]
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await stub.Send(broker_pb2.SendRequest(topic="fresh", messages=[out(queue_id=3)]))
                assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "unknown queue" in ei.value.details()
            last = leader.log_store.last_index
            await g.until(
                lambda: all(n.plugin.state_machine.applied_index >= last for n in g.nodes.values()),
                what="apply",
            )
            assert {n.plugin.state_machine.topics.get("fresh") for n in g.nodes.values()} == {3}
            check_queues_everywhere(g, "fresh", 3)

        async with group(tmp_path / "off") as g:
            leader = await g.leader()
            # A new leader's first entry (its term's no-op) may not be in its log yet: wait, or it lands after
            # ``before`` and looks like a write of the refused send.
            await g.until(lambda: leader.commit_index >= 0, what="the leader's first entry committed")
            before = leader.log_store.last_index
            async with grpc.aio.insecure_channel(leader.config.address) as ch:
                stub = broker_pb2_grpc.BrokerStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await stub.Send(broker_pb2.SendRequest(topic="fresh", messages=[out(body=b"x")]))
                assert ei.value.code() == grpc.StatusCode.NOT_FOUND
                assert "auto_create_topic_queues" in ei.value.details()
            assert leader.log_store.last_index == before, "nothing was written"

    run(main())


def test_delayed_send_and_group_settings_through_our_clients(tmp_path):
    """Our Producer's ``deliver_at_ms`` and ``set_group_settings`` over gRPC: every node holds the same timer
    index and settings; the message reaches its topic once, not before its time; too far ahead is refused."""

    async def main():
        async with group(tmp_path) as g:
            await g.leader()
            prod = Producer(g.addresses)
            cons = Consumer(g.addresses, "delayed-g")
            try:
                await asyncio.to_thread(prod.create_topic, "t", 1)
                got = await asyncio.to_thread(prod.set_group_settings, "g1", fifo=True, max_attempts=5)
                assert (got["fifo"], got["max_attempts"]) == (True, 5)
                due = int(time.time() * 1000) + 1_500
                r = await asyncio.to_thread(prod.send, "t", b"later", None, None, due)
                assert r.topic == "%SYS%TIMER"
                assert await asyncio.to_thread(cons.pull, "t", 0, 0) == []
                sms = [n.plugin.state_machine for n in g.nodes.values()]
                await g.until(lambda: all(len(sm.timer) == 1 for sm in sms), what="timer entry everywhere")
                assert all(sm.group_settings("g1").fifo for sm in sms)

                async def arrived():
                    return await asyncio.to_thread(cons.pull, "t", 0, 0, 8, 500)

                msgs = []
                for _ in range(40):
                    msgs = await arrived()
                    if msgs:
                        break
                assert [m.body for m in msgs] == [b"later"]
                assert time.time() * 1000 >= due
                await g.until(
                    lambda: all(len(sm.timer) == 0 for sm in sms), what="timer entry ended everywhere"
                )
                assert all(sm.repeats == 0 and sm.next_offset("t", 0) == 1 for sm in sms)
                with pytest.raises(Exception, match="max_delay_ms"):
                    await asyncio.to_thread(prod.send, "t", b"too late", None, None, due + 3 * 86_400_000)
                with pytest.raises(Exception, match="max_attempts"):
                    await asyncio.to_thread(prod.set_group_settings, "g1", max_attempts=5000)
            finally:
                prod.close()
                cons.close()

    run(main())
