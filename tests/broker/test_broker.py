"""The protocol-neutral broker (``broker_adapter.core.broker``) without processes or gRPC: a node double implementing
``dledger.plugins.NodeHandle`` appends to an in-memory log and applies entries to the real dispatcher, at once
or when the test says (``hold``), so sends, pulls, offsets and pops run through the real allocator, CommitLog,
ConsumeQueues and invisibility state."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from broker_adapter.core import message
from broker_adapter.core.allocator import QueueOffsetAllocator
from broker_adapter.core.broker import Broker
from broker_adapter.core.invisibility import Outcome
from broker_adapter.core.model import (
    InvalidGroupError,
    InvalidTopicError,
    OffsetRangeError,
    OutgoingMessage,
    UnknownGroupError,
    UnknownQueueError,
    UnknownTopicError,
)
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.settings import BrokerSettings
from dledger.core.messages import Role
from dledger.errors import InvalidRequestError, NotLeaderError, UnavailableError
from dledger.plugins import NodeHandle
from dledger.transport.base import AppendedRun
from statemachine.api import CommittedEntry
from statemachine.apply_loop import Applied
from storage import codec
from storage.codec import HEADER_SIZE, MAGIC_NORMAL
from storage.memory import MemoryLogStore


class FakeNode:
    """A one-node 'group' that commits at once: ``NodeHandle`` over a MemoryLogStore and a dispatcher."""

    def __init__(self, sm: BrokerStateMachine, auto_create: int = 0, max_body: int = 1 << 20):
        self.id, self.group = "n0", "g"
        self.auto_create = auto_create
        self.config = SimpleNamespace(
            max_body_bytes=max_body,
            peers={"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"},
        )
        self.log_store = MemoryLogStore()
        self.term = 1
        self.leader_id: str | None = "n0"
        self.sm = sm
        self.hold = False  # appends commit but wait for apply_pending()
        self.gate: asyncio.Event | None = None  # appends and submits wait for it before reaching the log
        self.proposals: list[tuple[str, int]] = []  # ("append" | "submit", entries) per call, as they arrive
        self.unapplied: list[CommittedEntry] = []
        self.listeners: list = []
        self.calls_waiting = 0  # clients' calls held in ``serving``
        self.applied_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def is_leader(self) -> bool:
        return self.leader_id == self.id

    def address_of(self, node_id: str) -> str | None:
        return self.config.peers.get(node_id)

    def metadata(self) -> SimpleNamespace:
        lead = self.leader_id
        return SimpleNamespace(
            node_id=self.id,
            leader_id=lead,
            leader_address=self.address_of(lead) if lead else None,
            term=self.term,
            applied_index=self.sm.applied_index,
        )

    def add_role_listener(self, listener) -> None:
        self.listeners.append(listener)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self.calls_waiting += 1
        try:
            yield
        finally:
            self.calls_waiting -= 1

    def _place(self, bodies: list[bytes], prepare) -> list[CommittedEntry]:
        if not self.is_leader():
            if self.leader_id:
                raise NotLeaderError(self.leader_id)
            raise UnavailableError("no leader")
        log, placed = self.log_store, []
        for body in bodies:
            tail = log.tail()
            index = tail.last_index + 1
            pos = codec.place(tail.end_pos, HEADER_SIZE + len(body), log.segment_size)
            if prepare is not None:
                body = prepare(index, pos, bytes(body))
            log.append(codec.encode(index, self.term, pos, body, tail.chain_crc))
            placed.append(CommittedEntry(index, self.term, pos, body))
        self.unapplied.extend(placed)
        return placed

    def apply_pending(self) -> dict[int, object]:
        entries, self.unapplied = self.unapplied, []
        results = (
            {e.index: r for e, r in zip(entries, self.sm.apply(entries), strict=True)} if entries else {}
        )
        waiting, self.applied_waiters = self.applied_waiters, []
        for index, fut in waiting:
            if index > self.sm.applied_index:
                self.applied_waiters.append((index, fut))
            elif not fut.done():
                fut.set_result(None)
        return results

    async def wait_applied(self, index: int) -> None:
        if self.sm.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.applied_waiters.append((index, fut))
        await fut

    async def append(self, bodies, prepare=None) -> AppendedRun:
        self.proposals.append(("append", len(bodies)))
        if self.gate is not None:
            await self.gate.wait()
        placed = self._place(bodies, prepare)
        if not self.hold:
            self.apply_pending()
        return AppendedRun(placed[0].index, self.term, tuple(e.pos for e in placed))

    async def submit(self, bodies, prepare=None) -> list:
        self.proposals.append(("submit", len(bodies)))
        if self.gate is not None:
            await self.gate.wait()
        placed = self._place(bodies, prepare)
        results = self.apply_pending()
        return [
            r if isinstance(r, Exception) else Applied(e.index, e.term, e.pos, r)
            for e in placed
            for r in (results[e.index],)
        ]


def run(test):
    """Run an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def sync(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return sync


def _entries(log: MemoryLogStore):
    def read(lo: int, hi: int):
        hi = min(hi, log.last_index)
        if lo > hi:
            return []
        return [(e.index, e.body) for e in log.entries(lo, hi + 1) if e.magic == MAGIC_NORMAL]

    return read


@pytest.fixture
def made(tmp_path):
    """(broker, node): a leader at term 1 whose read barrier has passed."""
    holder: list[Broker] = []
    sm = BrokerStateMachine(tmp_path / "cq", on_dispatch=lambda t, q, n: holder[0].dispatched(t, q, n))
    node = FakeNode(sm)
    handle: NodeHandle = node  # the double satisfies the Protocol plugins are typed with
    alloc = QueueOffsetAllocator(sm, _entries(node.log_store), lambda: sm.applied_index)
    broker = Broker(handle, sm, alloc, BrokerSettings(auto_create_topic_queues=node.auto_create))
    holder.append(broker)
    broker.role_changed(Role.LEADER, node.term)
    yield broker, node
    sm.close()


def out(queue_id: int = 0, body: bytes = b"x", **kw) -> OutgoingMessage:
    return OutgoingMessage(queue_id=queue_id, body=body, **kw)


async def topic(broker: Broker, name: str = "T", queues: int = 2) -> None:
    created = await broker.create_topic(name, queues)
    assert (created.topic, created.queues) == (name, queues)


# -- send ------------------------------------------------------------------------------------------------------
@run
async def test_send_stamps_properties_and_pull_reads_them_back(made):
    broker, _ = made
    await topic(broker)
    sent = await broker.send(
        "T",
        [
            out(0, b"a", tags="TagA", keys=["k1", "k2"], properties={"u": "1"}, born_timestamp=7),
            out(0, b"b", msg_id="MID"),
            out(1, b"c"),
        ],
    )
    assert [(r.queue_id, r.queue_offset, r.duplicate) for r in sent] == [
        (0, 0, False),
        (0, 1, False),
        (1, 0, False),
    ]
    assert sent[1].msg_id == "MID" and len(sent[0].msg_id) == 32  # generated when the sender gave none
    assert sent[0].commitlog_offset < sent[1].commitlog_offset < sent[2].commitlog_offset
    pulled = await broker.pull("T", 0, 0, 10)
    assert (pulled.next_offset, pulled.max_offset) == (2, 2)
    a, b = pulled.messages
    assert (a.body, a.tags, a.keys, a.msg_id, a.born_timestamp) == (
        b"a",
        "TagA",
        ["k1", "k2"],
        sent[0].msg_id,
        7,
    )
    assert a.properties["u"] == "1" and a.physical_offset == sent[0].commitlog_offset
    assert (b.body, b.msg_id, b.queue_offset) == (b"b", "MID", 1)
    # born defaults to when the leader took the message, stored a moment later (the same millisecond, or not)
    assert 0 < b.born_timestamp <= b.store_timestamp < b.born_timestamp + 60_000
    part = await broker.pull("T", 0, 1, 1)
    assert [m.body for m in part.messages] == [b"b"] and part.next_offset == 2


@pytest.mark.parametrize(
    ("topic_name", "msgs", "error"),
    [
        ("bad topic!", [out()], InvalidTopicError),
        ("Nope", [out()], UnknownTopicError),
        ("T", [out(2)], UnknownQueueError),
        ("T", [], InvalidRequestError),
        ("T", [out()] * 1025, InvalidRequestError),
        ("T", [out(0, b"z" * 5000)], InvalidRequestError),
        ("T", [out(0, b"ok"), out(0, b"x", properties={"a\x01": "b"})], InvalidRequestError),
        ("T", [out(0, b"x", properties={message.PROPERTY_ORIGIN: "timer/0"})], InvalidRequestError),
        ("%SYS%TIMER", [out()], InvalidTopicError),
    ],
)
@run
async def test_send_refuses_bad_input_before_writing(made, topic_name, msgs, error):
    broker, node = made
    node.config.max_body_bytes = 4096
    await topic(broker)
    before = node.log_store.last_index
    with pytest.raises(error):
        await broker.send(topic_name, msgs)
    assert node.log_store.last_index == before
    assert broker.sm.next_offset("T", 0) == 0


@run
async def test_send_auto_creates_an_unknown_topic(made):
    broker, _ = made
    broker.topics.auto_create_queues = 3  # as [broker] auto_create_topic_queues = 3
    (r,) = await broker.send("Auto", [out(2)])
    assert broker.sm.topics["Auto"] == 3 and (r.queue_id, r.queue_offset) == (2, 0)


@run
async def test_a_retried_send_is_stored_once(made):
    broker, _ = made
    await topic(broker)
    first = await broker.send("T", [out(0, b"a", msg_id="M1", producer_id="p", sequence=1)])
    again = await broker.send(
        "T",
        [out(0, b"a", msg_id="M1", producer_id="p", sequence=1), out(0, b"b", producer_id="p", sequence=2)],
    )
    assert again[0].duplicate and not again[1].duplicate
    assert (again[0].queue_offset, again[0].commitlog_offset) == (
        first[0].queue_offset,
        first[0].commitlog_offset,
    )
    assert again[1].queue_offset == 1
    assert broker.sm.next_offset("T", 0) == 2 and broker.sm.duplicates == 0


@run
async def test_a_retry_waits_for_the_first_attempt_to_be_applied(made):
    broker, node = made
    await topic(broker)
    node.hold = True
    first = await broker.send("T", [out(0, b"a", producer_id="p", sequence=5)])
    assert broker.sm.next_offset("T", 0) == 0  # committed, not applied yet
    retry = asyncio.create_task(broker.send("T", [out(0, b"a", producer_id="p", sequence=5)]))
    await asyncio.sleep(0.02)
    assert not retry.done()
    node.apply_pending()
    (r,) = await asyncio.wait_for(retry, 2)
    assert r.duplicate and r.queue_offset == first[0].queue_offset == 0
    assert broker.sm.next_offset("T", 0) == 1


@run
async def test_concurrent_sends_of_one_sequence_share_the_first(made):
    broker, node = made
    await topic(broker)
    node.gate = asyncio.Event()
    a = asyncio.create_task(broker.send("T", [out(0, b"a", producer_id="p", sequence=1)]))
    await asyncio.sleep(0)
    b = asyncio.create_task(broker.send("T", [out(0, b"a", producer_id="p", sequence=1)]))
    await asyncio.sleep(0.01)
    node.gate.set()
    (ra,), (rb,) = await asyncio.gather(a, b)
    assert not ra.duplicate and rb.duplicate and ra.queue_offset == rb.queue_offset
    assert broker.sm.next_offset("T", 0) == 1


@run
async def test_a_failed_append_fails_waiting_retries_too(made):
    broker, node = made
    await topic(broker)
    node.gate = asyncio.Event()
    a = asyncio.create_task(broker.send("T", [out(0, producer_id="p", sequence=1)]))
    await asyncio.sleep(0)
    b = asyncio.create_task(broker.send("T", [out(0, producer_id="p", sequence=1)]))
    await asyncio.sleep(0.01)
    node.leader_id = "n1"  # leadership moved while the append waited
    node.gate.set()
    for t in (a, b):
        with pytest.raises(NotLeaderError):
            await t
    node.leader_id = "n0"
    (r,) = await broker.send("T", [out(0, producer_id="p", sequence=1)])
    assert not r.duplicate and r.queue_offset == 0  # nothing of the failed attempt is remembered


# -- pull ------------------------------------------------------------------------------------------------------
@run
async def test_pull_long_polls_until_a_message_is_dispatched(made):
    broker, _ = made
    await topic(broker)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    empty = await broker.pull("T", 0, 0, 8, max_wait_ms=50)
    assert empty.messages == [] and loop.time() - t0 >= 0.04
    waiting = asyncio.create_task(broker.pull("T", 0, 0, 8, max_wait_ms=5000))
    await asyncio.sleep(0.01)
    await broker.send("T", [out(0, b"late")])
    pulled = await asyncio.wait_for(waiting, 1)
    assert [m.body for m in pulled.messages] == [b"late"] and pulled.next_offset == 1


@run
async def test_a_long_poll_on_several_queues_wakes_for_any_of_them_and_leaves_nothing_behind(made):
    """A receive long-polls every queue of its topic at once (``QueueReader.wait_dispatch``): one dispatch to any
    of them ends the wait, and neither a wake nor a timeout leaves the poll registered on the other queues."""
    broker, _ = made
    await topic(broker)
    reader = broker.reader
    loop = asyncio.get_running_loop()
    waiting = asyncio.create_task(reader.wait_dispatch("T", [0, 1], loop.time() + 5))
    await asyncio.sleep(0.01)
    assert not waiting.done() and sorted(reader._waiters) == [("T", 0), ("T", 1)]
    await broker.send("T", [out(1, b"x")])
    await asyncio.wait_for(waiting, 1)
    assert reader._waiters == {}, "woken by queue 1: the poll left queue 0 too"
    t0 = loop.time()
    await reader.wait_dispatch("T", [0, 1], loop.time() + 0.05)
    assert loop.time() - t0 >= 0.04 and reader._waiters == {}, "a timed-out poll leaves nothing behind"
    cancelled = asyncio.create_task(reader.wait_dispatch("T", [0, 1], loop.time() + 5))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert reader._waiters == {}, "a cancelled poll leaves nothing behind"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("T", 5, 0), UnknownQueueError),
        (("T", 0, -1), InvalidRequestError),
        (("T", 0, 1), InvalidRequestError),  # beyond the end, on the leader
        (("T", 0, 0, 0), InvalidRequestError),
        (("T", 0, 0, 1025), InvalidRequestError),
        (("T", 0, 0, 1, 30_001), InvalidRequestError),
    ],
)
@run
async def test_pull_refuses_bad_input(made, args, error):
    broker, _ = made
    await topic(broker)
    with pytest.raises(error):
        await broker.pull(*args)


