"""``RaftCore.take_heartbeat_answers`` (docs/raft.md, "Heartbeats during a write"): a node answers heartbeats
while its own write is still in progress, so a disk that stalls every follower at once is not an election, and
nothing is acknowledged before it is durable.

The unit tests pin what may leave early (a heartbeat's answer, only with the term and vote durable); the
scenarios stall both followers' disks in the simulated cluster (tests/sim/cluster.py, ``hold``) with the
thesis' one-period check-quorum, and the random schedules of tests/property/test_raft_safety.py include such
stalls (its ``stall``, ``hold`` and ``release`` rules) with every invariant checked at each step."""

from __future__ import annotations

import pytest

from dledger.core.config import RaftConfig
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    Role,
)
from dledger.core.raft import RaftCore
from tests.core.test_raft import make
from tests.sim.cluster import Cluster


def _follower() -> RaftCore:
    core = make("n2")
    core.step(Heartbeat(1, "n1", "n2", -1))
    rd = core.ready()  # term 1 and its leader: written, then answered
    core.advance(rd)
    return core


def test_a_heartbeat_is_answered_while_the_write_before_it_is_in_progress() -> None:
    core = _follower()
    core.step(AppendEntries(1, "n1", "n2", -1, 0, -1, b""))
    writing = core.ready()  # the write the disk is slow with
    core.step(Heartbeat(1, "n1", "n2", -1, context=7))
    assert core.take_heartbeat_answers() == [HeartbeatResponse(1, "n2", "n1", 7, -1)]
    core.advance(writing)
    assert not any(isinstance(m, HeartbeatResponse) for m in core.ready().messages), "answered once"


def test_nothing_leaves_early_while_a_new_term_is_not_yet_durable() -> None:
    core = _follower()
    core.step(Heartbeat(2, "n3", "n2", -1))  # a new leader: term 2 is in the Ready being written
    writing = core.ready()
    assert writing.hard_state is not None and writing.hard_state.term == 2
    core.step(Heartbeat(2, "n3", "n2", -1))
    assert core.take_heartbeat_answers() == []
    core.advance(writing)
    assert core.take_heartbeat_answers() == [HeartbeatResponse(2, "n2", "n3", 0, -1)]


def test_append_answers_always_wait_for_the_write() -> None:
    core = _follower()
    core.step(AppendEntries(1, "n1", "n2", -1, 0, -1, b""))
    writing = core.ready()
    core.step(AppendEntries(1, "n1", "n2", -1, 0, -1, b""))
    core.step(Heartbeat(1, "n1", "n2", -1))
    assert [type(m) for m in core.take_heartbeat_answers()] == [HeartbeatResponse]
    core.advance(writing)
    assert [type(m) for m in core.ready().messages] == [AppendEntriesResponse]


def _group(seed: int) -> tuple[Cluster, str, list[str]]:
    config = RaftConfig(pre_vote=True, check_quorum=True)  # one check-quorum period, the thesis' rule
    c = Cluster(3, seed=seed, config=config)
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    c.propose(leader, [b"before"])
    c.stabilize()
    return c, leader, [n for n in c.ids if n != leader]


def _stall_both(c: Cluster, leader: str, followers: list[str], periods: int) -> tuple[int, int]:
    """Stall both followers' disks for ``periods`` election-minimum periods while an entry is proposed; the
    network delivers everything meanwhile. Returns (the leader's term before, the entry's index)."""
    term = c.nodes[leader].core.term
    for f in followers:
        c.hold(f)
    p = c.propose(leader, [b"during the stall"])
    for _ in range(periods * c.config.election_ticks[0]):
        c.tick()
        c.deliver_all()
    return term, p.first_index


@pytest.mark.parametrize("seed", range(5))
def test_both_followers_stalled_keep_their_leader_and_commit_nothing_early(seed: int) -> None:
    c, leader, followers = _group(seed)
    term, index = _stall_both(c, leader, followers, periods=4)
    core = c.nodes[leader].core
    assert core.role is Role.LEADER and core.term == term, c.dump(30)
    assert all(c.nodes[f].held is not None for f in followers), "the followers' writes are still held"
    assert c.early_answers > 0
    assert core.commit_index < index, "no follower has the entry on disk: it is not committed"
    for f in followers:
        c.release(f)
    c.run_until(lambda: core.commit_index >= index)
    assert core.role is Role.LEADER and core.term == term
    c.check_invariants()


@pytest.mark.parametrize("seed", range(3))
def test_without_the_early_answers_the_same_stall_is_an_election(seed, monkeypatch) -> None:
    """The test above can fail: the answers waiting for their write, the leader hears no one and steps down."""
    monkeypatch.setattr(RaftCore, "take_heartbeat_answers", lambda self: [])
    c, leader, followers = _group(seed)
    term, _ = _stall_both(c, leader, followers, periods=4)
    core = c.nodes[leader].core
    assert core.role is not Role.LEADER or core.term != term
