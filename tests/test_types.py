"""``mypy --strict`` over the strictly typed packages (``[tool.mypy] files`` in pyproject.toml), exactly as
``make lint`` runs it: CI runs ``make test``, so this is where the type checker runs in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_is_clean() -> None:  # mypy is in the test extra (make install)
    # The incremental cache (.mypy_cache under the repository) makes a run after a small change take seconds.
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, f"mypy --strict found errors:\n{report}"
    assert "Success: no issues found" in report, report