@run
async def test_pull_selected_passes_over_filtered_messages(made):
    broker, _ = made
    await topic(broker)
    await broker.send("T", [out(0, b"a", tags="A"), out(0, b"b", tags="B"), out(0, b"c", tags="A")])
    loop = asyncio.get_running_loop()
    found, nxt = await broker.pull_selected("T", 0, 0, 8, lambda m: m.tags == "A", 0, loop.time() + 1)
    assert [m.body for m in found] == [b"a", b"c"] and nxt == 3
    with pytest.raises(OffsetRangeError):
        await broker.pull_selected("T", 0, 4, 8, lambda m: True, 0, loop.time() + 1)
    assert broker.first_stored_at("T", 0, 0) == 0
    assert broker.first_stored_at("T", 0, found[-1].store_timestamp + 1) == 3


# -- offsets ---------------------------------------------------------------------------------------------------
@run
async def test_commit_and_query_offsets(made):
    broker, _ = made
    await topic(broker)
    await broker.send("T", [out(0), out(0)])
    with pytest.raises(UnknownGroupError):
        await broker.committed_offset("G", "T", 0)
    await broker.commit_offset("G", "T", 0, 2)
    assert await broker.committed_offset("G", "T", 0) == 2
    assert await broker.committed_offset("G", "T", 1) is None
    with pytest.raises(OffsetRangeError):
        await broker.commit_offset("G", "T", 0, 3)
    with pytest.raises(InvalidGroupError):
        await broker.commit_offset("bad group", "T", 0, 0)
    with pytest.raises(UnknownQueueError):
        await broker.commit_offset("G", "T", 9, 0)
    assert await broker.list_topics() == [("T", 2, [2, 0])]


