"""``dledger chaos`` end to end: a one-fault run of real processes, its summary and its files."""

from __future__ import annotations

import json
import subprocess
import sys


def test_chaos_command_runs_checks_and_writes_its_files(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dledger",
            "chaos",
            "--dir",
            str(tmp_path / "g"),
            "--out",
            str(out),
            "--faults",
            "kill-leader",
            "--steps",
            "1",
            "--seed",
            "5",
            "--no-audit",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "seed 5: PASS" in r.stdout and "acked_present" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["faults"] == {"kill-leader": 1}
    assert summary["operations"]["acked"] > 0
    for name in ("history.jsonl", "schedule.json", "acks.jsonl"):
        assert (out / name).stat().st_size > 0


def test_unknown_fault_kind_is_refused(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "dledger", "chaos", "--faults", "meteor", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "unknown fault kinds ['meteor']" in r.stdout


def test_unknown_flush_policy_is_refused(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "dledger", "chaos", "--flush", "sometimes", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--flush must be sync or async" in r.stdout
