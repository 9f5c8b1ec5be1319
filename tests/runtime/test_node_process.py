"""A node started as ``dledger node`` (a real process, as ``dledger group up`` starts it) runs on uvloop, the
event loop ``dledger.runtime.node.serve`` installs (docs/send-budget.md), and serves appends on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import DLedgerClient

pytestmark = pytest.mark.timeout(120)


def test_a_node_process_runs_on_uvloop_and_serves(tmp_path: Path) -> None:
    g = grp.create(tmp_path / "g", 1, None)
    try:
        for n in g.nodes:
            grp.start_node(n)
        leader = grp.wait_for_leader(g, timeout_s=30)
        with DLedgerClient([leader.address]) as c:
            run = c.append(b"on uvloop")
        assert run.index >= 0
        started = [
            line
            for line in (Path(g.nodes[0].data_dir) / "node.log").read_text().splitlines()
            if " started: " in line
        ]
        assert started and started[-1].endswith("event loop uvloop"), started
    finally:
        grp.stop_group(g)
