"""Snapshots in replication (``dledger/core/replication.py``): a follower that needs compacted entries gets an
InstallSnapshot instead; the leader waits for its outcome; a follower installs it or, holding its last entry,
just learns that it is committed."""

from __future__ import annotations

from dledger.core.membership import Configuration
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    InstallSnapshot,
    SnapshotMeta,
    SnapshotStatus,
)
from dledger.core.progress import ProgressState
from storage import codec
from storage.api import HardState
from storage.memory import MemoryLogStore
from tests.core.test_raft import drain, elect, make


def _compacted_leader():
    """n1 leads term 2 over a log of five term-1 entries whose first four are compacted."""
    store = MemoryLogStore()
    pos = 0
    frames = b""
    chain = 0
    for i in range(5):
        f = codec.encode(i, 1, pos, b"e%d" % i, chain)
        chain = codec.decode_header(f).chain_crc
        pos += len(f)
        frames += f
    store.append(frames)
    store.compact_prefix(4)
    core = make(store=store, hs=HardState(1, None))
    elect(core, store)
    return core, store


def _needs_everything(core) -> None:
    """n2 answers with an empty log: it needs index 0, which is compacted."""
    core.step(AppendEntriesResponse(core.term, "n2", "n1", False, conflict_index=0, last_log_index=-1))


def test_a_follower_behind_the_compaction_point_gets_the_snapshot() -> None:
    core, store = _compacted_leader()
    _needs_everything(core)
    snaps = [m for m in drain(core, store) if isinstance(m, InstallSnapshot)]
    assert [m.dst for m in snaps] == ["n2"]
    p = store.snapshot_point()
    # The snapshot carries the configuration as of its index, so a follower installing it knows the members.
    assert snaps[0].snapshot == SnapshotMeta(3, 1, p.chain_crc, p.end_pos, Configuration(("n1", "n2", "n3")))
    pr = core.progress("n2")
    assert pr.state is ProgressState.SNAPSHOT and pr.pending_snapshot == 3
    core.tick()
    assert not any(m.dst == "n2" and isinstance(m, AppendEntries) for m in drain(core, store)), (
        "no appends while the snapshot is in flight"
    )


def test_a_failed_snapshot_sends_the_follower_back_to_probing() -> None:
    core, store = _compacted_leader()
    _needs_everything(core)
    drain(core, store)
    core.step(SnapshotStatus(core.term, "n2", "n1", False))
    pr = core.progress("n2")
    assert pr.state is ProgressState.PROBE and pr.pending_snapshot == -1 and pr.probe_sent


def test_an_installed_snapshot_moves_the_follower_to_replicating() -> None:
    core, store = _compacted_leader()
    _needs_everything(core)
    drain(core, store)
    core.step(SnapshotStatus(core.term, "n2", "n1", True))
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=3))
    pr = core.progress("n2")
    assert pr.state is ProgressState.REPLICATE and pr.match_index >= 3
    sent = [m for m in drain(core, store) if isinstance(m, AppendEntries) and m.dst == "n2"]
    assert sent and sent[0].prev_log_index == 3, "the entries after the snapshot follow"


def test_a_follower_installs_a_snapshot_past_its_log() -> None:
    core = make("n2")
    meta = SnapshotMeta(9, 3, 0x1234, 4096)
    core.step(InstallSnapshot(3, "n1", "n2", meta))
    rd = core.ready()
    assert rd.snapshot == meta
    assert AppendEntriesResponse(3, "n2", "n1", True, match_index=9) in rd.messages
    core.advance(rd)
    assert core.last_index == 9 and core.commit_index == 9 and core.leader_id == "n1"
    assert core.status().applied == 9, "the state machine restarts from the snapshot, not by applying entries"


def test_a_follower_holding_the_snapshot_entry_only_commits() -> None:
    store = MemoryLogStore()
    core = make("n2", store=store)
    core.step(AppendEntries(1, "n1", "n2", -1, 0, -1, codec.encode(0, 1, 0, b"a", 0)))
    drain(core, store)
    assert core.last_index == 0
    entry = core.raft_log.chain_at(0)
    core.step(InstallSnapshot(1, "n1", "n2", SnapshotMeta(0, 1, entry, 0)))
    rd = core.ready()
    assert rd.snapshot is None, "nothing to install: the entry is already here"
    assert core.commit_index == 0 and core.last_index == 0
    core.advance(rd)
