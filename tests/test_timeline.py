"""``dledger.timeline``: off, a mark records nothing; on, each process appends its marks (monotonic ns, name) to
its own file, which the benchmark reads back (bench/timeline.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dledger import timeline


@pytest.fixture
def recording(tmp_path: Path):
    timeline.record_to(str(tmp_path))
    try:
        yield tmp_path
    finally:
        timeline.record_to(None)


def test_marks_are_appended_to_the_process_file_in_order(recording: Path) -> None:
    t0 = time.monotonic_ns()
    timeline.mark("client.submit")
    timeline.mark("send", "n1")
    timeline.flush()
    timeline.mark("client.done")
    timeline.flush()
    lines = (recording / f"{os.getpid()}{timeline.SUFFIX}").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["client.submit", "send.n1", "client.done"]
    times = [int(line.split(" ", 1)[0]) for line in lines]
    assert t0 <= times[0] <= times[1] <= times[2] <= time.monotonic_ns()


def test_records_are_written_once_enough_are_kept(recording: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "FLUSH_EVERY", 3)
    path = recording / f"{os.getpid()}{timeline.SUFFIX}"
    timeline.mark("a")
    timeline.mark("b")
    assert not path.exists()
    timeline.mark("c")
    assert len(path.read_text().splitlines()) == 3


def test_off_a_mark_records_nothing(tmp_path: Path) -> None:
    timeline.record_to(None)
    timeline.mark("ready")
    timeline.record_to(str(tmp_path))  # turning it on later writes nothing from before
    timeline.record_to(None)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_written_turns_the_marks_off_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(timeline, "FLUSH_EVERY", 2)
    timeline.record_to(str(tmp_path / "no-such-directory"))
    try:
        timeline.mark("ready")
        timeline.mark("persisted")  # the flush fails here, inside whatever code marked: it must not raise
        timeline.mark("commit")
        assert "marks are off" in caplog.text
        timeline.flush()
        assert not (tmp_path / "no-such-directory").exists()
    finally:
        timeline.record_to(None)


def test_a_process_stops_recording_at_its_cap(
    recording: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(timeline, "FLUSH_EVERY", 2)
    monkeypatch.setattr(timeline, "MAX_RECORDS", 5)
    for i in range(9):
        timeline.mark(f"m{i}")
    timeline.flush()
    lines = (recording / f"{os.getpid()}{timeline.SUFFIX}").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["m0", "m1", "m2", "m3", "m4"]
    assert "the most a process writes" in caplog.text