# -- pop, ack, invisibility ------------------------------------------------------------------------------------
async def receive(broker: Broker, first: int = 0, batch: int = 2, invisible_ms: int = 60_000, select=None):
    deadline = asyncio.get_running_loop().time() + 1
    return await broker.pops.receive(
        "G", "T", first, select or (lambda m: True), batch, invisible_ms, 0, deadline
    )


@run
async def test_pop_ack_and_change_invisible(made):
    broker, _ = made
    await topic(broker)
    await broker.send("T", [out(1, b"a"), out(1, b"b"), out(1, b"c")])
    got = await receive(broker, first=0)  # queue 0 is empty: the receive moves on to queue 1
    assert got is not None
    qid, popped, msgs = got
    assert qid == 1 and [d.offset for d in popped.deliveries] == [0, 1]
    assert [msgs[d.offset].body for d in popped.deliveries] == [b"a", b"b"]
    qid, third, msgs = await receive(broker, first=1)
    assert [d.offset for d in third.deliveries] == [2] and msgs[2].body == b"c"
    assert await receive(broker) is None  # everything is in flight

    done = await broker.pops.ack("G", "T", [(1, d.offset, d.epoch) for d in popped.deliveries])
    assert [h.outcome for h in done] == [Outcome.DONE, Outcome.DONE]
    assert broker.sm.committed_offset("G", "T", 1) == 2  # the committed offset follows the acks
    (again,) = await broker.pops.ack("G", "T", [(1, 0, popped.deliveries[0].epoch)])
    assert again.outcome is Outcome.ALREADY

    d = third.deliveries[0]
    changed = await broker.pops.change_invisible("G", "T", 1, 2, d.epoch, 0)
    assert changed.outcome is Outcome.DONE
    _, redelivered, _ = await receive(broker, first=1)
    (r,) = redelivered.deliveries
    assert r.offset == 2 and r.attempt == 2 and r.epoch != d.epoch
    (stale,) = await broker.pops.ack("G", "T", [(1, 2, d.epoch)])
    assert stale.outcome is Outcome.REDELIVERED


