"""``RaftCore.take_heartbeats`` (docs/raft.md, "Heartbeats during a write"): a leader sends heartbeats and a
follower answers them while its own write is still in progress, so a disk that stalls every node at once is
not an election, and nothing is acknowledged or committed before it is durable.

The unit tests pin what may leave early (heartbeats and their answers, only with the term and vote durable, a
heartbeat's commit index no further than the last Ready done); the scenarios stall disks in the simulated
cluster (tests/sim/cluster.py, ``hold``) with the thesis' one-period check-quorum, and the random schedules of
tests/property/test_raft_safety.py include such stalls (its ``stall``, ``hold`` and ``release`` rules) with
every invariant checked at each step."""

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
from tests.core.test_raft import BASIC, IDS, drain, elect, make
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
    assert core.take_heartbeats() == [HeartbeatResponse(1, "n2", "n1", 7, -1)]
    core.advance(writing)
    assert not any(isinstance(m, HeartbeatResponse) for m in core.ready().messages), "answered once"


def test_nothing_leaves_early_while_a_new_term_is_not_yet_durable() -> None:
    core = _follower()
    core.step(Heartbeat(2, "n3", "n2", -1))  # a new leader: term 2 is in the Ready being written
    writing = core.ready()
    assert writing.hard_state is not None and writing.hard_state.term == 2
    core.step(Heartbeat(2, "n3", "n2", -1))
    assert core.take_heartbeats() == []
    core.advance(writing)
    assert core.take_heartbeats() == [HeartbeatResponse(2, "n2", "n3", 0, -1)]


def test_append_answers_always_wait_for_the_write() -> None:
    core = _follower()
    core.step(AppendEntries(1, "n1", "n2", -1, 0, -1, b""))
    writing = core.ready()
    core.step(AppendEntries(1, "n1", "n2", -1, 0, -1, b""))
    core.step(Heartbeat(1, "n1", "n2", -1))
    assert [type(m) for m in core.take_heartbeats()] == [HeartbeatResponse]
    core.advance(writing)
    assert [type(m) for m in core.ready().messages] == [AppendEntriesResponse]


def test_a_leader_writing_sends_heartbeats_with_no_commit_index_its_write_may_cover() -> None:
    core = make("n1")
    elect(core)
    done = core.commit_index
    p = core.propose([b"x"])
    writing = core.ready()  # the leader's own write of the entry, in progress
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=p.first_index))
    assert core.commit_index == p.first_index, "a follower's copy and the leader's count commit it"
    for _ in range(BASIC.heartbeat_ticks):
        core.tick()
    beats = core.take_heartbeats()
    assert {m.dst for m in beats} == set(IDS[1:]) and all(type(m) is Heartbeat for m in beats)
    assert all(m.commit <= done for m in beats), "no commit index the write in progress may cover"
    core.advance(writing)
    drain(core)


def _group(seed: int) -> tuple[Cluster, str, list[str]]:
    config = RaftConfig(pre_vote=True, check_quorum=True)  # one check-quorum period, the thesis' rule
    c = Cluster(3, seed=seed, config=config)
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    c.propose(leader, [b"before"])
    c.stabilize()
    return c, leader, [n for n in c.ids if n != leader]


def _stall_both(
    c: Cluster, leader: str, followers: list[str], periods: int, also_leader: bool = False
) -> tuple[int, int]:
    """Stall both followers' disks (``also_leader``: the leader's too) for ``periods`` election-minimum periods
    while an entry is proposed; the network delivers everything meanwhile. Returns (the leader's term before,
    the entry's index)."""
    term = c.nodes[leader].core.term
    for f in followers:
        c.hold(f)
    p = c.propose(leader, [b"during the stall"])
    if also_leader:
        c.hold(leader)
    for _ in range(periods * c.config.election_ticks[0]):
        c.tick()
        c.deliver_all()
    return term, p.first_index


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("also_leader", [False, True], ids=["followers", "every-node"])
def test_stalled_disks_keep_their_leader_and_commit_nothing_early(seed: int, also_leader: bool) -> None:
    c, leader, followers = _group(seed)
    term, index = _stall_both(c, leader, followers, periods=4, also_leader=also_leader)
    core = c.nodes[leader].core
    assert core.role is Role.LEADER and core.term == term, c.dump(30)
    assert all(c.nodes[f].held is not None for f in followers), "the followers' writes are still held"
    assert c.early_heartbeats > 0
    assert core.commit_index < index, "no follower has the entry on disk: it is not committed"
    for n in c.ids:
        c.release(n)
    c.run_until(lambda: core.commit_index >= index)
    assert core.role is Role.LEADER and core.term == term
    c.check_invariants()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("also_leader", [False, True], ids=["followers", "every-node"])
def test_without_the_early_heartbeats_the_same_stall_is_an_election(seed, also_leader, monkeypatch) -> None:
    """The test above can fail: heartbeats waiting for their write, the leader hears no one and steps down."""
    monkeypatch.setattr(RaftCore, "take_heartbeats", lambda self: [])
    c, leader, followers = _group(seed)
    term, _ = _stall_both(c, leader, followers, periods=4, also_leader=also_leader)
    core = c.nodes[leader].core
    assert core.role is not Role.LEADER or core.term != term
