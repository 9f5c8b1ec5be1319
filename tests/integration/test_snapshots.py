"""The KV store in real node processes with snapshots and compaction on: kill -9 of the leader and of a follower
under a write workload, ``dledger snapshot`` on demand, a node that comes back behind the compaction point
through InstallSnapshot, and afterwards every acknowledged write present on every node.

"Present" is checked the way a restarting node sees its state: after a clean stop, each node's newest intact
snapshot is loaded into a fresh KV store and its log suffix applied (the same path as ``Node.start``), and
every node must hold every acknowledged key with its value, and the same map as the others.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.client import AsyncDLedgerClient
from dledger.errors import DLedgerError
from statemachine import kv
from statemachine.api import CommittedEntry
from statemachine.snapshot import SnapshotStore
from storage import codec
from storage.filestore import FileLogStore
from tests.integration.conftest import refused_start, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SEGMENT = 16384
RAFT = {"segment_size": SEGMENT, "max_inflight": 2, "max_append_bytes": 1024}
EXTRA_TOML = "\n[limits]\nmax_body_bytes = 4096\n\n[snapshot]\nentries = 150\nkeep = 2\n"


def _wait(cond, timeout_s: float = 20.0, what: str = "condition"):
    return wait(cond, timeout_s, what)


def _state_on_disk(data_dir: Path) -> tuple[dict[bytes, bytes], int, int]:
    """(KV map, snapshot index, log first index) as the node would restore them."""
    store = SnapshotStore(data_dir / "snapshot")
    log = FileLogStore.open(str(data_dir), segment_size=SEGMENT, flush="async")
    try:
        sm = kv.KVStore()
        first = log.first_index
        info = store.latest(usable=lambda s: s.state_machine == "kv" and s.index >= first - 1)
        start = -1
        if info is not None:
            with store.open_data(info) as f:
                sm.load_snapshot(f)
            start = info.index
        lo = start + 1
        while lo <= log.last_index:
            entries = log.entries(lo, log.last_index + 1, 1 << 20)
            sm.apply(
                [
                    CommittedEntry(e.index, e.term, e.pos, e.body)
                    for e in entries
                    if e.magic == codec.MAGIC_NORMAL
                ]
            )
            lo = entries[-1].index + 1
        return dict(sm.items()), start, first
    finally:
        log.close()


async def _workload(addresses: list[str], start: int, n: int, acked: dict[bytes, bytes]) -> int:
    """Unique keys, batches of 5; returns how many batches were refused or had an unknown outcome."""
    failed = 0
    c = AsyncDLedgerClient(addresses, timeout_s=10.0)
    try:
        for i in range(start, start + n, 5):
            batch = {f"key-{k:06d}".encode(): f"value-{k}".encode() * 4 for k in range(i, i + 5)}
            try:
                await c.append_batch([kv.encode_put(k, v) for k, v in batch.items()])
            except DLedgerError:
                failed += 1
                continue
            acked.update(batch)
    finally:
        await c.close()
    return failed


def _kv_group(directory: Path) -> grp.GroupSpec:
    """A KV group with small segments and frequent snapshots (EXTRA_TOML), created but not started."""
    g = grp.create(directory, 3, None, state_machine="kv", raft=RAFT)
    for spec in g.nodes:
        with open(spec.config, "a") as f:
            f.write(EXTRA_TOML)
    return g


def test_kv_survives_kill_9_with_snapshots_and_install(tmp_path):
    g = _kv_group(tmp_path / "g")
    try:
        for spec in g.nodes:
            grp.start_node(spec)
        leader = grp.wait_for_leader(g)
        acked: dict[bytes, bytes] = {}
        asyncio.run(_workload(g.addresses, 0, 300, acked))

        # kill -9 the leader, keep writing through the new one, bring it back.
        killed = g.node(leader.id)
        grp.kill_node(killed)
        new_leader = grp.wait_for_leader(g, exclude=killed.id)
        asyncio.run(_workload(g.addresses, 300, 300, acked))

        # On demand: every running node snapshots (the killed one is reported as unreachable).
        out = subprocess.run(
            [sys.executable, "-m", "dledger", "snapshot", "--dir", str(tmp_path / "g")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1, out.stdout + out.stderr
        assert out.stdout.count("its log starts at") == 2, out.stdout
        assert killed.id in out.stderr

        grp.start_node(killed)
        # A follower is killed too while writes go on; the leader compacts past it meanwhile.
        follower = next(s for s in g.nodes if s.id not in (new_leader.id, killed.id))
        grp.kill_node(follower)
        asyncio.run(_workload(g.addresses, 600, 400, acked))
        grp.start_node(follower)

        def caught_up():
            rows = grp.status(g)
            commits = {r.commit_index for r in rows}
            applied = all(r.applied_index == r.commit_index for r in rows)  # the state machines caught up too
            return (
                len(commits) == 1
                and None not in commits
                and rows[0].last_index == rows[0].commit_index
                and applied
            )

        _wait(caught_up, 30.0, "every node back and caught up")
        out = subprocess.run(
            [sys.executable, "-m", "dledger", "snapshot", "--dir", str(tmp_path / "g")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.count("its log starts at") == 3, out.stdout
        logs = {s.id: (Path(s.data_dir) / "node.log").read_text() for s in g.nodes}
        assert any("installed snapshot of kv" in text for text in logs.values()), (
            "no node came back by install"
        )
    finally:
        grp.stop_group(g)

    assert len(acked) >= 500  # most batches were acknowledged despite the kills
    states = {}
    for spec in g.nodes:
        state, snap_index, first = _state_on_disk(Path(spec.data_dir))
        assert snap_index >= 0 and first > 0, f"{spec.id}: no snapshot/compaction (snapshot {snap_index})"
        missing = [k for k, v in acked.items() if state.get(k) != v]
        assert not missing, f"{spec.id} lost {len(missing)} acknowledged writes, e.g. {missing[:3]}"
        states[spec.id] = state
    assert len({tuple(sorted(s.items())) for s in states.values()}) == 1, "nodes hold different maps"


def test_a_node_whose_snapshots_are_all_corrupt_refuses_to_start(tmp_path):
    """Its log was compacted after the snapshot, so nothing else can rebuild its state: it exits with one line
    naming the snapshot and the checksum mismatch, and never serves the bad state."""
    g = _kv_group(tmp_path / "g")
    try:
        for spec in g.nodes:
            grp.start_node(spec)
        leader = grp.wait_for_leader(g)
        victim = next(s for s in g.nodes if s.id != leader.id)
        acked: dict[bytes, bytes] = {}
        asyncio.run(_workload(g.addresses, 0, 400, acked))
        snapshots = Path(victim.data_dir) / "snapshot"

        def compacted():
            start = Path(victim.data_dir) / "data" / "start.json"
            return (
                list(snapshots.glob("*/data"))
                and start.exists()
                and '"first_index": 0' not in start.read_text()
            )

        _wait(compacted, 30.0, f"{victim.id} to snapshot and compact its log")
        assert grp.stop_node(victim)
        datas = sorted(snapshots.glob("*/data"))
        for path in datas:
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            path.write_bytes(bytes(raw))
        stderr = refused_start(victim.config)
        assert "refuses to start" in stderr and "checksum mismatch" in stderr, stderr
        assert any(str(p.parent) in stderr.replace("\n", "") for p in datas), stderr
    finally:
        grp.stop_group(g)
