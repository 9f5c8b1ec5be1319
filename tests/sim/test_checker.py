"""The invariant checker itself can fail: forged violations are caught (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import pytest

from dledger.core.messages import Ready
from storage import codec
from tests.sim.cluster import Cluster, InvariantViolation


def _elected_with_entries() -> Cluster:
    c = Cluster(3, seed=21)
    c.run_until(lambda: c.leader() is not None)
    c.propose(c.leader(), [b"a", b"b"])
    c.stabilize()
    c.check_invariants()
    return c


def test_a_divergent_entry_with_the_same_index_and_term_is_caught() -> None:
    c = _elected_with_entries()

    def next_frame(nid: str, body: bytes) -> bytes:
        t = c.nodes[nid].store.tail()
        return codec.encode(t.last_index + 1, t.last_term, t.end_pos, body, t.chain_crc)

    c._persist(c.nodes["n2"], Ready(frames=next_frame("n2", b"one")))
    with pytest.raises(InvariantViolation, match="log matching"):
        c._persist(c.nodes["n3"], Ready(frames=next_frame("n3", b"another")))


def test_truncating_a_committed_entry_is_caught() -> None:
    c = _elected_with_entries()
    node = c.nodes["n2"]
    with pytest.raises(InvariantViolation, match="truncates committed entry"):
        c._persist(node, Ready(truncate_from=node.store.last_index))


def test_a_commit_that_changes_is_caught() -> None:
    c = _elected_with_entries()
    node = c.nodes["n1"]
    index = c.max_committed
    term, chain = c.committed[index]
    with pytest.raises(InvariantViolation, match="state machine safety"):
        c._record_commit(node, index, term, chain ^ 1)
