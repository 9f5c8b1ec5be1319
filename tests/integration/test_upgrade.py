"""A rolling upgrade from the previous release (docs/operations.md, "Upgrades"): a group started on
PREVIOUS_RELEASE, installed into its own venv from this repository's history, holds data, then its nodes are
replaced one at a time by this code while a producer writes; nothing acknowledged is lost and the Spark audit
passes on the files."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import DLedgerClient
from dledger.errors import OutcomeUnknownError
from tests.integration.conftest import assert_audit_passes
from tests.integration.test_membership import Producer, check_nothing_lost

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# The release before data formats and peer protocol versions were recorded (main at the start of 2026-11-25's
# last session): its nodes send no version and write no format key; this code must take over its files and talk to
# it while the group is half upgraded.
PREVIOUS_RELEASE = "b031e74"
# Each release's venv, built once per commit and reused (var/ is git-ignored): pip's cache makes a rebuild quick,
# but not free.
VENVS = ROOT / "var" / "cache" / "release-venvs"


def _export(commit: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True, timeout=60
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return into


def release_venv(commit: str, scratch: Path) -> Path:
    """The interpreter of a venv holding the release at ``commit`` as a user would install it: ``python -m
    venv``, then ``pip install`` of the tree exported from this repository's history, with that release's own
    pinned dependencies. Built once per commit under VENVS (a lock keeps two test runs from building it
    together; ``.installed`` is written last, so a half-built venv is built again)."""
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", commit], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    venv = VENVS / full
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f"{full}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".installed").exists():
            shutil.rmtree(venv, ignore_errors=True)
            tree = _export(commit, scratch / f"release-{full[:12]}")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
            t0 = time.monotonic()
            pip = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(tree)],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
            print(f"\nbuilt the venv of {commit} in {time.monotonic() - t0:.0f} s: {venv}")
            (venv / ".installed").write_text(f"{full}\n")
    return venv / "bin" / "python"


def _imports_from(python: Path) -> str:
    """Where that interpreter imports ``dledger`` from, run as the nodes run (PYTHONSAFEPATH, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [str(python), "-c", "import dledger; print(dledger.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    ).stdout.strip()


def _runs(spec: grp.NodeSpec, python: Path) -> bool:
    pid = grp.read_pid(spec)
    if pid is None:
        return False
    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    return argv0 == str(python).encode()


def test_a_group_of_the_previous_release_upgrades_one_node_at_a_time_under_load(tmp_path):
    old = release_venv(PREVIOUS_RELEASE, tmp_path)
    installed = _imports_from(old)
    assert installed.startswith(str(old.parent.parent)), f"the release's venv imports {installed}"
    g = grp.create(tmp_path / "g", 3, None, flush="sync")
    for spec in g.nodes:
        grp.start_node(spec, python=old)
    try:
        grp.wait_for_leader(g)
        assert all(_runs(n, old) for n in g.nodes), "the group runs the previous release"
        before: dict[int, bytes] = {}
        with DLedgerClient(g.addresses, g.name, timeout_s=30) as c:
            for i in range(200):  # an append whose leader steps down under it (a loaded machine): not checked
                body = f"old-{i}".encode()
                with contextlib.suppress(OutcomeUnknownError):
                    before[c.append(body).index] = body
        p = Producer(g).start()
        try:
            for spec in g.nodes:  # the leader too, in its turn
                p.wait_for(100, f"appends before upgrading {spec.id}")
                grp.stop_node(spec)
                p.wait_for(50, f"appends while {spec.id} is down")
                grp.start_node(spec)  # this code, on the same directory
                assert not _runs(spec, old)
                top = max(p.acked)
                assert grp.wait_caught_up(g, spec.id, top, timeout_s=60) is not None, f"{spec.id} catches up"
            p.wait_for(100, "appends on the upgraded group")
        finally:
            p.stop()
        check_nothing_lost(g, {**before, **p.acked})
        print(f"\nupgraded 3 nodes under load: {len(p.acked)} acknowledged, {p.unknown} outcome unknown")
    finally:
        grp.stop_group(g)
    assert_audit_passes([n.data_dir for n in g.nodes], tmp_path / "audit-report")
