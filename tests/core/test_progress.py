"""Progress: the PROBE / REPLICATE / SNAPSHOT state machine and the inflight window."""

from __future__ import annotations

import pytest

from dledger.core.progress import Inflights, Progress, ProgressState


def test_inflights_window() -> None:
    w = Inflights(3)
    for i in (10, 20, 30):
        w.add(i)
    assert w.full
    with pytest.raises(OverflowError):
        w.add(40)
    w.free_le(20)
    assert len(w) == 1 and not w.full
    w.free_first()
    assert len(w) == 0


def test_probe_sends_one_then_waits() -> None:
    pr = Progress(next_index=5, max_inflight=4)
    assert pr.state is ProgressState.PROBE and not pr.is_paused
    pr.sent_entries(7)
    assert pr.is_paused and pr.next_index == 5
    assert pr.maybe_update(7) and not pr.is_paused
    pr.become_replicate()
    assert pr.next_index == 8


def test_replicate_pipelines_up_to_the_window() -> None:
    pr = Progress(next_index=0, max_inflight=2, match_index=-1)
    pr.become_replicate()
    pr.sent_entries(9)
    pr.sent_entries(19)
    assert pr.is_paused and pr.next_index == 20
    pr.maybe_update(9)
    pr.inflights.free_le(9)
    assert not pr.is_paused


def test_rejection_in_replicate_falls_back_to_probe_from_match() -> None:
    pr = Progress(next_index=0, max_inflight=2)
    pr.maybe_update(4)
    pr.become_replicate()
    pr.sent_entries(20)
    assert pr.maybe_decrease_to(12)
    assert pr.state is ProgressState.PROBE and pr.next_index == 5


def test_probe_rejection_moves_back_but_never_below_match() -> None:
    pr = Progress(next_index=50, max_inflight=2, match_index=10)
    pr.sent_entries(60)
    assert pr.maybe_decrease_to(30) and pr.next_index == 30 and not pr.is_paused
    assert not pr.maybe_decrease_to(40), "a hint at or past next answers an older probe"
    assert pr.maybe_decrease_to(3) and pr.next_index == 11


def test_snapshot_state_pauses_until_resolved() -> None:
    pr = Progress(next_index=3, max_inflight=2)
    pr.become_snapshot(100)
    assert pr.is_paused and not pr.maybe_decrease_to(1)
    pr.become_probe()
    assert pr.next_index == 101
