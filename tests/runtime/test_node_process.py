"""A node started as ``dledger node`` (a real process, as ``dledger group up`` starts it) runs on uvloop, the
event loop ``dledger.runtime.node.serve`` installs (docs/send-budget.md), and serves appends on it; its gRPC
server uses the classic listener ``dledger.grpc_env`` asks for, unless the environment set GRPC_EXPERIMENTS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import DLedgerClient
from dledger.grpc_env import EXPERIMENTS

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
        assert started and "event loop uvloop, " in started[-1], started
        expected = os.environ.get("GRPC_EXPERIMENTS") or EXPERIMENTS  # a setting of the environment wins
        assert started[-1].endswith(f"gRPC experiments {expected}"), started
    finally:
        grp.stop_group(g)


def _entry_setting(env: dict[str, str], code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def test_the_entry_point_sets_grpc_experiments_before_grpc_is_imported_and_keeps_the_users() -> None:
    """``dledger.__main__`` (``python -m dledger`` and the ``dledger`` script) sets it, and before gRPC is
    imported (which reads it only then: ``prefer_classic_listener`` sets nothing once gRPC is imported, the
    last case); a value the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    show = (
        "import os, sys, dledger.__main__; print(os.environ.get('GRPC_EXPERIMENTS'), 'grpc' in sys.modules)"
    )
    assert _entry_setting(env, show) == f"{EXPERIMENTS} True"
    assert (
        _entry_setting({**env, "GRPC_EXPERIMENTS": "-event_engine_client"}, show)
        == "-event_engine_client True"
    )
    late = (
        "import grpc, os; from dledger.grpc_env import prefer_classic_listener; "
        "print(prefer_classic_listener(), os.environ.get('GRPC_EXPERIMENTS'))"
    )
    assert _entry_setting(env, late) == "False None"


STOPPED_WHILE_STARTING = """
import logging, os, signal, sys
from pathlib import Path
from dledger.nodeconfig import NodeConfig
from dledger.runtime import process
from dledger.runtime.node import Node

start = Node.start


async def start_then_signalled(self):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives while the node is starting (a supervisor, an owner gone)
    await start(self)


Node.start = start_then_signalled
logging.basicConfig(level=logging.INFO)
d = Path(sys.argv[1])
process.serve(NodeConfig("n0", {"n0": sys.argv[2]}, d))
print("stopped cleanly")
"""


def test_a_sigterm_while_the_node_starts_stops_it_cleanly_once_started(tmp_path: Path) -> None:
    """The signal is kept until the node has started, then it stops as SIGTERM stops it (its lock released),
    instead of dying of the signal with its stores half open."""
    (port,) = grp.free_ports(1)
    r = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_STARTING, str(tmp_path / "n0"), f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "stopped cleanly" in r.stdout, (r.returncode, r.stderr[-2000:])
    assert "n0 stopping" in r.stderr and "n0 stopped" in r.stderr, r.stderr[-2000:]
