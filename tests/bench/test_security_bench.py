"""A short run of ``python -m bench.security``: both groups measure both cases and the ratios are printed (no
timing is asserted)."""

from __future__ import annotations

import pytest

from bench import security

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_short_run_prints_both_cases_and_their_ratios(capsys):
    assert security.main(["--seconds", "0.3", "--rounds", "1", "--callers", "4"]) == 0
    out = capsys.readouterr().out
    for case in security.CASES:
        assert f"{case:<8} plain median" in out
    assert out.count("x  (per round") == len(security.CASES)
