"""Snapshots through the node, in process (real nodes, real gRPC, real file stores in tmp directories):

- the policy takes a snapshot after ``snapshot_entries`` applied entries and compacts the log before it; reads
  below the new first index get a clear "compacted" error;
- a restarted node loads its snapshot and replays the log suffix: its state equals the others';
- a follower that was down while the leader compacted comes back through InstallSnapshot (data streamed in
  chunks, verified, loaded);
- a corrupt snapshot is never loaded: with no older usable one, the node refuses to start and names the file;
- an interrupted or corrupted install leaves the follower exactly as it was;
- a read through the read index on a deposed (partitioned) leader never returns stale data.

Small segments (4 KiB) make compaction delete whole segments after a few dozen entries.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import AsyncIterator

import pytest

from dledger.core.config import RaftConfig
from dledger.core.membership import ConfCheckpoint
from dledger.core.messages import InstallSnapshot, Role, SnapshotMeta
from dledger.errors import (
    ConfigError,
    DLedgerError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
)
from dledger.nodeconfig import NodeConfig
from dledger.nodeconfig import load as load_config
from dledger.runtime.datadir import CONF_CHECKPOINT_KEY
from dledger.runtime.node import Node
from dledger.transport.base import PeerUnreachableError, SnapshotChunk
from statemachine import kv
from statemachine.snapshot import DATA, META, SnapshotCorruptError, SnapshotInfo
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(90)

SEGMENT = 4096
# A small replication cache (max_inflight * max_append_bytes) so the leader cannot serve compacted entries
# from memory and must send a snapshot.
RAFT = RaftConfig(segment_size=SEGMENT, max_inflight=2, max_append_bytes=1024)
SNAP = {"snapshot_entries": 40, "max_body_bytes": 1024}


def _file_stores(pid):
    return None, None  # the node opens a FileLogStore and an LMDB meta store in its data_dir


def _group(tmp_path, **cfg):
    return LocalGroup(
        tmp_path, stores=_file_stores, state_machine=lambda pid: kv.KVStore(), raft=RAFT, **{**SNAP, **cfg}
    )


def _kv(node: Node) -> dict[bytes, bytes]:
    return dict(node.state_machine.items())


async def _put(leader: Node, start: int, n: int, batch: int = 10) -> dict[bytes, bytes]:
    want = {}
    for i in range(start, start + n, batch):
        bodies = []
        for k in range(i, min(i + batch, start + n)):
            key, value = f"k{k % 37}".encode(), f"v{k}".encode() * 3
            want[key] = value
            bodies.append(kv.encode_put(key, value))
        out = await leader.submit(bodies)
        assert all(not isinstance(o, BaseException) for o in out), out
    return want


async def _put_to_leader(g: LocalGroup, start: int, n: int, batch: int = 10) -> dict[bytes, bytes]:
    """``_put`` to whichever node leads, each batch sent again when its leader stepped down with it in flight
    (check-quorum on a loaded machine). Puts of fixed values in order: a batch applied twice changes nothing."""
    want = {}
    for i in range(start, start + n, batch):
        for _attempt in range(10):
            leader = await g.leader()
            try:
                want.update(await _put(leader, i, min(batch, start + n - i), batch))
                break
            except (NotLeaderError, OutcomeUnknownError):
                continue
        else:
            raise AssertionError(f"batch {i} not applied: the leader kept stepping down")
    return want


async def _restart(g: LocalGroup, pid: str, **kw) -> Node:
    old = g.nodes[pid]
    node = Node(old.config, rng=random.Random(7), state_machine=kv.KVStore(), **kw)
    g.nodes[pid] = node
    await node.start()
    return node


def _applied(g: LocalGroup) -> int:
    return max(n.metadata().applied_index for n in g.nodes.values() if n.core is not None)


def test_policy_snapshot_compacts_and_restart_loads_snapshot_plus_suffix(tmp_path):
    async def run():
        g = _group(tmp_path)
        try:
            await g.start()
            leader = await g.leader()
            want = await _put(leader, 0, 150)
            # Compaction follows each snapshot on the node's I/O thread: wait for both, and for no snapshot to be in
            # progress (one being published holds keep + 1 snapshots on disk until it prunes the oldest).
            await g.until(
                lambda: all(
                    n.stats["snapshots_taken"] >= 2
                    and n.log_store.first_index > 0
                    and not n.snapshot_in_progress
                    for n in g.nodes.values()
                ),
                what="snapshots and compaction",
            )
            for n in g.nodes.values():
                infos = n.snapshots.infos()
                assert 1 <= len(infos) <= n.config.snapshot_keep
                assert infos[-1].state_machine == "kv" and infos[-1].index >= 40
                # Compaction moved the log's start to just after a snapshot, and whole segments went away.
                first = n.log_store.first_index
                assert first > 0 and any(i.index == first - 1 for i in infos)
                # The configurations through the newest snapshot, so a restart reads the log only after it.
                checkpoint = n._data.meta_store.get(CONF_CHECKPOINT_KEY)
                assert checkpoint is not None and ConfCheckpoint.decode(checkpoint).index == infos[-1].index
            first = leader.log_store.first_index
            with pytest.raises(NotFoundError, match="compacted"):
                leader.get(first - 1)
            assert leader.get(first).index == first

            # A follower restarts: snapshot + log suffix, then catches up with what was written meanwhile.
            pid = next(p for p, n in g.nodes.items() if n is not leader)
            await g.nodes[pid].stop()
            want.update(await _put(leader, 150, 25))
            node = await _restart(g, pid)
            assert node.metadata().applied_index >= node.snapshots.infos()[-1].index
            target = leader.metadata().applied_index
            await g.until(lambda: node.metadata().applied_index >= target, what="restarted node catches up")
            assert _kv(node) == _kv(leader) == want
        finally:
            await g.stop()

    asyncio.run(run())


def test_follower_down_while_leader_compacts_comes_back_by_install_snapshot(tmp_path):
    async def run():
        g = _group(tmp_path)
        try:
            await g.start()
            want = await _put_to_leader(g, 0, 10)
            leader = await g.leader()
            pid = next(p for p, n in g.nodes.items() if n is not leader)
            await g.until(lambda: g.nodes[pid].metadata().applied_index >= 9, what="follower applied")
            await g.nodes[pid].stop()
            want.update(await _put_to_leader(g, 10, 200))
            await g.until(
                lambda: leader.log_store.first_index > 20, what="leader compacted past the follower"
            )
            node = await _restart(g, pid)
            await g.until(lambda: node.stats["snapshots_installed"] >= 1, what="snapshot installed")
            target = (await g.leader()).metadata().applied_index
            await g.until(
                lambda: node.metadata().applied_index >= target, what="installed follower catches up"
            )
            assert _kv(node) == want
            # Its log restarts after the snapshot: the data is loaded first, then the core persists the reset
            # (peers.handle_snapshot, ready_loop.persist), so the log's start can move a little later.
            await g.until(
                lambda: node.log_store.first_index > 20, what="its log restarted after the snapshot"
            )
            # And it keeps following from the log afterwards.
            want.update(await _put_to_leader(g, 210, 20))
            target = (await g.leader()).metadata().applied_index
            await g.until(lambda: node.metadata().applied_index >= target, what="follows the log again")
            assert _kv(node) == want
        finally:
            await g.stop()

    asyncio.run(run())


def test_corrupt_snapshot_without_a_usable_older_one_is_refused(tmp_path):
    async def run():
        g = _group(tmp_path)
        try:
            await g.start()
            leader = await g.leader()
            await _put(leader, 0, 100)
            top = leader.metadata().applied_index
            pid = next(p for p, n in g.nodes.items() if n is not leader)
            node = g.nodes[pid]
            # Everything applied (no snapshot is still to come) and the newest one compacted the log: then the
            # older snapshot, if any, is not usable (the log does not continue from it).
            await g.until(
                lambda: (
                    node.metadata().applied_index >= top
                    and node.snapshots.infos()
                    and node.log_store.first_index == node.snapshots.infos()[-1].index + 1
                    and not node.snapshot_in_progress  # no snapshot (or its compaction) in progress
                ),
                what="follower snapshot and compaction",
            )
            await node.stop()
            newest = node.snapshots.infos()[-1]
            path = node.snapshots.root / newest.dirname / DATA
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            path.write_bytes(bytes(raw))
            fresh = Node(node.config, rng=random.Random(3), state_machine=kv.KVStore())
            with pytest.raises(SnapshotCorruptError, match="checksum mismatch") as err:
                await fresh.start()
            assert str(path) in str(err.value)
            await fresh.stop()
        finally:
            await g.stop()

    asyncio.run(run())


def test_corrupt_newest_snapshot_falls_back_to_an_older_one_the_log_continues(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dledger.runtime")

    async def run():
        g = _group(tmp_path)
        try:
            await g.start()
            leader = await g.leader()
            pid = next(p for p, n in g.nodes.items() if n is not leader)
            node = g.nodes[pid]
            # This follower snapshots but never compacts (as after a crash between the two), so its log still
            # continues from the older snapshot.
            node.log_store.compact_prefix = lambda index: None
            want = await _put(leader, 0, 100)
            await g.until(lambda: len(node.snapshots.infos()) == 2, what="two snapshots on the follower")
            await g.until(
                lambda: node.metadata().applied_index >= leader.metadata().commit_index, what="applied"
            )
            await node.stop()
            older, newest = node.snapshots.infos()
            path = node.snapshots.root / newest.dirname / DATA
            path.write_bytes(path.read_bytes()[:-1])  # truncated: the size and checksum no longer match
            fresh = await _restart(g, pid)
            assert fresh.log_store.first_index == 0
            target = leader.metadata().applied_index
            await g.until(lambda: fresh.metadata().applied_index >= target, what="caught up after fallback")
            assert _kv(fresh) == want
            assert fresh.stats["snapshots_installed"] == 0
            assert f"{pid} restored kv from snapshot at index {older.index}" in caplog.text
        finally:
            await g.stop()

    asyncio.run(run())


async def _stream(info: SnapshotInfo, data: bytes, *, cut: int | None = None) -> AsyncIterator[SnapshotChunk]:
    yield SnapshotChunk(META, 0, info.to_json())
    end = len(data) if cut is None else cut
    step = 64
    for off in range(0, end, step):
        piece = data[off : min(off + step, end)]
        yield SnapshotChunk(DATA, off, piece, cut is None and off + len(piece) >= len(data))
    if cut is not None:
        raise ConnectionResetError("the leader went away mid-transfer")


def test_interrupted_or_corrupt_install_leaves_the_follower_as_it_was(tmp_path):
    async def run():
        g = _group(tmp_path, snapshot_entries=100_000)
        try:
            await g.start()
            leader = await g.leader()
            await _put(leader, 0, 10)
            pid = next(p for p, n in g.nodes.items() if n is not leader)
            follower = g.nodes[pid]
            await g.until(lambda: follower.metadata().applied_index >= 9, what="follower applied")
            await follower.stop()
            await _put(leader, 10, 60)
            info = await leader.take_snapshot()
            assert info is not None and info.index > 60
            data = b"".join(leader.snapshots.chunks(info))
            # Restart the follower cut off from the group, so only this test's streams reach it.
            follower = await _restart(g, pid, serve=False)
            follower.transport.deliver = _unreachable
            follower.transport.call = _unreachable
            before = (_kv(follower), follower.metadata().applied_index, follower.log_store.last_index)
            snaps_before = follower.snapshots.infos()
            meta = SnapshotMeta(info.index, info.term, info.chain_crc, info.end_pos)
            msg = InstallSnapshot(leader.core.term, leader.id, pid, meta)

            def unchanged():
                assert (
                    _kv(follower),
                    follower.metadata().applied_index,
                    follower.log_store.last_index,
                ) == before
                assert follower.snapshots.infos() == snaps_before
                assert not [p for p in follower.snapshots.root.iterdir() if p.name.startswith(".tmp-")]

            with pytest.raises(ConnectionResetError):
                await follower.handle_snapshot(msg, _stream(info, data, cut=len(data) // 2))
            unchanged()
            bad = bytearray(data)
            bad[-1] ^= 0x01
            with pytest.raises(InvalidRequestError, match="checksum"):
                await follower.handle_snapshot(msg, _stream(info, bytes(bad)))
            unchanged()
            with pytest.raises(InvalidRequestError, match="runs 'kv'"):
                other = SnapshotInfo(**{**_fields(info), "state_machine": "counter"})
                await follower.handle_snapshot(msg, _stream(other, data))
            unchanged()

            replies = await follower.handle_snapshot(msg, _stream(info, data))
            assert replies and replies[0].success and replies[0].match_index == info.index
            assert follower.metadata().applied_index == info.index
            assert _kv(follower) == _kv(leader)
            assert follower.snapshots.infos()[-1] == info
            await g.until(lambda: follower.log_store.first_index == info.index + 1, what="log reset")
        finally:
            await g.stop()

    asyncio.run(run())


async def _unreachable(*a, **kw):
    raise PeerUnreachableError("?", "?", "cut off by the test")


def _fields(info: SnapshotInfo) -> dict:
    return {f: getattr(info, f) for f in SnapshotInfo.__slots__}


def test_read_index_on_a_deposed_leader_never_returns_stale_data(tmp_path):
    async def run():
        g = LocalGroup(tmp_path, state_machine=lambda pid: kv.KVStore())
        try:
            await g.start()
            old = await g.leader()
            await old.submit([kv.encode_put(b"k", b"old")])
            assert await old.linearizable_read(lambda s: s.get(b"k")) == b"old"

            # Partition the leader: nothing it sends arrives, nothing sent to it is handled.
            async def refuse(*a, **kw):
                raise DLedgerError("partitioned by the test")

            old.transport.deliver = _unreachable
            old.transport.call = _unreachable
            old.transport.install_snapshot = _unreachable
            old.handle_message = refuse
            old.handle_batch = refuse
            others = [n for n in g.nodes.values() if n is not old]

            async def new_leader():
                await g.until(
                    lambda: any(n.core.role is Role.LEADER for n in others),
                    what="a new leader among the others",
                )
                return next(n for n in others if n.core.role is Role.LEADER)

            new = await new_leader()
            await new.submit([kv.encode_put(b"k", b"new")])
            # The old leader's local state still says "old"; a linearizable read must not return it.
            assert old.state_machine.get(b"k") == b"old"
            with pytest.raises(DLedgerError) as err:
                await old.linearizable_read(lambda s: s.get(b"k"))
            assert err.value.retriable
            assert await new.linearizable_read(lambda s: s.get(b"k")) == b"new"
        finally:
            await g.stop()

    asyncio.run(run())


class _FailingSave(kv.KVStore):
    def save_snapshot(self, writer):
        raise OSError("disk says no")


def test_a_failing_snapshot_keeps_the_log_and_is_retried_one_interval_later(tmp_path):
    async def run():
        g = LocalGroup(
            tmp_path, stores=_file_stores, state_machine=lambda pid: _FailingSave(), raft=RAFT, **SNAP
        )
        try:
            await g.start()
            leader = await g.leader()
            await _put(leader, 0, 50)
            await g.until(lambda: leader.stats["snapshot_failures"] == 1, what="first failure")
            await _put(leader, 50, 20)  # less than one interval (40) later: no retry yet
            assert leader.stats["snapshot_failures"] == 1
            await _put(leader, 70, 30)
            await g.until(lambda: leader.stats["snapshot_failures"] == 2, what="retry one interval later")
            assert leader.log_store.first_index == 0 and leader.snapshots.infos() == []
            assert all(n.failure is None for n in g.nodes.values())
            assert await leader.linearizable_read(lambda s: s.get(b"k5")) == b"v79" * 3
        finally:
            await g.stop()

    asyncio.run(run())


class _Durable(kv.KVStore):
    """A machine whose snapshot needs work made durable first (as the broker's ConsumeQueue files): records the
    thread that work ran on and how many snapshots were published when it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.node: Node | None = None
        self.runs: list[tuple[bool, int]] = []  # (off the loop's thread, snapshots published then)

    def prepare_snapshot(self):
        loop_thread = threading.current_thread()

        def sync() -> None:
            published = len(self.node.snapshots.infos()) if self.node is not None else 0
            self.runs.append((threading.current_thread() is not loop_thread, published))

        return sync


def test_a_machine_s_snapshot_work_runs_off_the_loop_before_the_snapshot_is_published(tmp_path):
    async def run():
        g = LocalGroup(tmp_path, stores=_file_stores, state_machine=lambda pid: _Durable(), raft=RAFT, **SNAP)
        try:
            for n in g.nodes.values():
                n.state_machine.node = n
            await g.start()
            leader = await g.leader()
            await _put(leader, 0, 100)
            await g.until(lambda: leader.stats["snapshots_taken"] >= 2, what="two snapshots")
            runs = leader.state_machine.runs
            assert len(runs) >= 2 and all(off for off, _ in runs)
            assert [published for _, published in runs[:2]] == [0, 1]  # each before its own snapshot's file
        finally:
            await g.stop()

    asyncio.run(run())


def test_snapshot_settings_are_validated(tmp_path):
    peers = {"n0": "127.0.0.1:20911"}
    with pytest.raises(ConfigError, match="entries must be an integer >= 1"):
        NodeConfig("n0", peers, tmp_path, snapshot_entries=0)
    with pytest.raises(ConfigError, match="keep"):
        NodeConfig("n0", peers, tmp_path, snapshot_keep=0)
    f = tmp_path / "n.toml"
    f.write_text(
        'id = "n0"\ndata_dir = "d"\n[peers]\nn0 = "127.0.0.1:20911"\n[snapshot]\nentries = 7\nbytes = 9\n'
    )
    cfg = load_config(f)
    assert (cfg.snapshot_entries, cfg.snapshot_bytes, cfg.snapshot_keep) == (7, 9, 2)
    f.write_text('id = "n0"\ndata_dir = "d"\n[peers]\nn0 = "127.0.0.1:20911"\n[snapshot]\nevery = 7\n')
    with pytest.raises(ConfigError, match="unknown keys"):
        load_config(f)
