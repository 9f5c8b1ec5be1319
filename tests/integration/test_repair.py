"""A node whose log is damaged before its tail: it refuses to start with one line naming the file, the byte
offset and the index (no traceback), ``dledger repair`` refuses while a node holds the directory, truncates
the log of a stopped one, and the node then starts, refills its log from the group and takes new writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import DLedgerClient
from storage import codec
from tests.integration.conftest import read_log, refused_start, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dledger(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dledger", *args], capture_output=True, text=True, timeout=60
    )


def data_file_of(data_dir: str, pos: int) -> Path:
    """The data file holding absolute position ``pos`` (files are named by the position they start at)."""
    files = sorted(p for p in (Path(data_dir) / "data").iterdir() if len(p.name) == 20 and p.name.isdigit())
    return next(p for p in reversed(files) if int(p.name) <= pos)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def committed_everywhere(g: grp.GroupSpec, index: int) -> bool:
    rows = grp.status(g, 0.5)
    return all(r.commit_index is not None and r.commit_index >= index for r in rows)


def test_corrupt_log_is_refused_then_repaired(tmp_path):
    g, _ = grp.up(tmp_path / "g", 3, None)
    try:
        with DLedgerClient(g.addresses, g.name) as c:
            results = c.append_batch([f"entry-{i}".encode() * 20 for i in range(60)])
        top = results[-1].index
        wait(lambda: committed_everywhere(g, top), what="60 entries on every node", group=g)

        # The damaged node is the leader: stopping it gets a new one, whose view of it starts afresh. A leader
        # that saw the node hold entries before they were cut keeps probing after them and ignores its
        # rejections (Raft never moves a match index back), so a repaired follower refills its log only once
        # leadership changes.
        victim_node = g.node(grp.wait_for_leader(g).id)
        assert grp.stop_node(victim_node)
        grp.wait_for_leader(g, exclude=victim_node.id)
        entries = read_log(victim_node.data_dir)
        last = entries[-1].index
        victim = results[5].index  # an early entry with a body, well before the tail
        e = next(e for e in entries if e.index == victim)
        path = data_file_of(victim_node.data_dir, e.pos)
        offset = e.pos - int(path.name)
        flip(path, offset + codec.HEADER_SIZE + 3)  # one bit of its body: body_crc no longer holds

        # The node refuses to start: exit 1, one line with the file, offset, index and the way out.
        stderr = refused_start(victim_node.config)
        line = next((ln for ln in stderr.splitlines() if "error:" in ln), "")
        for part in (str(path), f"offset {offset}", f"index {victim}", "corrupt", "dledger repair --dir"):
            assert part in line, f"{part!r} not in the error line: {stderr}"
        assert str(victim_node.data_dir) in line

        # The group goes on without it.
        with DLedgerClient(g.addresses, g.name) as c:
            top = c.append_batch([b"while it was refused"] * 10)[-1].index

        # repair refuses a directory a running node holds.
        running = next(n for n in g.nodes if n.id != victim_node.id)
        r = dledger("repair", "--dir", running.data_dir)
        assert r.returncode == 1 and "in use by a running node process" in r.stderr, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        assert read_log(running.data_dir)[-1].index >= top, "a refused repair changed nothing"

        # repair of the stopped node cuts its log at the damaged entry and says how much it dropped.
        r = dledger("repair", "--dir", victim_node.data_dir)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"dropped {last - victim + 1} entries from index {victim}" in r.stdout, r.stdout
        assert f"the log now ends at index {victim - 1}" in r.stdout, r.stdout
        assert [x.index for x in read_log(victim_node.data_dir)][-1] == victim - 1

        # The node starts again, refills its log from the group, and a new write commits everywhere.
        grp.start_node(victim_node)
        wait(lambda: committed_everywhere(g, top), what=f"{victim_node.id} refilling its log", group=g)
        with DLedgerClient(g.addresses, g.name) as c:
            after = c.append(b"after the repair").index
        wait(lambda: committed_everywhere(g, after), what="a write after the repair", group=g)
        logs = {n.id: {x.index: x.header.chain_crc for x in read_log(n.data_dir)} for n in g.nodes}
        assert len({log.get(after) for log in logs.values()}) == 1, "every node holds the same log"
        assert sorted(logs[victim_node.id]) == list(range(after + 1)), "the repaired log has no holes"
    finally:
        grp.stop_group(g)


def test_repair_explains_a_directory_without_a_log(tmp_path):
    r = dledger("repair", "--dir", str(tmp_path))
    assert r.returncode == 1 and "no log in" in r.stderr and "data/" in r.stderr, r.stdout + r.stderr
