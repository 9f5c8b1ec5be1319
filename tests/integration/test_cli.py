"""The ``dledger`` command line end to end: group up, append, get, watch, kill-leader, status, down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.errors import ConfigError, DLedgerError
from tests.integration.conftest import wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dledger(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "dledger", *args], capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise AssertionError(f"dledger {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def group_dir(tmp_path):
    d = tmp_path / "g"
    yield d
    g = grp.load(d, missing_ok=True)
    if g is not None:
        grp.stop_group(g)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and ") Z" not in stat.read_text()


def test_cli_story(group_dir):
    out = dledger("group", "up", "--dir", str(group_dir), "--base-port", "0").stdout
    assert "is up" in out and "leader" in out
    out = dledger("append", "--dir", str(group_dir), "hello", "world").stdout
    indexes = [int(line.split()[1]) for line in out.splitlines() if line.startswith("index")]
    assert len(indexes) == 2 and indexes[1] == indexes[0] + 1
    out = dledger("get", "--dir", str(group_dir), str(indexes[1])).stdout
    assert "b'world'" in out
    out = dledger("watch", "--dir", str(group_dir), "--duration", "0.5").stdout
    assert "leader" in out and "follower" in out
    out = dledger("kill-leader", "--dir", str(group_dir)).stdout
    assert "new leader" in out and "appends succeed again after" in out
    doc = json.loads(dledger("group", "status", "--dir", str(group_dir), "--json").stdout)
    roles = sorted(n["role"] for n in doc["nodes"])
    assert roles == ["down", "follower", "leader"]
    down = next(n for n in doc["nodes"] if n["role"] == "down")
    assert isinstance(down["pid"], int) and not alive(down["pid"])
    pids = [n["pid"] for n in doc["nodes"] if n["role"] != "down"]
    out = dledger("group", "down", "--dir", str(group_dir)).stdout
    assert "stopped" in out
    assert not any(alive(p) for p in pids), "group down left a node running"
    # SIGTERM is a clean shutdown: each node says so in its log.
    for n in doc["nodes"]:
        if n["role"] != "down":
            assert "stopped" in (Path(n["data_dir"]) / "node.log").read_text()


def test_bad_node_config_is_refused_with_a_clear_message(tmp_path):
    r = dledger(
        "node",
        "--id",
        "n9",
        "--peers",
        "n0=127.0.0.1:1,n1=127.0.0.1:2",
        "--data-dir",
        str(tmp_path),
        check=False,
    )
    assert r.returncode == 2
    assert "n9" in r.stderr and "not among the peers" in r.stderr


def test_status_of_a_missing_group_explains(tmp_path):
    r = dledger("group", "status", "--dir", str(tmp_path / "nothing"), check=False)
    assert r.returncode == 1 and "group up" in r.stderr


def test_group_up_refuses_to_resize_an_existing_group(tmp_path):
    grp.create(tmp_path / "g", 3, None)
    r = dledger("group", "up", "--dir", str(tmp_path / "g"), "--nodes", "5", check=False)
    assert r.returncode == 1 and "has 3 nodes, not 5" in r.stderr


def test_a_preferred_leader_gets_leadership_back_whenever_it_is_healthy(group_dir):
    """``group up --preferred-leader n2``: every node's config names it ([raft] preferred_leader, DLedger's
    preferredLeaderIds), it leads once healthy, another node leads while it is down, and it leads again after
    its restart; a member added later is given the same setting. An id that is not a node is refused."""
    from dledger import group_members

    r = dledger("group", "up", "--dir", str(group_dir), "--preferred-leader", "n7", check=False)
    assert r.returncode == 1 and "'n7' is neither a node of the group (n0..n2) nor 'lowest'" in r.stderr
    dledger("group", "up", "--dir", str(group_dir), "--base-port", "0", "--preferred-leader", "n2")
    g = grp.load(group_dir)
    assert g is not None
    assert all('preferred_leader = "n2"' in Path(n.config).read_text() for n in g.nodes)
    assert group_members._raft_of(g) == {"preferred_leader": "n2"}  # what a new member's config is given

    def leader() -> str | None:
        try:
            return grp.wait_for_leader(g, timeout_s=2).id
        except DLedgerError:
            return None

    wait(lambda: leader() == "n2", 20.0, "n2 leads", group=g)
    grp.kill_node(g.node("n2"))
    wait(lambda: leader() not in (None, "n2"), 20.0, "another node leads", group=g)
    grp.start_node(g.node("n2"))
    wait(lambda: leader() == "n2", 20.0, "n2 leads again", group=g)


def test_the_lowest_preferred_leader_is_the_node_whose_address_sorts_first(tmp_path):
    """``--preferred-leader lowest`` names, in a group and in each group of a cluster, the node whose client
    address sorts first as a string: the node the official RocketMQ Python client dials."""
    from broker_adapter.cluster import local as cl

    def preferred(g: grp.GroupSpec) -> set[str]:
        return {tomllib.loads(Path(n.config).read_text())["raft"]["preferred_leader"] for n in g.nodes}

    g = grp.create(tmp_path / "g", 3, None, preferred_leader="lowest")
    assert preferred(g) == {min(g.nodes, key=lambda n: n.address).id}
    with pytest.raises(ConfigError, match="neither a node of the group"):
        cl.create(tmp_path / "bad", groups=2, nodes=3, preferred_leader="n3")
    assert not (tmp_path / "bad").exists()  # refused before anything is written
    c = cl.create(tmp_path / "c", groups=2, nodes=3, preferred_leader="lowest")
    for name in c.groups:
        member = c.group(name)
        assert preferred(member) == {min(member.nodes, key=lambda n: n.address).id}
