"""Hypothesis drives fault schedules through the simulated cluster; Raft's safety properties hold after every step.

Rules: tick, deliver one message, deliver everything due, drop, duplicate, delay, reorder, cut a link, isolate a
node, heal, crash (optionally part-way through handling a Ready), restart, propose, transfer leadership, compact,
and membership changes: add a new node as a learner, promote a learner, remove a voter or a learner (the leader
included), and replace (add a learner for a node that is down). Invariants (``Cluster.check_invariants``): one
leader per term (under any configuration), log matching, state machine safety (committed entries never change or
disappear), leader completeness, commit index monotonic, and for membership: each config entry changes one voter
at most, so no two majorities of consecutive configurations are disjoint, it follows a committed one, and only
voters campaign or win. At the end of every schedule
the faults stop (heal, restart everyone) and a leader must be elected and commit a new proposal within a bounded
virtual time: liveness.

``make test`` runs the ``ci`` profile (>= 2,000 schedules, derandomized so CI is reproducible); ``SOAK=1`` (``make
soak``) runs the ``soak`` profile with fresh randomness and >= 100,000 schedules. A failure prints the shrunk
schedule (hypothesis' step list) and the cluster transcript.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dledger.core.config import RaftConfig
from dledger.core.membership import ConfChange, ConfChangeKind
from dledger.errors import InvalidRequestError, NotLeaderError, UnavailableError
from tests.sim.cluster import CRASH_STAGES, Cluster

CI_SCHEDULES = int(os.environ.get("RAFT_SCHEDULES", "2000"))
SOAK_SCHEDULES = int(os.environ.get("RAFT_SOAK_SCHEDULES", "100000"))

settings.register_profile(
    "raft-ci",
    max_examples=CI_SCHEDULES,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile(
    "raft-soak",
    max_examples=SOAK_SCHEDULES,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)

# Small segments so entries roll over data-file boundaries (blank-filler placement is replicated state too).
CONFIG = RaftConfig(segment_size=4096, max_append_bytes=1024, max_inflight=3)
LIVENESS_TICKS = 3000
MAX_NODES = 7  # membership rules add nodes up to this many (removed ones included)


class RaftSchedule(RuleBasedStateMachine):
    coverage: Counter[str] = Counter()  # filled by teardown, checked by the tests below
    config_overrides: ClassVar[dict[str, Any]] = {}  # RaftConfig settings a subclass schedules with

    def __init__(self) -> None:
        super().__init__()
        self.cluster: Cluster | None = None
        self.proposals = 0

    @initialize(
        n=st.sampled_from([3, 3, 5]),
        seed=st.integers(0, 2**32 - 1),
        pre_vote=st.booleans(),
        warm=st.integers(0, 9),
    )
    def boot(self, n: int, seed: int, pre_vote: bool, warm: int) -> None:
        cfg = RaftConfig(
            segment_size=CONFIG.segment_size,
            max_append_bytes=CONFIG.max_append_bytes,
            max_inflight=CONFIG.max_inflight,
            pre_vote=pre_vote,
            check_quorum=pre_vote,
            **self.config_overrides,
        )
        self.cluster = c = Cluster(n, seed=seed, config=cfg, segment_size=cfg.segment_size)
        if warm:  # most schedules start from a working group with a few committed entries; some from scratch
            c.run_until(lambda: c.leader() is not None)
            for k in range(warm):
                c.propose(c.leader(), [f"warm{k}".encode() * (1 + 40 * k)])
            c.stabilize()

    def node(self, i: int) -> str:
        ids = self.cluster.ids
        return ids[i % len(ids)]

    # -- time and the network --------------------------------------------------------------------------------------

    @rule(k=st.integers(1, 40))
    def tick(self, k: int) -> None:
        self.cluster.tick(k)

    @rule(k=st.integers(1, 60))
    def tick_and_deliver(self, k: int) -> None:
        for _ in range(k):
            self.cluster.tick()
            self.cluster.deliver_all()

    @precondition(lambda self: self.cluster is not None and self.cluster.queue)
    @rule(i=st.integers(0, 1 << 16))
    def deliver_one(self, i: int) -> None:
        self.cluster.deliver(i % len(self.cluster.queue))

    @rule()
    def deliver_all(self) -> None:
        self.cluster.deliver_all()

    @precondition(lambda self: self.cluster is not None and self.cluster.queue)
    @rule(i=st.integers(0, 1 << 16))
    def drop(self, i: int) -> None:
        self.cluster.drop(i % len(self.cluster.queue))

    @precondition(lambda self: self.cluster is not None and self.cluster.queue)
    @rule(i=st.integers(0, 1 << 16))
    def duplicate(self, i: int) -> None:
        self.cluster.duplicate(i % len(self.cluster.queue))

    @precondition(lambda self: self.cluster is not None and self.cluster.queue)
    @rule(i=st.integers(0, 1 << 16), ticks=st.integers(1, 30))
    def delay(self, i: int, ticks: int) -> None:
        self.cluster.delay(i % len(self.cluster.queue), ticks)

    @precondition(lambda self: self.cluster is not None and len(self.cluster.queue) > 1)
    @rule(i=st.integers(0, 1 << 16))
    def reorder(self, i: int) -> None:
        self.cluster.reorder(i % len(self.cluster.queue))

    @rule(a=st.integers(0, 4), b=st.integers(0, 4))
    def cut(self, a: int, b: int) -> None:
        x, y = self.node(a), self.node(b)
        if x != y:
            self.cluster.cut(x, y)

    @rule(a=st.integers(0, 4))
    def isolate(self, a: int) -> None:
        self.cluster.isolate(self.node(a))

    @rule()
    def heal(self) -> None:
        self.cluster.heal()

    # -- nodes -------------------------------------------------------------------------------------------------------

    @rule(a=st.integers(0, 4), stage=st.sampled_from(CRASH_STAGES))
    def crash(self, a: int, stage: str) -> None:
        self.cluster.crash(self.node(a), stage)

    @rule(a=st.integers(0, 4))
    def hold(self, a: int) -> None:
        """A slow disk: the node's next write stalls while it goes on stepping and answering heartbeats."""
        self.cluster.hold(self.node(a))

    @rule(a=st.integers(0, 4))
    def release(self, a: int) -> None:
        self.cluster.release(self.node(a))

    @rule(a=st.integers(0, 4), k=st.integers(1, 40))
    def stall(self, a: int, k: int) -> None:
        """A disk stall of ``k`` ticks on one node while the network delivers everything."""
        nid = self.node(a)
        self.cluster.hold(nid)
        self.tick_and_deliver(k)
        self.cluster.release(nid)

    @rule(a=st.integers(0, 4))
    def restart(self, a: int) -> None:
        self.cluster.restart(self.node(a))

    @rule(k=st.integers(1, 8), size=st.integers(0, 1500))
    def propose(self, k: int, size: int) -> None:
        leader = self.cluster.leader()
        if leader is None:
            return
        bodies = []
        for _ in range(k):
            self.proposals += 1
            bodies.append(f"p{self.proposals}".encode().ljust(size, b"."))
        with contextlib.suppress(NotLeaderError):  # refused during a leadership transfer: clients retry
            self.cluster.propose(leader, bodies)

    @rule(a=st.integers(0, 4))
    def transfer(self, a: int) -> None:
        leader = self.cluster.leader()
        if leader is not None:
            with contextlib.suppress(InvalidRequestError):  # a learner or a removed node: not a voter
                self.cluster.nodes[leader].core.transfer_leadership(self.node(a))
            self.cluster.process(leader)

    # -- membership --------------------------------------------------------------------------------------------------

    def _change(self, kind: ConfChangeKind, node: str) -> None:
        leader = self.cluster.leader()
        if leader is None:
            return
        # Refusals are outcomes too: a change pending, no commit in the term yet, a learner behind, a bad change.
        with contextlib.suppress(NotLeaderError, UnavailableError, InvalidRequestError):
            self.cluster.change(leader, ConfChange(kind, node))

    @rule()
    def add_learner(self) -> None:
        """A new, empty node joins as a learner (it catches up by log or snapshot)."""
        c = self.cluster
        if len(c.ids) >= MAX_NODES or c.leader() is None:
            return
        nid = f"n{len(c.ids) + 1}"
        c.add_node(nid)
        self._change(ConfChangeKind.ADD_LEARNER, nid)

    @rule(a=st.integers(0, 8))
    def promote(self, a: int) -> None:
        leader = self.cluster.leader()
        if leader is None:
            return
        learners = self.cluster.nodes[leader].core.configuration.learners
        if learners:
            self._change(ConfChangeKind.PROMOTE, learners[a % len(learners)])

    @rule(a=st.integers(0, 8))
    def remove(self, a: int) -> None:
        """Remove any node (a voter, a learner, the leader itself; a non-member is refused)."""
        self._change(ConfChangeKind.REMOVE, self.node(a))

    @rule()
    def remove_leader(self) -> None:
        leader = self.cluster.leader()
        if leader is not None:
            self._change(ConfChangeKind.REMOVE, leader)

    @rule(a=st.integers(0, 8))
    def replace(self, a: int) -> None:
        """The first step of replacing a node: crash it for good and add a new learner in its place (the
        promote and remove rules finish the job when hypothesis picks them)."""
        c = self.cluster
        victim = self.node(a)
        if len(c.ids) >= MAX_NODES or c.leader() in (None, victim):
            return
        c.crash(victim)
        self.add_learner()

    @rule(a=st.integers(0, 4), back=st.integers(0, 5))
    def compact(self, a: int, back: int) -> None:
        node = self.cluster.nodes[self.node(a)]
        self.cluster.compact(node.id, node.applied - back)

    @rule(back=st.integers(0, 3))
    def compact_everyone(self, back: int) -> None:
        """Every node snapshots near its applied index: a follower that lags must then install a snapshot."""
        for node in self.cluster.nodes.values():
            self.cluster.compact(node.id, node.applied - back)

    # -- checks ------------------------------------------------------------------------------------------------------

    @invariant()
    def safety(self) -> None:
        if self.cluster is not None:
            self.cluster.check_invariants()

    def _committed_everywhere(self, p, ticks: int) -> bool:
        c = self.cluster

        def done() -> bool:
            members = c.members()  # removed nodes never hear of the proposal
            return all(
                n.core.commit_index >= p.first_index and n.core.raft_log.match_term(p.first_index, p.term)
                for n in c.nodes.values()
                if n.id in members
            )

        for _ in range(ticks):
            c.deliver_all()
            if done():
                return True
            c.tick()
        return False

    def teardown(self) -> None:
        c = self.cluster
        if c is None:
            return
        # Liveness: faults stop, everyone is back, the network is reliable: a leader commits a new entry.
        # Coverage: the test asserts that enough schedules elected, committed, crashed, and lost messages.
        stats = RaftSchedule.coverage
        stats["schedules"] += 1
        stats["elected a leader"] += bool(c.leaders_by_term)
        stats["had two or more terms with a leader"] += len(c.leaders_by_term) >= 2
        stats["committed 5+ entries"] += c.max_committed >= 5
        stats["crashed a node"] += any(n.crashes for n in c.nodes.values())
        stats["dropped a message"] += any(" drop " in line for line in c.transcript)
        stats["installed a snapshot"] += any("installed snapshot" in line for line in c.transcript)
        stats["truncated a follower log"] += c.truncations > 0
        stats["changed membership"] += c.conf_changes > 0
        stats["promoted a learner"] += any(": promote " in line for line in c.transcript)
        stats["removed the leader"] += any("it is no longer a voter" in line for line in c.transcript)
        stats["held a write"] += any(": its write of " in line for line in c.transcript)
        stats["sent heartbeats during a held write"] += c.early_heartbeats > 0
        c.release_all()
        c.heal()
        for nid in c.ids:
            c.restart(nid)
        for env in c.queue:
            env.deliver_at = min(env.deliver_at, c.now)
        # A proposal counts once every node has committed it with the term it was proposed in (a leader that
        # has just lost its quorum may accept a proposal that is later overwritten: then we propose again).
        start = c.now
        while True:
            c.run_until(lambda: c.leader() is not None, max_ticks=LIVENESS_TICKS)
            assert c.now - start <= LIVENESS_TICKS, f"no commit within {LIVENESS_TICKS} ticks\n{c.dump(60)}"
            try:
                p = c.propose(c.leader(), [b"liveness"])
            except NotLeaderError:  # a leadership transfer is in progress: retry shortly
                c.run(5)
                continue
            if self._committed_everywhere(p, ticks=200):
                break
        c.check_invariants()


