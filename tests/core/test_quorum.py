"""Quorum math against one-line oracles (etcd-io/raft quorum/quick_test.go does the same)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.core.quorum import VoteResult, committed_index, quorum_size, vote_result

voters_st = st.lists(
    st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]), min_size=1, max_size=7, unique=True
)


def test_quorum_sizes() -> None:
    assert [quorum_size(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


@settings(max_examples=500)
@given(voters=voters_st, data=st.data())
def test_committed_index_is_the_sorted_median(voters, data) -> None:
    match = {v: data.draw(st.integers(-1, 50)) for v in voters if data.draw(st.booleans())}
    oracle = sorted((match.get(v, -1) for v in voters), reverse=True)[len(voters) // 2]
    got = committed_index(match, voters)
    assert got == oracle
    # A majority holds it, and no higher index is held by a majority.
    assert sum(1 for v in voters if match.get(v, -1) >= got) >= quorum_size(len(voters))
    assert sum(1 for v in voters if match.get(v, -1) >= got + 1) < quorum_size(len(voters))


@settings(max_examples=500)
@given(voters=voters_st, data=st.data())
def test_vote_result_matches_counting(voters, data) -> None:
    votes = {v: data.draw(st.booleans()) for v in voters if data.draw(st.booleans())}
    q = quorum_size(len(voters))
    yes = sum(1 for v in votes.values() if v)
    no = sum(1 for v in votes.values() if not v)
    expect = VoteResult.WON if yes >= q else VoteResult.LOST if no > len(voters) - q else VoteResult.PENDING
    assert vote_result(votes, voters) is expect


def test_votes_from_non_voters_do_not_count() -> None:
    assert vote_result({"x": True, "y": True}, ["a", "b", "c"]) is VoteResult.PENDING
    assert committed_index({"x": 9, "a": 3}, ["a", "b", "c"]) == -1
