"""A short run of ``python -m bench.clients`` against a real group: every case measures something and the
ratios are printed (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench import clients

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_short_run_prints_every_case_and_ratio(capsys):
    assert clients.main(["--seconds", "0.3", "--rounds", "1", "--callers", "4"]) == 0
    out = capsys.readouterr().out
    for name in clients.CASES:
        assert f"{name:<38} median" in out
    assert out.count("x  (per round") == len(clients.RATIOS)
