"""The comparison harness runs end to end, so it cannot rot between full runs.

A short run of ``python -m bench.compare`` (in-process) against our group and, when it is installed, the
PySyncObj group: every phase (throughput rounds, failover with a real kill -9, stability) and every output
(markdown table, JSON, PNG when matplotlib is there). etcd is never installed here. No process may survive the
run: the harness stops what it started by pid.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from bench.compare import report
from bench.compare.__main__ import main
from bench.compare.workloads import FailoverResult, LoadResult

HAVE_PSO = importlib.util.find_spec("pysyncobj") is not None
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _children_of(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(d.name))
    return out


@pytest.mark.slow  # a whole benchmark run (make soak): keeps make test under 10 minutes
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_compare_runs_end_to_end(tmp_path: Path) -> None:
    systems = "ours-sync,pysyncobj" if HAVE_PSO else "ours-sync"
    before = _children_of(os.getpid())
    argv = [
        "--systems",
        systems,
        "--rounds",
        "1",
        "--seconds",
        "0.5",
        "--warmup",
        "0.2",
        "--failover-rounds",
        "1",
        "--stability-s",
        "1",
        "--no-install",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert _children_of(os.getpid()) <= before, "the harness left a process running"

    doc = json.loads((tmp_path / "compare.json").read_text())
    names = systems.split(",")
    assert set(doc["meta"]["systems"]) == set(names)
    for name in names:
        rows = {s["workload"]: s for s in doc["summary"] if s["system"] == name}
        assert set(rows) == {"sequential", "concurrent-16", "concurrent-64", "batched"}
        for w, s in rows.items():
            assert s["rate_median"] > 0, f"{name} acknowledged nothing in {w}"
        fo = [f for f in doc["failover_rounds"] if f["system"] == name]
        assert len(fo) == 1 and fo[0]["to_write_ms"] > 0
        st = [r for r in doc["stability"] if r["system"] == name]
        assert len(st) == 1 and st[0]["entries"] > 0
    md = (tmp_path / "compare.md").read_text()
    assert "| sequential | ours-sync |" in md and "Durability:" in md
    if HAVE_PSO:
        assert "ours-sync vs pysyncobj" in md
    if HAVE_MPL:
        assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _load(system: str, workload: str, rate: float, p50: float) -> LoadResult:
    return LoadResult(system, workload, 0, 1, 1, 1.0, int(rate), int(rate), 0, rate, p50, p50 * 2, 0, 0)


def test_ratios_say_above_one_is_better_for_rates_and_times() -> None:
    loads = [
        _load("ours-sync", "sequential", 2000, 0.5),
        _load("etcd", "sequential", 1000, 1.0),
        _load("ours-sync", "concurrent-64", 3000, 20.0),
        _load("etcd", "concurrent-64", 6000, 10.0),
    ]
    fails = [FailoverResult("ours-sync", 0, "n0", 200, 150, 3), FailoverResult("etcd", 0, "e0", 400, 390, 9)]
    text = report.tables(report.summarize(loads), report.summarize_failover(fails), [], {"ours-sync": "x"})
    assert "| sequential | 2.00x rate, 2.00x p50 |" in text
    assert "| concurrent-64 | 0.50x rate, 0.50x p50 |" in text
    assert "etcd (ours 2.00x faster, median)" in text
    s = report.summarize_failover([*fails, FailoverResult("etcd", 1, "e1", 600, math.nan, 1)])
    etcd = next(f for f in s if f.system == "etcd")
    assert (etcd.to_write_median_ms, etcd.to_write_max_ms, etcd.to_leader_max_ms) == (500, 600, 390)
