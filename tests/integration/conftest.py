"""Fixtures for tests with real node processes on 127.0.0.1 (free ports, one directory per group).

Every process a test starts is stopped in a finalizer by its pid (``group.stop_group`` signals only pids from
the group's own pid files, after checking the process is that node).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger import group as grp
from storage import codec

# Short timeouts keep the suite fast; they are the 150-300 ms election range with a 50 ms heartbeat.


@pytest.fixture
def make_group(tmp_path_factory):
    """Start groups on demand; every one of them is stopped when the test (or module) ends."""
    started: list[grp.GroupSpec] = []

    def make(nodes: int = 3, flush: str = "sync", name: str = "dledger") -> grp.GroupSpec:
        d = tmp_path_factory.mktemp(f"group{nodes}")
        g, _ = grp.up(d, nodes, None, flush=flush, name=name)
        started.append(g)
        return g

    yield make
    for g in started:
        grp.stop_group(g)


def read_log(data_dir: str | Path) -> list[codec.Entry]:
    """Every entry in a node's data files, read straight from disk (docs/formats.md sections 1 and 3)."""
    data = Path(data_dir) / "data"
    out: list[codec.Entry] = []
    prev_chain = None
    for name in sorted(os.listdir(data)):
        if not (len(name) == 20 and name.isdigit()):
            continue
        buf = (data / name).read_bytes()
        off = 0
        while off + 8 <= len(buf):
            magic, size = struct.unpack_from(">ii", buf, off)
            if magic == codec.MAGIC_BLANK:
                break
            if len(buf) - off < size or magic not in codec.ENTRY_MAGICS:
                break  # a torn tail that recovery will cut
            h = codec.validate(buf, off, prev_chain)
            assert h.pos == int(name) + off, f"entry {h.index} claims pos {h.pos} at {int(name) + off}"
            out.append(codec.decode(buf, off))
            prev_chain = h.chain_crc
            off += size
    return out


def wait(cond, timeout_s: float = 15.0, what: str = "condition", group: grp.GroupSpec | None = None):
    """Poll ``cond`` until it returns something truthy (returned) or the deadline passes (AssertionError,
    with the group's status when given, so a failure on a loaded CI machine says where each node stood)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    state = ""
    if group is not None:
        rows = grp.status(group, 2.0)
        state = "; status: " + ", ".join(
            f"{r.id} {r.role} term {r.term} last {r.last_index} commit {r.commit_index}" for r in rows
        )
    raise AssertionError(f"{what} not reached within {timeout_s} s{state}")


def refused_start(config: str) -> str:
    """Run ``dledger node --config`` in the foreground on a node that must refuse to start: it exits 1 with a
    message and no traceback; returns its stderr."""
    r = subprocess.run(
        [sys.executable, "-m", "dledger", "node", "--config", config],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr


def assert_audit_passes(data_dirs: list[str], report_dir: Path, *args: str) -> None:
    """The Spark audit of the nodes' files (integrity, cross-node agreement; docs/audit.md) passes: ``dledger
    audit`` run in this test worker's own process (as tests/rocketmq/test_delivery.py does), so the JVM its first
    audit launches serves the next ones; a subprocess launched one per audit, 10-20 s each. ``args``: more of the
    audit's options (``--ack-log FILE``)."""
    from spark.audit import EXIT_OK, main

    code = main([*data_dirs, *args, "--report", str(report_dir)])
    report = report_dir / "audit.json"
    assert code == EXIT_OK, f"audit exit {code}: " + (
        report.read_text()[-3000:] if report.exists() else "no report"
    )
