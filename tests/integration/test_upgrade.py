"""A rolling upgrade from the previous release (docs/operations.md, "Upgrades"): a group started on the code of
PREVIOUS_RELEASE (exported from this repository's history) holds data, then its nodes are replaced one at a time
by this code while a producer writes; nothing acknowledged is lost and the Spark audit passes on the files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import DLedgerClient
from tests.integration.conftest import assert_audit_passes
from tests.integration.test_membership import Producer, check_nothing_lost

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
# The release before data formats and peer protocol versions were recorded (main at the start of 2026-11-25's
# last session): its nodes send no version and write no format key; this code must take over its files and talk to
# it while the group is half upgraded.
PREVIOUS_RELEASE = "b031e74"


def _export(commit: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True, timeout=60
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return into


def _runs(spec: grp.NodeSpec, code: Path) -> bool:
    pid = grp.read_pid(spec)
    return pid is not None and f"PYTHONPATH={code}".encode() in Path(f"/proc/{pid}/environ").read_bytes()


def test_a_group_of_the_previous_release_upgrades_one_node_at_a_time_under_load(tmp_path):
    old = _export(PREVIOUS_RELEASE, tmp_path / "previous")
    g = grp.create(tmp_path / "g", 3, None, flush="sync")
    for spec in g.nodes:
        grp.start_node(spec, code=old)
    try:
        grp.wait_for_leader(g)
        assert all(_runs(n, old) for n in g.nodes), "the group runs the previous release"
        with DLedgerClient(g.addresses, g.name, timeout_s=30) as c:
            before = {c.append(f"old-{i}".encode()).index: f"old-{i}".encode() for i in range(200)}
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
    assert_audit_passes([n.data_dir for n in g.nodes])
