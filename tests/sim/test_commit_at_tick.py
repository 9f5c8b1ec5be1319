"""``RaftConfig.commit_at_tick`` (what the node runtime runs with, docs/send-budget.md): followers learn a new
commit index from the next AppendEntries or within two of the leader's ticks, not from an empty AppendEntries
per commit, and none is sent for a commit alone while AppendEntries flow. The scenario pins the rule; the schedules rerun the safety property test's random schedules
(tests/property/test_raft_safety.py) with it on, derandomized, with every invariant checked at each step."""

from __future__ import annotations

from typing import Any, ClassVar

from dledger.core.config import RaftConfig
from dledger.core.messages import AppendEntries
from tests.property.test_raft_safety import RaftSchedule, run_variant
from tests.sim.cluster import Cluster


def test_a_commit_reaches_followers_with_the_next_append_or_within_two_ticks() -> None:
    c = Cluster(3, seed=5, config=RaftConfig(segment_size=4096, commit_at_tick=True))
    c.run_until(lambda: c.leader() is not None)
    c.run(3)
    leader = c.leader()
    followers = [n for n in c.ids if n != leader]
    sent: list = []
    send = c._send

    def spy(messages):
        sent.extend(messages)
        send(messages)

    c._send = spy
    p = c.propose(leader, [b"one"])
    c.deliver_all()
    assert c.nodes[leader].core.commit_index >= p.first_index
    appends = [m for m in sent if isinstance(m, AppendEntries)]
    assert len(appends) == 2, "one AppendEntries per follower: no empty one per commit"
    assert all(c.nodes[f].core.commit_index < p.first_index for f in followers)
    q = c.propose(leader, [b"two"])  # the next AppendEntries carries the first commit
    c.deliver_all()
    assert all(c.nodes[f].core.commit_index >= p.first_index for f in followers)
    c.tick()  # the first tick notes the commit index; the second tells the followers that did not hear it
    c.deliver_all()
    assert all(c.nodes[f].core.commit_index < q.first_index for f in followers)
    c.tick()
    c.deliver_all()
    assert all(c.nodes[f].core.commit_index >= q.first_index for f in followers)
    sent.clear()
    for _ in range(5):  # appends flowing across ticks: no AppendEntries for a commit alone
        c.propose(leader, [b"more"])
        c.deliver_all()
        c.tick()
    c.deliver_all()
    appends = [m for m in sent if isinstance(m, AppendEntries)]
    assert len(appends) == 10 and all(m.frames for m in appends), appends
    c.check_invariants()


class CommitAtTickSchedule(RaftSchedule):
    """The safety schedules, every node telling commits at ticks."""

    config_overrides: ClassVar[dict[str, Any]] = {"commit_at_tick": True}


def test_schedules_with_commit_at_tick() -> None:
    run_variant(CommitAtTickSchedule)
