"""``spark.session.started``: a JVM that exits before reporting its port is launched again, a bounded number of
times; any other error is raised at once (no JVM here: a builder double)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import PySparkRuntimeError

from spark import session


class Builder:
    def __init__(self, failures: list[str]):
        self.failures = failures
        self.calls = 0

    def getOrCreate(self) -> Any:
        self.calls += 1
        if self.failures:
            raise PySparkRuntimeError(errorClass=self.failures.pop(0), messageParameters={})
        return "session"


def test_a_gateway_that_exited_is_launched_again() -> None:
    b = Builder(["JAVA_GATEWAY_EXITED", "JAVA_GATEWAY_EXITED"])
    assert session.started(b, pause_s=0) == "session"  # type: ignore[arg-type]
    assert b.calls == 3


def test_launches_are_bounded_and_other_errors_raised_at_once() -> None:
    b = Builder(["JAVA_GATEWAY_EXITED"] * session.GATEWAY_LAUNCHES)
    with pytest.raises(PySparkRuntimeError, match="JAVA_GATEWAY_EXITED"):
        session.started(b, pause_s=0)  # type: ignore[arg-type]
    assert b.calls == session.GATEWAY_LAUNCHES
    other = Builder(["SESSION_ALREADY_EXIST"])
    with pytest.raises(PySparkRuntimeError):
        session.started(other, pause_s=0)  # type: ignore[arg-type]
    assert other.calls == 1
