"""The one routing and retry policy of every client: hints are followed at once (a few in a row), anything else
backs off 10 ms doubling to 200 ms, non-retriable errors and unknown outcomes of non-idempotent requests are
raised at once, and the deadline turns the last error into ``UnavailableError``."""

from __future__ import annotations

import random

import pytest

from dledger.errors import (
    BackpressureError,
    InvalidRequestError,
    NotLeaderError,
    OutcomeUnknownError,
    UnavailableError,
)
from dledger.routing import MAX_REDIRECTS_IN_A_ROW, Router

A, B, C = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rotation_then_the_leader_it_learns():
    r = Router([A, B, A, C])
    assert r.addresses == [A, B, C]
    assert [r.candidate() for _ in range(4)] == [A, B, C, A]
    r.succeeded(B)
    assert [r.candidate() for _ in range(2)] == [B, B]
    with pytest.raises(ValueError):
        Router([])


def test_a_hint_is_followed_at_once_and_a_new_address_remembered():
    r = Router([A])
    att = r.attempts(10, clock=Clock())
    assert att.failed(NotLeaderError(B), A) == 0.0
    assert r.leader == B and B in r.addresses and att.target() == B
    assert r.stats == {"retries": 1, "redirects": 1}


def test_a_hint_back_to_the_same_node_or_an_id_backs_off():
    r = Router([A, B], rng=random.Random(1))
    att = r.attempts(10, clock=Clock())
    assert att.failed(NotLeaderError(A), A) > 0
    assert att.failed(NotLeaderError("n2"), A) > 0  # an id, not an address: cannot dial it
    assert r.leader is None


def test_redirects_in_a_row_are_bounded():
    r = Router([A, B])
    att = r.attempts(10, clock=Clock())
    delays = [att.failed(NotLeaderError(B if i % 2 == 0 else A), A if i % 2 == 0 else B) for i in range(6)]
    assert delays[:MAX_REDIRECTS_IN_A_ROW] == [0.0] * MAX_REDIRECTS_IN_A_ROW
    assert delays[MAX_REDIRECTS_IN_A_ROW] > 0


def test_backoff_doubles_from_10_ms_to_200_ms_with_jitter():
    r = Router([A], rng=random.Random(7))
    for attempt, base in [(0, 0.01), (1, 0.02), (2, 0.04), (4, 0.16), (5, 0.2), (9, 0.2)]:
        d = r.backoff(attempt)
        assert 0.5 * base <= d <= 1.5 * base


def test_a_failed_leader_is_forgotten():
    r = Router([A, B])
    r.succeeded(A)
    r.attempts(10, clock=Clock()).failed(UnavailableError("down"), A)
    assert r.leader is None


def test_not_retriable_and_unknown_outcomes_are_raised():
    r = Router([A])
    with pytest.raises(InvalidRequestError):
        r.attempts(10, clock=Clock()).failed(InvalidRequestError("bad"), A)
    with pytest.raises(OutcomeUnknownError):
        r.attempts(10, clock=Clock()).failed(OutcomeUnknownError("maybe"), A)
    assert r.attempts(10, retry_unknown=True, clock=Clock()).failed(OutcomeUnknownError("maybe"), A) > 0
    assert r.stats["retries"] == 1


def test_a_pinned_request_is_not_rerouted():
    r = Router([A, B])
    att = r.attempts(10, address=B, clock=Clock())
    assert att.target() == B
    with pytest.raises(NotLeaderError):
        att.failed(NotLeaderError(A), B)
    att.succeeded(B)
    assert r.leader is None  # a pinned read says nothing about who leads
    with pytest.raises(UnavailableError):
        r.attempts(10, address=B, clock=Clock()).failed(UnavailableError("down"), B)
    patient = r.attempts(10, address=B, retry_pinned=True, clock=Clock())
    assert patient.failed(UnavailableError("restarting"), B) > 0 and patient.target() == B
    with pytest.raises(NotLeaderError):  # cannot follow a hint away from the node it was pinned to
        patient.failed(NotLeaderError(A), B)


def test_the_deadline_names_the_last_error():
    clock = Clock()
    r = Router([A])
    att = r.attempts(0.5, "append", clock=clock)
    att.failed(BackpressureError("back off"), A)
    clock.now = 0.6
    with pytest.raises(UnavailableError, match=r"append did not succeed within 0\.5 s; last error: back off"):
        att.failed(BackpressureError("back off"), A)
    unknown = r.attempts(0.5, retry_unknown=True, clock=clock)
    clock.now = 2.0
    with pytest.raises(OutcomeUnknownError):  # an unknown outcome stays unknown at the deadline
        unknown.failed(OutcomeUnknownError("maybe"), A)


def test_no_retry_is_left_a_sliver_of_the_deadline():
    # A try made with a few milliseconds left times out and would turn a refusal into "outcome unknown": the
    # policy stops while the last try still had at least MIN_ATTEMPT_S (or a quarter of the budget).
    from dledger.routing import MIN_ATTEMPT_S

    for budget in (0.2, 2.0):
        clock = Clock()
        att = Router([A, B], rng=random.Random(7)).attempts(budget, "append", clock=clock)
        with pytest.raises(UnavailableError, match="no leader"):
            while True:
                delay = att.failed(UnavailableError("no leader is known"), A)
                clock.now += delay
                assert att.remaining() >= min(MIN_ATTEMPT_S, budget / 4)
                clock.now += 0.004  # the refused try itself
