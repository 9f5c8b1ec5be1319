"""One Spark session for all audit tests (starting one costs 5-10 s on this machine)."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.fail("Java 17 is required for the Spark audit tests (install openjdk-17-jre-headless)")
    from spark.session import build_session

    session = build_session("local[2]")
    try:
        yield session
    finally:
        session.stop()
