"""The allocator on its own: dense offsets within a term, rebuilt from the log tail at a leadership change or
after a proposal that never reached the log, and the idempotent-producer lookups over tail and applied state."""

from __future__ import annotations

from broker_adapter.core import commands, message
from broker_adapter.core.allocator import QueueOffsetAllocator
from broker_adapter.core.statemachine import BrokerStateMachine, Dispatched
from statemachine.api import CommittedEntry


def msg(topic: str, qid: int, producer: str | None = None, seq: int | None = None) -> bytes:
    props = {}
    if producer is not None:
        props = {message.PROPERTY_PRODUCER_ID: producer, message.PROPERTY_SEQUENCE: str(seq)}
    return message.encode(message.Message(topic=topic, body=b"x", queue_id=qid, properties=props))


class FakeLog:
    """Entries as the leader placed them: (index, pos, body); ``apply`` hands a prefix to the dispatcher."""

    def __init__(self, sm: BrokerStateMachine):
        self.entries: list[tuple[int, int, bytes]] = []
        self.sm = sm
        self.applied = -1
        self.alloc = QueueOffsetAllocator(sm, self.read, lambda: sm.applied_index)

    def read(self, lo, hi):
        return [(i, b) for i, _, b in self.entries if lo <= i <= hi]

    def pos(self, index):
        return index * 1000

    def append(self, term, bodies, noop_first=False):
        index = len(self.entries)
        if noop_first:  # a new leader's no-op: in the log, never prepared, never applied
            self.entries.append((index, self.pos(index), b""))
            index += 1
        out = []
        for b in bodies:
            b = self.alloc.prepare_entry(term, index, self.pos(index), b)[0]
            self.entries.append((index, self.pos(index), b))
            out.append(b)
            index += 1
        return out

    def apply(self, upto):
        todo = [CommittedEntry(i, 1, p, b) for i, p, b in self.entries if self.applied < i <= upto and b]
        self.applied = upto
        return self.sm.apply(todo)


def offsets(bodies):
    return [(message.peek_route(b).queue_id, message.peek_route(b).queue_offset) for b in bodies]


def test_dense_within_a_term_and_physical_offset(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = FakeLog(sm)
    log.append(1, [commands.encode(commands.CreateTopic("t", 2))], noop_first=True)
    out = log.append(1, [msg("t", 0), msg("t", 1), msg("t", 0)])
    assert offsets(out) == [(0, 0), (1, 0), (0, 1)]
    assert message.peek_route(out[0]).physical_offset == log.pos(2) + 48
    log.apply(len(log.entries) - 1)
    assert [sm.next_offset("t", q) for q in (0, 1)] == [2, 1]
    assert log.alloc.rebuilds == 1  # only the first prepare of the term


def test_new_leader_continues_after_the_unapplied_tail(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = FakeLog(sm)
    log.append(1, [commands.encode(commands.CreateTopic("t", 1))], noop_first=True)
    log.append(1, [msg("t", 0), msg("t", 0)])
    log.apply(2)  # the first message applied; the second is still in the tail
    assert sm.next_offset("t", 0) == 1
    out = log.append(2, [msg("t", 0)], noop_first=True)  # leadership changed: a no-op, then a new message
    assert offsets(out) == [(0, 2)]
    results = log.apply(len(log.entries) - 1)
    assert [r.queue_offset for r in results if isinstance(r, Dispatched)] == [1, 2]


def test_a_proposal_that_never_reached_the_log_is_forgotten(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = FakeLog(sm)
    log.append(1, [commands.encode(commands.CreateTopic("t", 1)), msg("t", 0)], noop_first=True)
    index = len(log.entries)
    log.alloc.prepare_entry(1, index, log.pos(index), msg("t", 0))  # prepared, then the proposal failed
    out = log.append(1, [msg("t", 0)])  # the same index is prepared again
    assert offsets(out) == [(0, 1)]


def test_producer_lookups_cover_tail_and_applied(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = FakeLog(sm)
    log.append(1, [commands.encode(commands.CreateTopic("t", 1))], noop_first=True)
    log.append(1, [msg("t", 0, "p", 0), msg("t", 0, "p", 1)])
    assert log.alloc.find_send("p", 1) == 3  # in the tail: wait for entry 3
    assert log.alloc.find_send("p", 2) is False
    log.apply(len(log.entries) - 1)
    d = log.alloc.find_send("p", 1)
    assert isinstance(d, Dispatched) and d.queue_offset == 1
    # a new leader sees the same thing from the log alone
    other = BrokerStateMachine(tmp_path / "cq2")
    other.apply([CommittedEntry(i, 1, p, b) for i, p, b in log.entries if b])
    assert other.sent("p", 0) == sm.sent("p", 0) and other.sent("p", 5) is False


def test_applied_sends_are_forgotten_by_the_leader_and_still_found(tmp_path, monkeypatch):
    from broker_adapter.core import allocator

    monkeypatch.setattr(allocator, "PENDING_SLACK", 8)
    sm = BrokerStateMachine(tmp_path / "cq")
    log = FakeLog(sm)
    log.append(1, [commands.encode(commands.CreateTopic("t", 1))], noop_first=True)
    for seq in range(200):
        log.append(1, [msg("t", 0, "p", seq)])
        log.apply(len(log.entries) - 2)  # the newest send stays in the unapplied tail
    assert len(log.alloc._pending) <= 2 * 8 + 1  # not one entry per message ever placed
    assert log.alloc.find_send("p", 199) == len(log.entries) - 1  # in the tail: its index
    assert isinstance(log.alloc.find_send("p", 150), Dispatched)  # applied: from the dispatcher's table


def test_the_leader_dispatches_the_route_it_placed_as_a_follower_reads_it(tmp_path):
    leader = BrokerStateMachine(tmp_path / "leader")
    log = FakeLog(leader)
    log.append(1, [commands.encode(commands.CreateTopic("t", 2))])
    log.append(1, [msg("t", i % 2, "p", i) for i in range(6)])
    assert sorted(leader.placed) == list(range(1, 7)), "a route per placed message, by index"
    stale_topic = message.Route("elsewhere", 0, 0, 0, 1, None)
    leader.placed[6] = (99, stale_topic)  # of another term: not this entry, never trusted
    on_leader = log.apply(len(log.entries) - 1)
    assert not leader.placed, "each route is used once, and none is kept"
    follower = BrokerStateMachine(tmp_path / "follower")
    on_follower = follower.apply([CommittedEntry(i, 1, p, b) for i, p, b in log.entries])
    assert on_leader == on_follower and on_leader[-1] == Dispatched(
        "t", 1, 2, 6000 + 48, len(log.entries[6][2])
    )
    assert leader.next_offsets == follower.next_offsets == {("t", 0): 3, ("t", 1): 3}
