"""``bench.timeline`` lines each call's records up along its critical path (the follower that answered first,
the first mark of each step after the one before), leaves out calls whose records do not line up, and runs end
to end on a real group, where every node writes its marks (so neither can rot)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from bench.timeline import HOPS, LEADER_PERSIST, line_up, main, windows_of
from tests.bench.test_compare_smoke import _children_of

US = 1000  # records are in nanoseconds


def _call(t0: int, slow_follower: str = "n2") -> list[tuple[int, str, str]]:
    """One call's records: n1 and n2 are the followers, ``slow_follower`` answers late."""
    fast = "n1" if slow_follower == "n2" else "n2"
    return sorted(
        [
            (t0, "C", "client.submit"),
            (t0 + 100 * US, "L", "stream.request"),
            (t0 + 180 * US, "L", "ready"),
            (t0 + 190 * US, "L", f"send.{slow_follower}"),
            (t0 + 200 * US, "L", f"send.{fast}"),
            (t0 + 260 * US, "L", "persisted"),
            (t0 + 300 * US, fast, "pipe.request"),
            (t0 + 330 * US, slow_follower, "pipe.request"),
            (t0 + 420 * US, fast, "stream.answer"),
            (t0 + 500 * US, slow_follower, "stream.answer"),
            (t0 + 560 * US, "L", "ack"),
            (t0 + 570 * US, "L", "commit"),
            (t0 + 600 * US, "L", "ack"),
            (t0 + 650 * US, "L", "stream.answer"),
            (t0 + 800 * US, "C", "client.answer"),
            (t0 + 830 * US, "C", "client.done"),
        ]
    )


def test_a_call_is_lined_up_through_the_follower_that_answered_first() -> None:
    records = _call(0) + _call(10_000 * US, slow_follower="n1")
    windows = windows_of(records, 0, 20_000 * US)
    assert windows == [(0, 830 * US), (10_000 * US, 10_830 * US)]
    lined = line_up(records, windows, ["n1", "n2"])
    assert lined.skipped == 0 and lined.totals_us == [830.0, 830.0]
    want = [100.0, 80.0, 20.0, 100.0, 120.0, 140.0, 10.0, 80.0, 150.0, 30.0]  # via the fast follower's send
    assert [lined.hops[h] for h in HOPS] == [[w, w] for w in want]
    assert sum(want) == 830.0
    assert lined.hops[LEADER_PERSIST] == [80.0, 80.0]


def test_calls_whose_records_do_not_line_up_are_left_out() -> None:
    no_follower_answer = [r for r in _call(0) if r[2] != "stream.answer" or r[1] == "L"]
    no_commit = [r for r in _call(10_000 * US) if r[2] != "commit"]
    records = sorted(no_follower_answer + no_commit + _call(20_000 * US))
    lined = line_up(records, windows_of(records, 0, 30_000 * US), ["n1", "n2"])
    assert lined.skipped == 2 and lined.totals_us == [830.0]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_timeline_runs_on_a_real_group_and_every_process_marks(capsys: pytest.CaptureFixture[str]) -> None:
    before = _children_of(os.getpid())
    kept = set(Path(tempfile.gettempdir()).glob("dledger-timeline-*"))
    assert main(["--sends", "40", "--kinds", "send,append"]) == 0
    assert _children_of(os.getpid()) <= before, "the benchmark left a process running"
    assert set(Path(tempfile.gettempdir()).glob("dledger-timeline-*")) == kept, "its records were left behind"
    out = capsys.readouterr().out
    for kind in ("send", "append"):
        section = out.split(f"### {kind}: ", 1)[1].split("###", 1)[0]
        lined = int(section.split(" calls lined up", 1)[0])
        assert lined >= 30, section  # a leader change may leave a few out, never most
        rows = {
            line.split("|")[1].strip(): line.split("|")[2:4] for line in section.splitlines() if "|" in line
        }
        for hop in HOPS:  # a hop missing would mean a process (client, leader, follower) wrote no marks
            p50, mean = (float(c.strip()) for c in rows[hop])
            assert p50 >= 0 and mean >= 0, (hop, section)
        assert float(rows["**whole call**"][0].strip(" *")) > 0


def test_the_kinds_are_checked() -> None:
    with pytest.raises(SystemExit):
        main(["--kinds", "publish"])
