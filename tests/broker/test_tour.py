"""The README's five-minute tour with real node processes, scaled down: a broker group, produce with an ack log,
``dledger kill-leader`` (which times the failover with a raw append of its own), produce again, consume, restart
the killed node, then ``dledger audit --ack-log``, which must pass: the failover probe is no message."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dledger import group as grp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def dledger(*args: str, timeout_s: float = 60) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "dledger", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert r.returncode == 0, f"dledger {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture
def group_dir(tmp_path):
    d = tmp_path / "tour"
    yield d
    g = grp.load(d, missing_ok=True)
    if g is not None:
        grp.stop_group(g)


def test_tour_kill_leader_then_audit_with_ack_log_passes(group_dir, tmp_path):
    d = str(group_dir)
    ack = str(tmp_path / "ack.jsonl")
    dledger("group", "up", "--dir", d, "--state-machine", "broker", "--base-port", "0")
    dledger("topic", "create", "--dir", d, "--topic", "orders", "--queues", "2")
    produce = ("produce", "--dir", d, "--topic", "orders", "--size", "100", "--batch", "16", "--ack-log", ack)
    assert "acknowledged 200 messages" in dledger(*produce, "--count", "200")

    out = dledger("kill-leader", "--dir", d)
    assert "appends succeed again after" in out
    assert "acknowledged 50 messages" in dledger(*produce, "--count", "50")
    dledger("consume", "--dir", d, "--topic", "orders", "--group", "billing", "--from-beginning", "--quiet")

    dledger("group", "up", "--dir", d)  # restarts the killed node
    g = grp.load(group_dir)
    commit = max(r.commit_index or -1 for r in grp.wait_for_all(g))
    for spec in g.nodes:
        assert grp.wait_caught_up(g, spec.id, commit) is not None, f"{spec.id} did not catch up to {commit}"

    out = dledger("audit", d, "--ack-log", ack, "--report", str(tmp_path / "report"), timeout_s=240)
    assert "audit PASS" in out, out
    report = json.loads((tmp_path / "report" / "audit.json").read_text())
    delivery = next(c for c in report["checks"] if c["name"] == "delivery")
    assert delivery["checked"] >= 250  # ack log records
    # the failover probe (one append, or more if an attempt's outcome was unknown) is named, not judged
    assert any("committed raw entries (not messages) were not judged" in n for n in delivery["notes"]), (
        delivery
    )
