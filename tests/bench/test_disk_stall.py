"""``bench/disk_stall.py`` end to end on real groups, briefly: every injected stall is taken by a follower's
fdatasync (the fault launcher runs the nodes), each setting gets its row, and nothing is left behind."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

from bench.disk_stall import main
from tests.bench.test_compare_smoke import _children_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_disk_stall_runs_both_settings_and_every_stall_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    before = _children_of(os.getpid())
    kept = set(Path(tempfile.gettempdir()).glob("dledger-disk-stall-*"))
    assert (
        main(["--stalls", "1", "--rounds", "1", "--periods", "1,2", "--stall-ms", "50", "--writers", "4"])
        == 0
    )
    assert _children_of(os.getpid()) <= before, "the benchmark left a process running"
    assert set(Path(tempfile.gettempdir()).glob("dledger-disk-stall-*")) == kept, (
        "its groups were left behind"
    )
    out = capsys.readouterr().out
    rows = re.findall(r"check_quorum_periods=(\d): ([\d,]+) appends/s.*stalls not taken (\d+)", out)
    assert sorted(p for p, _, _ in rows) == ["1", "2"], out
    assert all(int(rate.replace(",", "")) > 0 and untaken == "0" for _, rate, untaken in rows), out


def test_bad_settings_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--periods", "0"])


def test_the_leader_alone_can_be_stalled(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--stalls", "1", "--rounds", "1", "--periods", "2", "--stall-ms", "50", "--writers", "4"]
    assert main([*args, "--stalled", "leader"]) == 0
    out = capsys.readouterr().out
    assert "the first leader's fdatasync stalled 50 ms" in out, out
    assert re.search(r"check_quorum_periods=2: [\d,]+ appends/s.*stalls not taken 0", out), out
