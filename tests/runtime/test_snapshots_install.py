"""The snapshots piece alone (memory log stores, snapshot files in a temporary directory, no node, no gRPC):
take a snapshot and compact, stream it, install it into another piece, refuse what does not fit."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import replace

import pytest

from dledger.core.messages import InstallSnapshot, SnapshotMeta
from dledger.errors import InvalidRequestError
from dledger.nodeconfig import NodeConfig
from dledger.runtime.iothread import IoThread
from dledger.runtime.snapshots import Snapshots
from statemachine import kv
from statemachine.apply_loop import ApplyLoop
from statemachine.snapshot import DATA
from storage.memory import MemoryLogStore
from tests.statemachine.test_apply_loop import _append

pytestmark = pytest.mark.timeout(30)
PEERS = {"n0": "127.0.0.1:7000", "n1": "127.0.0.1:7001"}


class Piece:
    """A ``Snapshots`` with its own log, KV store and apply loop, as a node would wire it."""

    def __init__(self, tmp, node_id: str):
        self.config = NodeConfig(
            node_id, PEERS, tmp / node_id, snapshot_entries=10**9, snapshot_bytes=1 << 40
        )
        self.log = MemoryLogStore()
        self.sm = kv.KVStore()
        self.io = IoThread(node_id)
        self.stats = collections.Counter()
        self.installed: list[int] = []
        self.snapshots = Snapshots(
            node_id,
            self.config,
            self.sm,
            self.io,
            stats=self.stats,
            on_installed=self.installed.append,
            closing=lambda: False,
        )
        assert self.snapshots.restore(self.log) == -1, "nothing to restore in a fresh directory"
        self.apply = ApplyLoop(self.sm, self.log, -1)
        self.snapshots.attach(self.log, self.apply)

    def close(self) -> None:
        self.io.shutdown(wait=True)
        self.snapshots.shutdown(wait=True)


def _source(tmp) -> Piece:
    src = Piece(tmp, "n0")
    _append(src.log, [kv.encode_put(b"k%d" % i, b"v%d" % i) for i in range(20)], term=3)
    src.apply.commit_advanced(19)
    while src.apply.apply_available():
        pass
    return src


def test_take_compacts_the_log_and_install_loads_the_state_elsewhere(tmp_path):
    async def run():
        src, dst = _source(tmp_path), Piece(tmp_path, "n1")
        try:
            info = await src.snapshots.take()
            assert (info.index, info.term, info.state_machine) == (19, 3, "kv")
            assert src.log.first_index == 20, "the log before the snapshot was compacted"
            assert await src.snapshots.take() is None, "nothing applied since: no new snapshot"
            out_msg, chunks = await src.snapshots.outgoing(
                InstallSnapshot(3, "n0", "n1", SnapshotMeta(0, 0, 0, 0))
            )
            assert out_msg.snapshot == SnapshotMeta(info.index, info.term, info.chain_crc, info.end_pos)
            assert await dst.snapshots.install(out_msg, chunks, term=3) is True
            assert dict(dst.sm.items()) == dict(src.sm.items()) and len(dst.sm) == 20
            assert dst.apply.applied_index == 19 and dst.installed == [19]
            assert dst.stats["snapshots_installed"] == 1
            assert [i.index for i in dst.snapshots.store.infos()] == [19], "published in the receiver's store"
            # The same snapshot again is not needed: nothing changes.
            _, again = await src.snapshots.outgoing(out_msg)
            assert await dst.snapshots.install(out_msg, again, term=3) is False
            assert dst.installed == [19]
        finally:
            src.close()
            dst.close()

    asyncio.run(run())


def test_a_broken_or_stale_transfer_leaves_the_receiver_as_it_was(tmp_path):
    async def run():
        src, dst = _source(tmp_path), Piece(tmp_path, "n1")
        try:
            info = await src.snapshots.take()
            msg = InstallSnapshot(
                3, "n0", "n1", SnapshotMeta(info.index, info.term, info.chain_crc, info.end_pos)
            )

            async def truncated():
                async for c in src.snapshots.stream(info):
                    if c.file == DATA:
                        yield replace(c, data=c.data[:-1], last=False)
                        return
                    yield c

            with pytest.raises(InvalidRequestError, match="stream ended"):
                await dst.snapshots.install(msg, truncated(), term=3)
            stale = await dst.snapshots.install(msg, src.snapshots.stream(info), term=4)
            assert stale is False, "a sender behind the receiver's term is ignored"
            wrong = replace(msg, snapshot=replace(msg.snapshot, index=18))
            with pytest.raises(InvalidRequestError, match="does not match"):
                await dst.snapshots.install(wrong, src.snapshots.stream(info), term=3)
            assert len(dst.sm) == 0 and dst.apply.applied_index == -1 and dst.installed == []
            assert dst.snapshots.store.infos() == []
        finally:
            src.close()
            dst.close()

    asyncio.run(run())


def test_an_idle_node_still_compacts_to_a_retention_floor_that_moved(tmp_path):
    """A retention floor may move with no entry applied (``retain_from`` limits its own rate, so the newest one
    can come after the group's last write): ``recheck`` asks again, so the log still reaches the policy."""

    async def run():
        src = _source(tmp_path)
        floor = [None]
        src.sm.retain_from = lambda: floor[0]  # the state machine's policy, as the broker's would answer
        try:
            src.snapshots.maybe_snapshot()
            assert src.snapshots.task is None and src.log.first_index == 0, "no policy: nothing to do"
            floor[0] = 12  # decided after the last apply chunk: nothing applied will ask again
            checking = asyncio.create_task(src.snapshots.recheck(interval_s=0.01))
            for _ in range(500):
                if src.log.first_index == 12:
                    break
                await asyncio.sleep(0.01)
            assert src.log.first_index == 12, "the log was compacted up to the floor, and no further"
            assert src.stats["snapshots_taken"] == 1, "a snapshot covers what the floor dropped"
            checking.cancel()
        finally:
            src.close()

    asyncio.run(run())
