"""ReadIndex (thesis §6.4, ``dledger/core/read_index.py``): a read point is released only once a quorum confirmed
the leader still leads, by answering a heartbeat round that carries the request's sequence number."""

from __future__ import annotations

import pytest

from dledger.core.messages import AppendEntriesResponse, Heartbeat, HeartbeatResponse, Role
from dledger.errors import NotLeaderError
from tests.core.test_raft import drain, elect, make


def _read_states(core) -> list[tuple[int, int]]:
    out = []
    while core.has_ready():
        rd = core.ready()
        out.extend(rd.read_states)
        core.advance(rd)
    return out


def _leader_with_noop_committed():
    core = make()
    elect(core)
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=0))
    assert core.commit_index == 0
    drain(core)
    return core


def test_read_index_on_a_follower_names_the_leader() -> None:
    core = make("n2")
    core.step(Heartbeat(1, "n1", "n2", -1))
    with pytest.raises(NotLeaderError) as e:
        core.read_index(7)
    assert e.value.leader_hint == "n1"


def test_a_single_node_serves_the_read_at_once() -> None:
    core = make(voters=["n1"])
    while core.role is not Role.LEADER:
        core.tick()
    drain(core)
    core.read_index(5)
    assert _read_states(core) == [(5, core.commit_index)]


def test_the_read_waits_for_a_quorum_to_answer_the_heartbeat_round() -> None:
    core = _leader_with_noop_committed()
    core.read_index(42)
    beats = [m for m in drain(core) if isinstance(m, Heartbeat)]
    assert {m.dst for m in beats} == {"n2", "n3"}
    seq = beats[0].context
    assert seq > 0 and all(m.context == seq for m in beats)
    core.step(HeartbeatResponse(core.term, "n2", "n1", context=0))
    assert _read_states(core) == [], "an answer to a plain heartbeat confirms nothing"
    core.step(HeartbeatResponse(core.term, "n2", "n1", context=seq))
    assert _read_states(core) == [(42, 0)], "the leader and n2 are a quorum of three"
    core.step(HeartbeatResponse(core.term, "n3", "n1", context=seq))
    assert _read_states(core) == [], "a read is released once"


def test_an_answer_confirms_every_earlier_request_in_order() -> None:
    core = _leader_with_noop_committed()
    core.read_index(1)
    core.read_index(2)
    seqs = sorted({m.context for m in drain(core) if isinstance(m, Heartbeat)})
    assert len(seqs) == 2
    core.step(HeartbeatResponse(core.term, "n3", "n1", context=seqs[1]))
    assert _read_states(core) == [(1, 0), (2, 0)]


def test_a_read_before_the_first_commit_of_the_term_waits_for_it() -> None:
    core = make()
    elect(core)
    core.read_index(9)
    assert not any(isinstance(m, Heartbeat) and m.context for m in drain(core)), (
        "the commit index may be stale"
    )
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=0))  # the no-op commits
    beats = [m for m in drain(core) if isinstance(m, Heartbeat) and m.context]
    assert {m.dst for m in beats} == {"n2", "n3"}
    core.step(HeartbeatResponse(core.term, "n2", "n1", context=beats[0].context))
    assert _read_states(core) == [(9, 0)]


def test_reads_pending_when_leadership_is_lost_never_complete() -> None:
    core = _leader_with_noop_committed()
    core.read_index(3)
    seq = next(m.context for m in drain(core) if isinstance(m, Heartbeat))
    core.step(Heartbeat(core.term + 1, "n2", "n1", 0))  # a newer leader
    assert core.role is Role.FOLLOWER
    drain(core)
    core.step(HeartbeatResponse(core.term, "n3", "n1", context=seq))
    assert _read_states(core) == []