@run
async def test_pop_skips_what_the_filter_does_not_select(made):
    broker, _ = made
    await topic(broker)
    await broker.send("T", [out(0, b"a", tags="A"), out(0, b"b", tags="B")])
    _, popped, msgs = await receive(broker, select=lambda m: m.tags == "B")
    assert [msgs[d.offset].body for d in popped.deliveries] == [b"b"]
    assert await receive(broker, select=lambda m: m.tags == "B") is None


# -- leadership ------------------------------------------------------------------------------------------------
@run
async def test_a_follower_refuses_writes_and_names_the_leader(made):
    broker, node = made
    await topic(broker)
    await broker.send("T", [out(0, b"a")])
    node.leader_id = "n1"
    with pytest.raises(NotLeaderError) as ei:
        await broker.send("T", [out(0)])
    assert ei.value.leader_hint == "n1" and "127.0.0.1:2" in str(ei.value)
    for call in (
        broker.pull("T", 0, 0),
        broker.commit_offset("G", "T", 0, 0),
        broker.create_topic("U", 1),
        broker.list_topics(),
        receive(broker),
    ):
        with pytest.raises(NotLeaderError):
            await call
    pulled = await broker.pull("T", 0, 0, allow_follower=True)  # a follower may serve reads when allowed
    assert [m.body for m in pulled.messages] == [b"a"]
    lagging = await broker.pull("T", 0, 5, allow_follower=True)
    assert lagging.messages == [] and (lagging.next_offset, lagging.max_offset) == (5, 1)
    node.leader_id = None
    with pytest.raises(UnavailableError):
        await broker.send("T", [out(0)])
    assert broker.route().leader_id is None


