"""A real node with small index files (``[storage] index_units_per_file``, docs/storage.md): its log rolls from
one index file to the next, a restart reads entries through both, and a restart with another size is refused
with the file named in node.log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import DLedgerClient
from dledger.nodeconfig import INDEX_UNITS_ENV
from storage.segments import list_segments
from tests.integration.conftest import wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

UNITS = 1024  # 32 KiB index files: 1,100 entries need two


def test_a_node_rolls_to_the_next_index_file_and_a_restart_reads_both(tmp_path, monkeypatch):
    monkeypatch.setenv(INDEX_UNITS_ENV, str(UNITS))  # the node process inherits it (tests/conftest.py)
    g, _ = grp.up(tmp_path / "g", 1, None)
    node = g.nodes[0]
    try:
        bodies: dict[int, bytes] = {}  # log index -> body (the leader's own entries come first)
        with DLedgerClient(g.addresses) as c:
            for k in range(0, 1100, 100):
                batch = [f"entry {i}".encode() for i in range(k, k + 100)]
                bodies.update((r.index, b) for r, b in zip(c.append_batch(batch), batch, strict=True))
        grp.stop_group(g)
        index_dir = Path(node.data_dir) / "index"
        files = [(base, os.path.getsize(p)) for base, p in list_segments(str(index_dir))]
        assert files == [(0, UNITS * 32), (UNITS * 32, UNITS * 32)]

        g, _ = grp.up(tmp_path / "g")
        with DLedgerClient(g.addresses) as c:
            assert min(bodies) < UNITS - 1 and max(bodies) > UNITS
            for i in (min(bodies), UNITS - 1, UNITS, max(bodies)):  # the ends of both files' units
                assert c.get(i).body == bodies[i]
        grp.stop_group(g)

        # The same node told to use 2,048 units a file: its second file cannot start at byte 32768 then.
        toml = Path(node.config)
        toml.write_text(toml.read_text() + "\n[storage]\nindex_units_per_file = 2048\n")
        pid = grp.start_node(node)
        wait(lambda: not grp.is_running(node, pid), what="the node to refuse to start")
        log = (Path(node.data_dir) / "node.log").read_text()
        assert str(index_dir / "00000000000000032768") in log, log[-2000:]
        assert "index_units_per_file = 1024" in log and "not this node's 2048" in log, log[-2000:]
    finally:
        grp.stop_group(g)