def run_variant(schedule: type[RaftSchedule], examples: int = 300) -> None:
    """``examples`` of the safety schedules with a subclass's ``config_overrides`` (a RaftConfig setting the node
    runtime uses: tests/sim/test_commit_at_tick.py, tests/sim/test_check_quorum_periods.py), derandomized."""
    run_state_machine_as_test(
        schedule, settings=settings(settings.get_profile("raft-ci"), max_examples=examples)
    )


@pytest.mark.timeout(1200)  # CPU-bound; a loaded CI machine must not fail it on time
def test_schedules() -> None:
    """>= 2,000 generated fault schedules (``RAFT_SCHEDULES`` overrides), each ending with a liveness check."""
    RaftSchedule.coverage.clear()
    run_state_machine_as_test(RaftSchedule, settings=settings.get_profile("raft-ci"))
    _check_coverage(RaftSchedule.coverage)


def _check_coverage(stats: Counter[str]) -> None:
    """A generator that stopped producing interesting schedules would pass vacuously: refuse that."""
    n = stats["schedules"]
    print("schedule coverage:", {k: f"{v}/{n}" for k, v in sorted(stats.items())})
    assert n >= CI_SCHEDULES // 2
    for key, share in [
        ("elected a leader", 0.5),
        ("had two or more terms with a leader", 0.1),
        ("committed 5+ entries", 0.1),
        ("crashed a node", 0.2),
        ("dropped a message", 0.1),
        ("installed a snapshot", 0.002),
        ("truncated a follower log", 0.002),
        ("changed membership", 0.1),
        ("promoted a learner", 0.005),
        ("removed the leader", 0.002),
        ("held a write", 0.1),
        ("sent heartbeats during a held write", 0.02),
    ]:
        assert stats[key] >= share * n, f"only {stats[key]} of {n} schedules {key}"


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_soak() -> None:
    """``make soak`` (SOAK=1): the same machine with fresh randomness and >= 100,000 schedules."""
    RaftSchedule.coverage.clear()
    run_state_machine_as_test(RaftSchedule, settings=settings.get_profile("raft-soak"))
    _check_coverage(RaftSchedule.coverage)