@run
async def test_a_new_leader_waits_for_its_log_to_be_applied(made):
    broker, node = made
    await topic(broker)
    node.hold = True
    await broker.send("T", [out(0)])  # committed by the old term, not applied
    node.term = 2
    broker.role_changed(Role.LEADER, 2)
    with pytest.raises(UnavailableError, match="has not applied"):
        await broker.leader_state(timeout_s=0.02)
    node.apply_pending()
    assert await broker.leader_state() == 2
    route = broker.route()
    assert route.term == 2 and route.max_commitlog_offset == node.log_store.tail().end_pos
    assert message.decode(node.log_store.entry(node.log_store.last_index).body).queue_offset == 0


# -- delivery: delayed messages, dead letters (the leader's side, broker_delivery) --------------------------
@run
async def test_a_delayed_message_waits_in_the_timer_topic_and_its_copy_ends_the_entry(made):
    from broker_adapter.core import delivery as broker_delivery
    from broker_adapter.core.topics import TIMER_TOPIC

    broker, _ = made
    await topic(broker)
    due = broker_delivery.now_ms() + 300
    (r,) = await broker.delivery.send_timed("T", [out(1, b"later", msg_id="D1")], [due])
    assert r.topic == TIMER_TOPIC and broker.sm.next_offset("T", 1) == 0
    assert list(broker.sm.timer.entries) == [r.queue_offset]
    with pytest.raises(InvalidRequestError):
        await broker.pull(TIMER_TOPIC, 0, 0)  # clients never read the timer topic
    await broker.delivery.tick()  # not due yet: nothing moves
    assert broker.sm.next_offset("T", 1) == 0
    while broker.sm.timer.entries:
        await asyncio.sleep(0.05)
        await broker.delivery.tick()
    (m,) = (await broker.pull("T", 1, 0)).messages
    assert (m.body, m.msg_id) == (b"later", "D1") and broker_delivery.now_ms() >= due
    assert m.properties[message.PROPERTY_TIMER_DELIVER_MS] == str(due)
    await broker.delivery.tick()  # the entry is gone: never copied twice
    assert broker.sm.next_offset("T", 1) == 1 and broker.sm.repeats == 0
    with pytest.raises(broker_delivery.IllegalDeliveryTimeError):
        await broker.delivery.send_timed("T", [out(0)], [broker_delivery.now_ms() + 2 * 86_400_000])


