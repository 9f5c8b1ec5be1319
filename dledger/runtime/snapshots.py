"""State machine snapshots: restore at start, the policy that takes them, taking one (then compacting the log),
streaming one to a lagging follower, and installing one received from the leader.

Snapshot files are written and read on their own thread: a big snapshot must not hold up the log's persists,
which own the I/O thread. Compaction (a log write) still runs on the I/O thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import io
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO

from dledger.core.membership import ConfCheckpoint, Configuration
from dledger.core.messages import InstallSnapshot, SnapshotMeta
from dledger.errors import InvalidRequestError, UnavailableError
from dledger.nodeconfig import NodeConfig
from dledger.runtime.iothread import IoThread
from dledger.transport.base import SnapshotChunk
from statemachine.api import StateMachine
from statemachine.apply_loop import ApplyLoop
from statemachine.snapshot import DATA as SNAPSHOT_DATA
from statemachine.snapshot import META as SNAPSHOT_META
from statemachine.snapshot import SnapshotError, SnapshotInfo, SnapshotStore
from storage.api import LogStore
from storage.errors import IndexOutOfRange

log = logging.getLogger("dledger.runtime")

POLICY_RECHECK_S = 1.0  # how often an idle node looks at the snapshot and retention policy again


class Snapshots:
    """The snapshots of one node's state machine.

    ``store`` (the files) exists once ``restore`` ran; ``attach(log, apply)`` gives the piece the log and the
    apply loop once the node has them. ``on_installed(index)`` tells the node a received snapshot now covers
    the state machine up to ``index``; ``closing()`` whether the node is shutting down."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        state_machine: StateMachine | None,
        io_thread: IoThread,
        *,
        stats: collections.Counter[str],
        on_installed: Callable[[int], None],
        closing: Callable[[], bool],
    ):
        self.id = node_id
        self.config = config
        self.state_machine = state_machine
        self._io = io_thread
        self.stats = stats
        self._on_installed = on_installed
        self._closing = closing
        self.store: SnapshotStore | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{node_id}-snap"
        )
        self._log: LogStore | None = None
        self._apply: ApplyLoop | None = None
        self._conf_at: Callable[[int], Configuration] | None = None
        self._conf_checkpoint: Callable[[int, int, int], ConfCheckpoint] | None = None
        self._save_conf: Callable[[Configuration, ConfCheckpoint], None] | None = None
        self._lock = asyncio.Lock()
        self.task: asyncio.Task[None] | None = None  # the policy snapshot in progress, if any
        self._install_in_progress = False
        self._last_index = -1  # applied index covered by the newest snapshot taken or installed
        self._last_bytes = 0  # ApplyLoop.applied_bytes at that snapshot
        self._retry_after = -1  # after a failed policy snapshot: no retry before this applied index

    def attach(
        self,
        log_store: LogStore,
        apply: ApplyLoop | None,
        conf_at: Callable[[int], Configuration] | None = None,
        save_conf: Callable[[Configuration, ConfCheckpoint], None] | None = None,
        conf_checkpoint: Callable[[int, int, int], ConfCheckpoint] | None = None,
    ) -> None:
        """``conf_at(index)`` is the group's configuration at an index and ``conf_checkpoint(index, term,
        chain_crc)`` the configurations through it (the core's); ``save_conf`` records the one at the compaction
        point before the log before it goes, and the checkpoint at the snapshot so a restart reads the log's
        config entries only after it (runs in the I/O thread)."""
        self._log = log_store
        self._apply = apply
        self._conf_at = conf_at
        self._conf_checkpoint = conf_checkpoint
        self._save_conf = save_conf
        if apply is not None:
            self._last_index = apply.applied_index

    # The pieces below exist once the node started (``restore``, ``attach``); nothing here runs before that.
    @property
    def _machine(self) -> StateMachine:
        assert self.state_machine is not None, "snapshots are taken only of a node that runs a state machine"
        return self.state_machine

    @property
    def _files(self) -> SnapshotStore:
        assert self.store is not None, "the snapshot files are opened by restore, at start"
        return self.store

    @property
    def _attached_log(self) -> LogStore:
        assert self._log is not None, "the log is attached at start"
        return self._log

    @property
    def _attached_apply(self) -> ApplyLoop:
        assert self._apply is not None, "the apply loop is attached at start (with a state machine)"
        return self._apply

    # -- restore -----------------------------------------------------------------------------------------------

    def restore(self, log_store: LogStore) -> int:
        """Load the newest intact snapshot the log can continue from; return the applied index it covers.

        Runs in the I/O thread. The state machine's durable state is its snapshot, so the apply loop resumes at
        the entry after it and nothing is applied twice or skipped."""
        sm = self._machine
        self.store = SnapshotStore(self.config.data_dir / "snapshot", keep=self.config.snapshot_keep)
        first = log_store.first_index
        info = self._files.latest(usable=lambda s: s.state_machine == sm.name and s.index >= first - 1)
        if info is None:
            if first > 0:
                raise UnavailableError(
                    f"node {self.id}: the log starts at index {first} but no snapshot of {sm.name!r} covers the "
                    f"entries before it in {self._files.root}"
                )
            return -1
        with self._files.open_data(info) as f:
            sm.load_snapshot(f)
        if not _log_continues(log_store, info):
            # A crash between publishing an installed snapshot and resetting the log: the snapshot holds
            # committed state the log does not reach (or contradicts), so the log restarts after it (Raft 7).
            log.warning(
                "%s: the log (last index %d) does not continue snapshot %d/%d; resetting it to the snapshot",
                self.id,
                log_store.last_index,
                info.index,
                info.term,
            )
            log_store.reset_to_snapshot(info.index, info.term, info.chain_crc, info.end_pos)
        log.info("%s restored %s from snapshot at index %d", self.id, sm.name, info.index)
        return info.index

    # -- policy and taking -------------------------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Start a snapshot when ``snapshot_entries`` entries or ``snapshot_bytes`` body bytes were applied since
        the last one (one at a time; a point passed meanwhile is picked up when the running one ends). With a
        retention floor (``retain_from``), also compact the log up to it: at once when a snapshot covers it,
        else after taking one."""
        apply = self._attached_apply
        cfg = self.config
        due = (
            apply.applied_index - self._last_index >= cfg.snapshot_entries
            or apply.applied_bytes - self._last_bytes >= cfg.snapshot_bytes
        )
        retry_ok = apply.applied_index >= self._retry_after
        if self.task is not None or self._closing():
            return
        if due and retry_ok:
            self.task = asyncio.get_running_loop().create_task(
                self._policy_snapshot(), name=f"{self.id}-snapshot"
            )
            return
        floor = self.retain_from()
        if floor is None or floor <= self._attached_log.first_index:
            return
        if floor - 1 <= self._last_index:
            self.task = asyncio.get_running_loop().create_task(
                self._retention_compaction(floor), name=f"{self.id}-retention"
            )
        elif retry_ok:  # the floor passed the newest snapshot: take one (it compacts up to the floor)
            self.task = asyncio.get_running_loop().create_task(
                self._policy_snapshot(), name=f"{self.id}-snapshot"
            )

    async def recheck(self, interval_s: float = POLICY_RECHECK_S) -> None:
        """Look at the policy again every ``interval_s`` whether or not entries come: only applied chunks ask
        otherwise, and a retention floor evaluated before a group's last writes (``retain_from`` limits its own
        rate) would keep the log past the policy for as long as the group stays idle."""
        while not self._closing():
            await asyncio.sleep(interval_s)
            self.maybe_snapshot()

    def retain_from(self) -> int | None:
        """The state machine's retention floor: the first log index it wants kept (None: no policy, and a
        snapshot compacts the log up to itself). Optional: only a state machine with ``retain_from`` has one."""
        f: Callable[[], int | None] | None = getattr(self.state_machine, "retain_from", None)
        return None if f is None else f()

    async def _retention_compaction(self, floor: int) -> None:
        ok = False
        try:
            async with self._lock:
                cut = min(floor, self._last_index + 1)  # a snapshot covers every entry before the cut
                if cut > self._attached_log.first_index:
                    await self._io.run(self._attached_log.compact_prefix, cut)
                    self.stats["retention_compactions"] += 1
                    log.info(
                        "%s: retention: the log now starts at %d", self.id, self._attached_log.first_index
                    )
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.stats["retention_failures"] += 1
            log.error("%s: compacting the log for retention failed: %r", self.id, e, exc_info=e)
        finally:
            self.task = None
        if ok:
            # Entries applied while this ran may have moved the floor on; with no more to come (an idle group)
            # nothing else would look again, and the log would stay past the policy until the next write.
            self.maybe_snapshot()

    async def _policy_snapshot(self) -> None:
        ok = False
        try:
            await self.take()
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # A failed snapshot loses nothing (the log still holds every entry); it is retried one policy
            # interval later (not at every apply chunk). Recorded, not swallowed: logged, and counted in stats.
            self.stats["snapshot_failures"] += 1
            self._retry_after = self._attached_apply.applied_index + self.config.snapshot_entries
            log.error("%s: taking a snapshot failed: %r", self.id, e, exc_info=e)
        finally:
            self.task = None
        if ok:
            self.maybe_snapshot()

    async def take(self) -> SnapshotInfo | None:
        """Save the state machine as of its applied index, then compact the log before it.

        Returns the new snapshot, or None when nothing was applied since the last one. The state is serialized
        on the event loop, where the apply loop runs, so no entry is applied while it is being saved (the apply
        loop only ever applies between awaits); the file is written and fsynced on the snapshot thread and the
        log compacted on the I/O thread, so the loop keeps serving meanwhile. A machine with a
        ``prepare_snapshot()`` (called on the loop just before ``save_snapshot``) returns the work that makes
        durable what its state points at; it runs on the snapshot thread before the file is written. A machine
        with a ``capture_snapshot()`` (called on the loop instead of ``save_snapshot``) returns the function that
        writes the state it captured, run on the snapshot thread: its serialization leaves the loop too."""
        if self._apply is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine: there is nothing to snapshot")
        if self._closing():
            raise UnavailableError(f"node {self.id} is shutting down")
        loop = asyncio.get_running_loop()
        async with self._lock:
            apply = self._apply
            index = apply.applied_index
            if index <= self._last_index:
                return None
            header = self._attached_log.entries(index, index + 1)[0].header
            applied_bytes = apply.applied_bytes
            t0 = time.perf_counter()
            # Optional: what the machine's state points at and must be durable before the snapshot is published
            # (the broker's ConsumeQueue files), synced on the snapshot thread rather than on the loop.
            prepare: Callable[[], Callable[[], None]] | None = getattr(
                self._machine, "prepare_snapshot", None
            )
            durable = prepare() if prepare is not None else None
            # Optional: the state captured here and serialized on the snapshot thread (``capture_snapshot()``
            # returns the writer); otherwise ``save_snapshot`` writes it here, on the loop.
            capture: Callable[[], Callable[[BinaryIO], None]] | None = getattr(
                self._machine, "capture_snapshot", None
            )
            if capture is not None:
                write_state = capture()
            else:
                buf = io.BytesIO()
                self._machine.save_snapshot(buf)
                data = buf.getbuffer()

                def write_state(f: BinaryIO) -> None:
                    f.write(data)

            self.stats["snapshot_serialize_us"] += int((time.perf_counter() - t0) * 1e6)
            if durable is not None:
                await loop.run_in_executor(self._thread, durable)
            info = await loop.run_in_executor(
                self._thread,
                self._files.save,
                index,
                header.term,
                header.chain_crc,
                header.end,
                self._machine.name,
                write_state,
            )
            self._last_index = index
            self._last_bytes = applied_bytes
            self.stats["snapshots_taken"] += 1
            floor = self.retain_from()  # retention keeps what the policy keeps, however often snapshots come
            cut = index + 1 if floor is None else min(index + 1, floor)
            if (
                self._conf_at is not None
                and self._save_conf is not None
                and self._conf_checkpoint is not None
            ):
                # The configuration at the new compaction point: config entries from ``cut`` on stay in the log.
                checkpoint = self._conf_checkpoint(index, header.term, header.chain_crc)
                await self._io.run(self._save_conf, self._conf_at(cut - 1), checkpoint)
            await self._io.run(self._attached_log.compact_prefix, cut)
            log.info(
                "%s: snapshot of %s at index %d (%d bytes); the log now starts at %d",
                self.id,
                info.state_machine,
                index,
                info.size,
                self._attached_log.first_index,
            )
            return info

    async def snapshot_now(self) -> tuple[bool, SnapshotInfo | None, int]:
        """On demand (``dledger snapshot``): (taken, newest snapshot, first log index afterwards)."""
        info = await self.take()
        taken = info is not None
        if info is None:
            infos = await asyncio.get_running_loop().run_in_executor(self._thread, self._files.infos)
            info = infos[-1] if infos else None
        return taken, info, self._attached_log.first_index

    # -- sending -----------------------------------------------------------------------------------------------

    async def outgoing(
        self, msg: InstallSnapshot
    ) -> tuple[InstallSnapshot, AsyncIterator[SnapshotChunk] | None] | None:
        """What to send for the core's ``InstallSnapshot``: the newest snapshot the log continues from, as the
        message with its meta and a stream of chunks; the message alone without a state machine (the follower's
        log restarts after the compaction point); None when no intact snapshot can be sent."""
        if self.state_machine is None:
            return msg, None
        sm_name = self.state_machine.name
        first = self._attached_log.first_index
        try:
            info = await asyncio.get_running_loop().run_in_executor(
                self._thread,
                lambda: self._files.latest(
                    usable=lambda s: s.state_machine == sm_name and s.index >= first - 1
                ),
            )
        except SnapshotError as e:
            info = None
            log.error("%s: no intact snapshot to send to %s: %s", self.id, msg.dst, e)
        if info is None:
            return None
        conf = self._conf_at(info.index) if self._conf_at is not None else msg.snapshot.conf
        meta = SnapshotMeta(info.index, info.term, info.chain_crc, info.end_pos, conf)
        return InstallSnapshot(msg.term, msg.src, msg.dst, meta), self.stream(info)

    async def stream(self, info: SnapshotInfo, chunk_size: int = 1 << 20) -> AsyncIterator[SnapshotChunk]:
        """The snapshot's metadata, then its data in chunks read on the snapshot thread."""
        loop = asyncio.get_running_loop()
        yield SnapshotChunk(SNAPSHOT_META, 0, info.to_json(), False)
        f = await loop.run_in_executor(self._thread, self._files.open_data, info)
        try:
            offset = 0
            while True:
                data = await loop.run_in_executor(self._thread, f.read, chunk_size)
                last = offset + len(data) >= info.size or not data
                yield SnapshotChunk(SNAPSHOT_DATA, offset, data, last)
                offset += len(data)
                if last:
                    return
        finally:
            f.close()

    # -- installing --------------------------------------------------------------------------------------------

    async def install(self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk], term: int) -> bool:
        """Receive a snapshot (metadata chunk, then data), verify it, load it into the state machine and reset
        the apply loop. Returns False when it was not needed (stale or already covered). Until the checksum has
        been verified nothing is visible: an interrupted or corrupt transfer leaves the node as it was. ``term``
        is the node's current term (a sender behind it is stale)."""
        first = await anext(chunks, None)
        if first is None:
            return False  # a meta-only snapshot (no state machine on the leader)
        if self.state_machine is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine and cannot load snapshot data")
        if first.file != SNAPSHOT_META:
            raise InvalidRequestError(
                f"a snapshot stream must start with {SNAPSHOT_META}, got {first.file!r}"
            )
        try:
            info = SnapshotInfo.from_json(first.data)
        except SnapshotError as e:
            raise InvalidRequestError(str(e)) from e
        s = msg.snapshot
        if (info.index, info.term, info.chain_crc, info.end_pos) != (s.index, s.term, s.chain_crc, s.end_pos):
            raise InvalidRequestError(f"snapshot metadata {info} does not match the InstallSnapshot meta {s}")
        sm = self.state_machine
        if info.state_machine != sm.name:
            raise InvalidRequestError(
                f"the leader sends a snapshot of {info.state_machine!r}; node {self.id} runs {sm.name!r}"
            )
        if msg.term < term or info.index <= self._attached_apply.applied_index:
            return False  # stale sender or nothing new: the core answers the meta as usual
        if self._install_in_progress:
            raise UnavailableError(f"node {self.id} is already installing a snapshot; retry later")
        self._install_in_progress = True
        try:
            async with self._lock:
                return await self._receive(msg, info, chunks)
        except SnapshotError as e:
            raise InvalidRequestError(f"snapshot from {msg.src} refused: {e}") from e
        finally:
            self._install_in_progress = False

    async def _receive(
        self, msg: InstallSnapshot, info: SnapshotInfo, chunks: AsyncIterator[SnapshotChunk]
    ) -> bool:
        loop = asyncio.get_running_loop()
        install = await loop.run_in_executor(self._thread, self._files.begin_install, info)
        try:
            complete = False
            async for c in chunks:
                if c.file != SNAPSHOT_DATA:
                    raise InvalidRequestError(f"unexpected snapshot file {c.file!r}")
                await loop.run_in_executor(self._thread, install.write, c.offset, c.data)
                if c.last:
                    complete = True
                    break
            if not complete:
                raise InvalidRequestError(
                    f"the snapshot stream ended after {install.received} of {info.size} bytes"
                )
            await loop.run_in_executor(self._thread, install.commit)
        except BaseException:
            await asyncio.shield(loop.run_in_executor(self._thread, install.abort))
            raise
        raw = await loop.run_in_executor(self._thread, self._read_verified, info)
        # On the loop, between two apply chunks: the state machine is never loaded while applying.
        if info.index <= self._attached_apply.applied_index:
            return False
        self._machine.load_snapshot(io.BytesIO(raw))
        self._attached_apply.reset_to_snapshot(info.index)
        self._last_index = info.index
        self._last_bytes = self._attached_apply.applied_bytes
        self.stats["snapshots_installed"] += 1
        self._on_installed(info.index)
        log.info(
            "%s installed snapshot of %s at index %d from %s",
            self.id,
            self._machine.name,
            info.index,
            msg.src,
        )
        return True

    def _read_verified(self, info: SnapshotInfo) -> bytes:
        self._files.verify(info)
        with self._files.open_data(info) as f:
            return f.read()

    # -- shutdown ----------------------------------------------------------------------------------------------

    async def cancel(self) -> None:
        """Cancel the policy snapshot in progress, if any (a half-written file is never published)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def shutdown(self, wait: bool) -> None:
        self._thread.shutdown(wait=wait)


def _log_continues(log_store: LogStore, info: SnapshotInfo) -> bool:
    """Whether the log holds the snapshot's last entry (same term), or starts right after it."""
    if info.index > log_store.last_index:
        return False
    try:
        return log_store.term(info.index) == info.term
    except IndexOutOfRange:
        return False
