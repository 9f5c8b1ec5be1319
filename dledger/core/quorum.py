"""Majority math: which index a quorum has replicated, and how an election stands.

Kept apart from the role logic (as etcd-io/raft's ``quorum/majority.go``) because it is the one place where an
off-by-one loses data: it is checked in ``tests/core/test_quorum.py`` against a sorted-median oracle.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping


class VoteResult(enum.Enum):
    PENDING = "pending"  # neither a quorum of grants nor of rejections yet
    WON = "won"
    LOST = "lost"


def quorum_size(n_voters: int) -> int:
    """Smallest majority of ``n_voters`` (2 of 3, 3 of 5)."""
    return n_voters // 2 + 1


def committed_index(match_by_voter: Mapping[str, int], voters: Iterable[str]) -> int:
    """The highest index held by a majority of ``voters``: the quorum-th largest match index.

    Voters missing from ``match_by_voter`` count as holding nothing (-1; our logs are 0-based).
    """
    matches = sorted((match_by_voter.get(v, -1) for v in voters), reverse=True)
    if not matches:
        raise ValueError("no voters")
    return matches[quorum_size(len(matches)) - 1]


def vote_result(votes: Mapping[str, bool], voters: Iterable[str]) -> VoteResult:
    """Won once a majority granted; lost once a majority can no longer grant; pending otherwise."""
    voters = list(voters)
    q = quorum_size(len(voters))
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    if granted >= q:
        return VoteResult.WON
    if len(voters) - rejected < q:
        return VoteResult.LOST
    return VoteResult.PENDING
