"""``bench.broker_path`` runs every step on real messages and prints one figure per step (docs/send-budget.md)."""

from __future__ import annotations

import pytest

from bench import broker_path


def test_broker_path_prints_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert broker_path.main(["--messages", "600", "--rounds", "1"]) == 0
    figures = capsys.readouterr().out.splitlines()[-1].split("  ")
    steps = dict(f.rsplit(" ", 1) for f in figures)
    assert list(steps) == [
        "client encode",
        "leader check",
        "leader place",
        "leader apply",
        "follower apply",
        "total",
    ]
    assert all(float(v) > 0 for v in steps.values())
    parts = [float(v) for k, v in steps.items() if k != "total"]
    # Each figure is printed rounded to 0.01: six rounded terms and the rounded total differ by 0.035 at most.
    assert float(steps["total"]) == pytest.approx(sum(parts) + parts[-1], abs=0.035)