@run
async def test_a_message_past_its_attempts_goes_to_the_dead_letter_topic_once(made):
    broker, _ = made
    await topic(broker, queues=1)
    await broker.set_group_settings("G", {"max_attempts": 2})
    await broker.send("T", [out(0, b"poison", msg_id="P")])
    for attempt in (1, 2):
        got = await broker.pops.receive(
            "G", "T", 0, lambda t: True, 8, 1000, 3000, asyncio.get_running_loop().time() + 5
        )
        assert got is not None and [d.attempt for d in got[1].deliveries] == [attempt]
        for q in broker.sm.pops.queues.values():  # let the invisible time run out (the leader's clock)
            for f in q.inflight.values():
                f.deadline_ms = 0
    assert await broker.pops.revive(broker_delivery_now()) == 1
    dead = (await broker.pull("%DLQ%G", 0, 0)).messages
    assert [(m.body, m.properties["RETRY_TOPIC"], m.properties["RECONSUME_TIME"]) for m in dead] == [
        (b"poison", "T", "2")
    ]
    assert broker.sm.committed_offset("G", "T", 0) == 1
    assert await broker.pops.revive(broker_delivery_now()) == 0
    assert broker.sm.repeats == 0


def broker_delivery_now() -> int:
    from broker_adapter.core.clock import now_ms

    return now_ms()


