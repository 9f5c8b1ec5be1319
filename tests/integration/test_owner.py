"""``DLEDGER_OWNER_PID`` (dledger/owner.py): the nodes of a group stop, cleanly, when the process that owns them
is killed, instead of running on unowned in their own sessions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger import group as grp
from dledger import owner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_group_stops_cleanly_when_its_owner_is_killed_and_starts_again(tmp_path, monkeypatch):
    g = grp.create(tmp_path / "g", 3, None, flush="sync")
    owner_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    monkeypatch.setenv(owner.OWNER_ENV, str(owner_proc.pid))
    pids: list[int] = []
    try:
        pids = [grp.start_node(n) for n in g.nodes]
        grp.wait_for_leader(g)
        # every node serving: a node still importing when its owner goes dies of the SIGTERM before it has
        # anything to stop (make test saw exit -15 once); one already starting stops as soon as it has started
        assert all(r.role != "down" for r in grp.wait_for_all(g, timeout_s=30))
        owner_proc.kill()
        owner_proc.wait()
        exits: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(exits) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in exits:
                    done, status = os.waitpid(pid, os.WNOHANG)  # our children: posix_spawn from here
                    if done == pid:
                        exits[pid] = os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        assert len(exits) == len(pids), "a node outlived its owner"
        assert set(exits.values()) == {0}, exits  # stopped as by SIGTERM, not ended hard after the grace
        for n in g.nodes:
            text = (Path(n.data_dir) / "node.log").read_text()
            assert f"the process that owns this one (pid {owner_proc.pid}" in text
        # A clean stop released each node's lock and left its log whole: the group starts again, without an
        # owner, and serves.
        monkeypatch.delenv(owner.OWNER_ENV)
        pids = [grp.start_node(n) for n in g.nodes]
        grp.wait_for_leader(g)
    finally:
        owner_proc.kill()
        grp.stop_group(g)


def test_an_owner_that_is_not_a_pid_is_refused_and_none_is_not_watched():
    assert owner.watch({}) is None
    with pytest.raises(SystemExit, match="DLEDGER_OWNER_PID='n0' is not a process id"):
        owner.watch({owner.OWNER_ENV: "n0"})
    assert owner.alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while owner.alive(child.pid) and time.monotonic() < deadline:  # a zombie, not yet reaped, is not alive
        time.sleep(0.01)
    assert not owner.alive(child.pid)
    child.wait()
    assert not owner.alive(child.pid)
