"""Chaos runs on real node processes: fixed seeds, every fault kind at least once, every checker.

Each run starts a proxied 3-node group, drives its workload while the nemesis injects its schedule, then judges
the history and the final files. A failing run prints its seed and schedule (``reproduce``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dledger.chaos.nemesis import FAULT_KINDS, MEMBERSHIP, POWER_LOSS
from dledger.chaos.runner import RunConfig, run

pytestmark = pytest.mark.integration


def _assert_ok(summary, cfg) -> None:
    doc = json.loads((cfg.out / "summary.json").read_text())
    assert summary.ok, f"chaos run failed; reproduce: {summary.reproduce(cfg)}\n{json.dumps(doc, indent=1)}"


# The power cuts (a restart of several nodes each) run in tests/chaos/test_powerloss.py, the membership changes
# in tests/chaos/test_cluster.py, with their own seeds.
KINDS = tuple(k for k in FAULT_KINDS if k not in POWER_LOSS | MEMBERSHIP)


@pytest.mark.long
def test_every_fault_kind_broker_workload(tmp_path):
    cfg = RunConfig(tmp_path / "g", tmp_path / "out", seed=7, faults=KINDS, hold_s=(0.8, 1.6), min_acked=101)
    summary = run(cfg, log=lambda _line: None)
    _assert_ok(summary, cfg)
    assert set(summary.faults) == set(KINDS)
    assert summary.operations["acked"] > 100
    names = {v["name"] for v in summary.verdicts}
    assert {"acked_present", "nothing_unsent", "queue_order"} <= names
    acked = next(v for v in summary.verdicts if v["name"] == "acked_present")
    assert acked["consumed"] >= summary.operations["acked"]
    # the output directory holds what a later look needs
    for name in ("history.jsonl", "schedule.json", "summary.json", "acks.jsonl"):
        assert (cfg.out / name).stat().st_size > 0


@pytest.mark.long
def test_kv_register_history_is_linearizable(tmp_path):
    cfg = RunConfig(
        tmp_path / "g",
        tmp_path / "out",
        seed=3,
        workload="kv",
        faults=(
            "kill-leader",
            "pause-leader",
            "partition-isolate-leader",
            "partition-halves",
            "oneway-latency",
        ),
        hold_s=(0.8, 1.6),
        min_acked=101,  # writes: with the reads, far more than 100 operations to check
    )
    summary = run(cfg, log=lambda _line: None)
    _assert_ok(summary, cfg)
    lin = next(v for v in summary.verdicts if v["name"] == "linearizable")
    assert lin["operations"] > 100 and lin["keys"] >= 3
    assert summary.operations["acked"] > 100


@pytest.mark.long
def test_final_files_pass_the_spark_audit(tmp_path):
    cfg = RunConfig(
        tmp_path / "g",
        tmp_path / "out",
        seed=11,
        faults=("torn-tail", "kill-random", "disk-full"),
        hold_s=(0.8, 1.2),
        audit=True,
    )
    summary = run(cfg, log=lambda _line: None)
    _assert_ok(summary, cfg)
    audit = next(v for v in summary.verdicts if v["name"] == "spark_audit")
    assert audit["exit_status"] == 0
    assert (cfg.out / "audit" / "audit.json").exists()


def test_a_failed_run_names_its_seed_and_schedule():
    from dledger.chaos.runner import Summary

    s = Summary(
        5, [{"kind": "kill-leader", "hold_s": 1.2}], {}, {}, [{"name": "x", "ok": False}], 0, 0.0, 1.0
    )
    cfg = RunConfig(Path("g"), Path("o"), seed=5, faults=("kill-leader",))
    assert not s.ok
    assert "--seed 5" in s.reproduce(cfg) and "kill-leader 1.2s" in s.reproduce(cfg)