class _Refused(Exception):
    pass


class _Context:
    """The part of a grpc.aio ServicerContext the Broker servicer uses when it refuses a call."""

    def __init__(self):
        self.code = None
        self.details = ""

    def set_trailing_metadata(self, md) -> None:
        pass

    async def abort(self, code, details):
        self.code, self.details = code, details
        raise _Refused(details)


@run
async def test_a_send_refused_for_one_delayed_message_writes_none_of_the_others(made):
    # Found by the gRPC fuzzing: the due messages of a request were stored before its delayed one was refused
    # (too far ahead), so the caller was told "refused" while the log had grown.
    import grpc

    from broker_adapter.core.clock import now_ms
    from broker_adapter.service import BrokerServicer
    from broker_adapter.v1 import broker_pb2

    broker, node = made
    await topic(broker)
    before = node.log_store.last_index
    too_far = now_ms() + broker.delivery.max_delay_ms + 60_000
    request = broker_pb2.SendRequest(
        topic="T",
        messages=[
            broker_pb2.OutgoingMessage(queue_id=0, body=b"now"),
            broker_pb2.OutgoingMessage(queue_id=1, body=b"now too"),
            broker_pb2.OutgoingMessage(queue_id=0, body=b"later", delivery_timestamp=too_far),
        ],
    )
    ctx = _Context()
    with pytest.raises(_Refused):
        await BrokerServicer(broker).Send(request, ctx)
    assert ctx.code == grpc.StatusCode.INVALID_ARGUMENT and "max_delay_ms" in ctx.details
    assert node.log_store.last_index == before  # nothing of the request was written
    bad_queue = broker_pb2.SendRequest(
        topic="T",
        messages=[
            broker_pb2.OutgoingMessage(queue_id=0, body=b"now"),
            broker_pb2.OutgoingMessage(queue_id=7, body=b"later", delivery_timestamp=now_ms() + 60_000),
        ],
    )
    with pytest.raises(_Refused):
        await BrokerServicer(broker).Send(bad_queue, _Context())
    assert node.log_store.last_index == before
    ok = await BrokerServicer(broker).Send(
        broker_pb2.SendRequest(
            topic="T",
            messages=[
                broker_pb2.OutgoingMessage(queue_id=0, body=b"now"),
                broker_pb2.OutgoingMessage(queue_id=1, body=b"later", delivery_timestamp=now_ms() + 60_000),
            ],
        ),
        _Context(),
    )
    assert len(ok.results) == 2 and node.log_store.last_index == before + 2


@run
async def test_a_negative_queue_offset_is_refused_as_out_of_range(made):
    """The fuzzer's find: Later with queue_offset -1 answered UNKNOWN (an IndexError from the ConsumeQueue)."""
    broker, _ = made
    await topic(broker)
    await broker.send("T", [out(0)])
    with pytest.raises(OffsetRangeError, match="negative"):
        broker.read("T", 0, -1)
    with pytest.raises(OffsetRangeError, match="negative"):
        await broker.delivery.later("g", "T", 0, -1)
