"""The node runtime: one asyncio process that owns time and I/O around a pure ``RaftCore``.

Tasks (ARCHITECTURE.md "Hot path"):

- the **ticker** calls ``core.tick()`` every ``tick_ms`` (missed ticks are dropped, never replayed in a burst:
  a loop stall must not look like a silent leader);
- the **ready loop** is the only place that performs the core's work. For each ``Ready``, strictly in order:
  persist (hard state, snapshot reset, truncation, append + fsync per flush policy) in a single-thread
  executor, then send the messages, then hand on what committed, then ``core.advance(ready)``. Persist
  before send is enforced here and nowhere else (one exception: a leader's own AppendEntries leave while it
  writes the same entries, see ``dledger.core.messages.split_early``);
- one **sender** per peer writes everything queued for that peer (AppendEntries, heartbeats, answers) as one
  message on a long-lived stream (the ``Pipe``), without waiting for answers: many AppendEntries are in flight
  at once (pipelining, bounded by the core's window), and a heartbeat is never queued behind more than the one
  write in progress. Votes and TimeoutNow use unary calls on a separate connection;
- the gRPC **server** steps inbound messages into the core and returns the core's answers (on the same call, or
  on the pipe's answer stream) once what they depend on is persisted (``handle_message``, ``handle_batch``).

Group commit: client appends are queued; every turn of the ready loop proposes everything queued as one batch,
so whatever arrived while the previous batch was being written goes out as one write, one fsync and one
pipe write per follower.

A client's append resolves at commit with (index, pos) of each body: ``_committed`` is the one seam where
committed entries are handed on (a state machine's apply loop registers through ``add_commit_listener``).
Storage calls that may block (fsync, truncate, unlink, segment roll) run in one I/O thread, except small appends
while the disk is fast and that thread idle (``_persist_inline``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import fcntl
import heapq
import io
import logging
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    Prepare,
    Ready,
    RequestVote,
    RequestVoteResponse,
    Role,
    SnapshotMeta,
    SnapshotStatus,
    TimeoutNow,
    split_early,
)
from dledger.core.raft import RaftCore
from dledger.errors import (
    BackpressureError,
    DirectoryInUseError,
    DLedgerError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
    StorageFullError,
    UnavailableError,
)
from dledger.metrics import NodeMetrics
from dledger.nodeconfig import NodeConfig
from dledger.plugins import NodePlugin
from dledger.plugins import resolve as resolve_plugin
from dledger.transport.base import (
    AppendedRun,
    NodeInfo,
    PeerInfo,
    PeerTransport,
    PeerUnreachableError,
    SnapshotChunk,
)
from dledger.transport.grpc import GrpcPeerTransport, NodeServer
from statemachine.api import StateMachine
from statemachine.apply_loop import Applied, ApplyLoop
from statemachine.snapshot import DATA as SNAPSHOT_DATA
from statemachine.snapshot import META as SNAPSHOT_META
from statemachine.snapshot import SnapshotError, SnapshotInfo, SnapshotStore
from storage.api import HardState, LogStore, MetaStore
from storage.codec import Entry
from storage.errors import Compacted, DiskFullError, IndexOutOfRange

# Appends up to this size are written on the event loop while writes take less than this on average.
INLINE_MAX_BYTES = 64 << 10
INLINE_MAX_PERSIST_S = 0.002
log = logging.getLogger("dledger.node")

# Which response type answers which request: the reply a peer's call waits for.
_RESPONSE_TO = {
    RequestVote: RequestVoteResponse,
    AppendEntries: AppendEntriesResponse,
    Heartbeat: HeartbeatResponse,
    TimeoutNow: None,  # never answered: the transferee campaigns instead
    InstallSnapshot: AppendEntriesResponse,
}
_ROLE_NAMES = {
    Role.LEADER: "leader",
    Role.FOLLOWER: "follower",
    Role.CANDIDATE: "candidate",
    Role.PRE_CANDIDATE: "candidate",
}
COMMIT_INDEX_KEY = "commit_index"  # checkpoint in the MetaStore (audit input; not needed for safety)


class _AppendRefused(Exception):
    """The log store refused an append for want of space and rolled it back (raised from ``_persist``)."""

    def __init__(self, cause: DiskFullError):
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class _ReplyWaiter:
    """An inbound call waiting for the core's answer to the message it delivered."""

    src: str
    kind: type
    future: asyncio.Future
    replies: list[Message] = field(default_factory=list)


@dataclass(slots=True)
class _PendingAppend:
    """Client bodies waiting to be proposed (queued) or committed (proposed: index range known)."""

    bodies: list[bytes]
    future: asyncio.Future
    prepare: Prepare | None = None
    want_results: bool = False  # register with the apply loop at proposal (``Node.submit``)
    first_index: int = -1
    term: int = -1
    positions: tuple[int, ...] = ()
    applied: list[asyncio.Future] = field(default_factory=list)
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.bodies) - 1


class Node:
    """A Raft node. ``start()`` opens storage and serves; ``stop()`` shuts down cleanly (also on SIGTERM)."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        log_store: LogStore | None = None,
        meta_store: MetaStore | None = None,
        transport: PeerTransport | None = None,
        rng: random.Random | None = None,
        serve: bool = True,
        state_machine: StateMachine | None = None,
        plugin: NodePlugin | None = None,
    ):
        """``plugin`` (or ``config.state_machine``, resolved through ``dledger.plugins``) brings the state machine
        and any gRPC services it adds; ``state_machine`` alone hosts a state machine without services."""
        self.config = config
        self.group = config.group
        self.id = config.node_id
        self._log: LogStore | None = log_store
        self._meta: MetaStore | None = meta_store
        self._transport = transport
        self._rng = rng or random.Random()
        self._serve = serve
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.id}-io")
        self._core = None
        self._server = None
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False
        self._queued: list[_PendingAppend] = []
        self._queued_entries = 0
        self._proposed: collections.deque[_PendingAppend] = collections.deque()
        self._proposed_entries = 0
        self._leader_term = -1  # the term in which our proposals were made
        self._reply_waiters: list[_ReplyWaiter] = []
        self._peer_queues: dict[str, asyncio.Queue] = {}
        self._commit_listeners: list[Callable[[int], None]] = []
        self._role_listeners: list[Callable[[Role, int], None]] = []
        self._seen_role_term: tuple[Role, int] = (Role.FOLLOWER, -1)
        if plugin is None and config.state_machine:
            plugin = resolve_plugin(config.state_machine)(config)
        self.plugin = plugin
        self._state_machine = plugin.state_machine if plugin is not None else state_machine
        self._apply: ApplyLoop | None = None
        self.snapshots: SnapshotStore | None = None
        # Snapshot files are written and read on their own thread: a big snapshot must not hold up the log's
        # persists, which own ``_io``. Compaction (a log write) still runs on ``_io``.
        self._snap_io = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{self.id}-snap"
        )
        self._snapshot_lock = asyncio.Lock()
        self._snapshot_task: asyncio.Task | None = None
        self._install_in_progress = False
        self._last_snapshot_index = -1  # applied index covered by the newest snapshot taken or installed
        self._last_snapshot_bytes = 0  # ApplyLoop.applied_bytes at that snapshot
        self._snapshot_retry_after = -1  # after a failed policy snapshot: no retry before this applied index
        self._read_seq = 0
        self._read_waiters: dict[int, asyncio.Future] = {}  # read-index context -> future of the read index
        self._applied_waiters: list[tuple[int, int, asyncio.Future]] = []  # heap of (index, seq, future)
        self._commit_index = -1
        self._checkpointed_commit = -1
        self._dirty_since_sync = False
        # Whether the node must call sync() after each write (stores given by the caller sync by themselves).
        self._sync_each_ready = False
        self._role = Role.FOLLOWER
        self._unreachable_logged: dict[str, float] = {}
        self.port = 0
        self.stats = collections.Counter()
        self._persist_ewma_s = 0.0  # recent time per persist (decides inline writes on followers)
        self._io_pending = 0  # jobs submitted to the I/O thread and not finished
        self.metrics = NodeMetrics()
        self.failure: BaseException | None = None  # why the node stopped on its own, if it did
        self._disk_full: str | None = None  # why writes are refused (a full disk), until a write succeeds
        self._quiet_until = 0.0  # loop time before which a node whose disk filled up does not campaign
        self._disk_full_logged = 0.0
        self._lock_fd: int | None = None  # holds the data directory's exclusive lock while open

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        if self._log is None or self._meta is None:
            try:
                await loop.run_in_executor(self._io, self._open_storage)
            except BaseException:
                self._io.shutdown(wait=False)
                self._snap_io.shutdown(wait=False)
                raise
        hard_state = self._meta.load_hard_state()
        applied = -1
        if self._state_machine is not None:
            applied = await loop.run_in_executor(self._io, self._restore_state_machine)
            self._apply = ApplyLoop(self._state_machine, self._log, applied, on_applied=self._on_applied)
            self._last_snapshot_index = applied
            self.add_commit_listener(self._apply.commit_advanced)
            self.add_role_listener(self._fail_reads)
        self._core = self._new_core(hard_state, applied)
        if self._transport is None:
            control_timeout = max(0.2, cfg.raft.election_timeout_min_ms / 1000)
            self._transport = GrpcPeerTransport(
                self.group,
                {p: a for p, a in cfg.peers.items() if p != self.id},
                control_timeout_s=control_timeout,
            )
        self._transport.set_reply_handler(self._step_all)
        for peer in cfg.peers:
            if peer != self.id:
                self._peer_queues[peer] = asyncio.Queue()
        if self._serve:
            attach = (lambda server: self.plugin.attach(self, server)) if self.plugin is not None else None
            self._server = NodeServer(self, self, cfg.bind, attach)
            self.port = self._server.port
            await self._server.start()
        if cfg.metrics_listen:
            self.metrics.watch(loop, lambda: (self.metadata(), dict(self.stats)))
            port = self.metrics.serve(cfg.metrics_listen)
            log.info(
                "%s: Prometheus metrics on http://%s:%d/metrics",
                self.id,
                cfg.metrics_listen.rpartition(":")[0],
                port,
            )
        self._tasks = [
            asyncio.create_task(self._ready_loop(), name=f"{self.id}-ready"),
            asyncio.create_task(self._ticker(), name=f"{self.id}-ticker"),
            *[
                asyncio.create_task(self._sender(peer, q), name=f"{self.id}-send-{peer}")
                for peer, q in self._peer_queues.items()
            ],
        ]
        self._tasks.append(asyncio.create_task(self._flusher(), name=f"{self.id}-flusher"))
        if self._apply is not None:
            self._tasks.append(asyncio.create_task(self._apply.run(), name=f"{self.id}-apply"))
        for t in self._tasks:
            t.add_done_callback(self._task_done)
        log.info(
            "%s started: group %s, term %d, last index %d, listening on %s, flush %s",
            self.id,
            self.group,
            hard_state.term,
            self._log.last_index,
            cfg.bind,
            cfg.flush,
        )

    def _new_core(self, hard_state: HardState, applied: int) -> RaftCore:
        cfg = self.config
        return RaftCore(self.id, cfg.voters, self._log, hard_state, cfg.raft, self._rng, applied=applied)

    def _open_storage(self) -> None:
        from storage.filestore import FileLogStore
        from storage.meta_lmdb import LmdbMetaStore

        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_data_dir(cfg.data_dir)
        if self._log is None:
            # The store is opened in its "async" mode whatever the node's policy: the node calls fdatasync
            # itself (``sync()``, in the I/O thread). The store's lock is held through an fdatasync inside a
            # "sync" append, and the core reads the store from the event loop; ``sync()`` fsyncs outside the
            # lock, so the loop never waits behind the disk. Under the "sync" policy every Ready is synced
            # before anything that depends on it is sent, which is the same promise.
            self._log = FileLogStore.open(
                str(cfg.data_dir),
                segment_size=cfg.raft.segment_size,
                flush="async",
                flush_interval_ms=cfg.flush_interval_ms,
            )
            self._sync_each_ready = cfg.flush == "sync"
        if self._meta is None:
            self._meta = LmdbMetaStore(str(cfg.data_dir / "meta"))

    def _restore_state_machine(self) -> int:
        """Load the newest intact snapshot the log can continue from; return the applied index it covers.

        Runs in the I/O thread. The state machine's durable state is its snapshot, so the apply loop resumes at
        the entry after it and nothing is applied twice or skipped."""
        sm = self._state_machine
        self.snapshots = SnapshotStore(self.config.data_dir / "snapshot", keep=self.config.snapshot_keep)
        first = self._log.first_index
        info = self.snapshots.latest(usable=lambda s: s.state_machine == sm.name and s.index >= first - 1)
        if info is None:
            if first > 0:
                raise UnavailableError(
                    f"node {self.id}: the log starts at index {first} but no snapshot of {sm.name!r} covers the "
                    f"entries before it in {self.snapshots.root}"
                )
            return -1
        with self.snapshots.open_data(info) as f:
            sm.load_snapshot(f)
        if not self._log_continues(info):
            # A crash between publishing an installed snapshot and resetting the log: the snapshot holds
            # committed state the log does not reach (or contradicts), so the log restarts after it (Raft 7).
            log.warning(
                "%s: the log (last index %d) does not continue snapshot %d/%d; resetting it to the snapshot",
                self.id,
                self._log.last_index,
                info.index,
                info.term,
            )
            self._log.reset_to_snapshot(info.index, info.term, info.chain_crc, info.end_pos)
        log.info("%s restored %s from snapshot at index %d", self.id, sm.name, info.index)
        return info.index

    def _log_continues(self, info: SnapshotInfo) -> bool:
        """Whether the log holds the snapshot's last entry (same term), or starts right after it."""
        if info.index > self._log.last_index:
            return False
        try:
            return self._log.term(info.index) == info.term
        except IndexOutOfRange:
            return False

    def _task_done(self, t: asyncio.Task) -> None:
        if t.cancelled() or self._stopping:
            return
        exc = t.exception()
        if exc is not None:
            # A runtime task died: the node cannot keep its promises any more. Stop rather than limp on.
            log.critical("%s: task %s failed; stopping the node", self.id, t.get_name(), exc_info=exc)
            self.failure = self.failure or exc
            asyncio.get_running_loop().create_task(self.stop())

    async def stop(self, grace_s: float = 0.5) -> None:
        """Stop serving, finish the write in progress, fail what waits, close files. Idempotent."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        log.info("%s stopping", self.id)
        if self._server is not None:
            await self._server.health.enter_graceful_shutdown()
        for p in self._queued:
            _fail(p.future, UnavailableError(f"node {self.id} is shutting down; the append was not proposed"))
        self._queued.clear()
        # Cancelling the ready loop never cuts a write in half: a persist already handed to the single I/O
        # thread runs to completion before _close_storage, which is queued behind it on the same thread.
        ready_task = self._tasks[0] if self._tasks else None
        for t in self._tasks[1:]:
            t.cancel()
        if ready_task is not None:
            ready_task.cancel()
            await asyncio.gather(ready_task, return_exceptions=True)
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        self._fail_proposed(f"node {self.id} shut down before the entries committed")
        self._fail_reads(None, -1)
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
            await asyncio.gather(self._snapshot_task, return_exceptions=True)
        for w in self._reply_waiters:
            _fail(w.future, UnavailableError(f"node {self.id} is shutting down"))
        if self._server is not None:
            await self._server.stop(grace_s)
        loop = asyncio.get_running_loop()
        if self.metrics.serving:
            await loop.run_in_executor(None, self.metrics.close)
        if self._transport is not None:
            await self._transport.close()
        try:
            await loop.run_in_executor(self._io, self._close_storage)
        except Exception as e:  # the storage may be what failed: report it, and still finish stopping
            log.error("%s: closing storage failed: %r", self.id, e)
            self.failure = self.failure or e
        finally:
            self._io.shutdown(wait=True)
            self._snap_io.shutdown(wait=True)
            log.info("%s stopped; counters: %s", self.id, dict(sorted(self.stats.items())))
            self._stopped.set()

    def _close_storage(self) -> None:
        try:
            if self._log is not None:
                self._log.sync()
                if self._meta is not None and self._commit_index > self._checkpointed_commit:
                    self._meta.put(COMMIT_INDEX_KEY, str(self._commit_index).encode(), sync=True)
                self._log.close()
            if self._meta is not None:
                self._meta.close()
            if self._state_machine is not None:
                self._state_machine.close()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the data directory's lock
                self._lock_fd = None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: loop.create_task(self.stop()))

    # -- the commit seam ---------------------------------------------------------------------------------------

    def add_role_listener(self, listener: Callable[[Role, int], None]) -> None:
        """Call ``listener(role, term)`` whenever this node's role or term changes (e.g. the broker resets what
        it allocated as leader)."""
        self._role_listeners.append(listener)

    def add_commit_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(commit_index)`` whenever the commit index advances (entries are in storage by then).

        This is where a state machine's apply loop plugs in: it reads the committed entries from the log."""
        self._commit_listeners.append(listener)

    def _committed(self, commit_index: int) -> None:
        """Entries up to ``commit_index`` are committed and persisted locally: resolve waiting appends with
        (index, pos) and tell the listeners."""
        self._commit_index = commit_index
        proposed = self._proposed
        now = time.perf_counter()
        observe = self.metrics.append_latency.observe
        while proposed and proposed[0].last_index <= commit_index:
            p = proposed.popleft()
            observe(now - p.queued_at)
            self._proposed_entries -= len(p.bodies)
            if p.future.done():
                continue
            # Log matching: if the entry at last_index still has our term, the whole batch is ours.
            if self._log.term(p.last_index) != p.term:
                _fail(p.future, OutcomeUnknownError("the entries were overwritten by a newer leader"))
                continue
            p.future.set_result(AppendedRun(p.first_index, p.term, p.positions))
        for listener in self._commit_listeners:
            listener(commit_index)

    # -- snapshots and compaction -----------------------------------------------------------------------------

    def _on_applied(self, applied_index: int) -> None:
        """The apply loop applied up to ``applied_index``: wake reads waiting for it; take a snapshot by policy."""
        self._resolve_applied(applied_index)
        self._maybe_snapshot()

    def _maybe_snapshot(self) -> None:
        """Start a snapshot when ``snapshot_entries`` entries or ``snapshot_bytes`` body bytes were applied since
        the last one (one at a time; a point passed meanwhile is picked up when the running one ends)."""
        apply = self._apply
        cfg = self.config
        due = (
            apply.applied_index - self._last_snapshot_index >= cfg.snapshot_entries
            or apply.applied_bytes - self._last_snapshot_bytes >= cfg.snapshot_bytes
        )
        retry_ok = apply.applied_index >= self._snapshot_retry_after
        if due and retry_ok and self._snapshot_task is None and not self._stopping:
            self._snapshot_task = asyncio.get_running_loop().create_task(
                self._policy_snapshot(), name=f"{self.id}-snapshot"
            )

    async def _policy_snapshot(self) -> None:
        ok = False
        try:
            await self.take_snapshot()
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # A failed snapshot loses nothing (the log still holds every entry); it is retried one policy
            # interval later (not at every apply chunk). Recorded, not swallowed: logged, and counted in stats.
            self.stats["snapshot_failures"] += 1
            self._snapshot_retry_after = self._apply.applied_index + self.config.snapshot_entries
            log.error("%s: taking a snapshot failed: %r", self.id, e, exc_info=e)
        finally:
            self._snapshot_task = None
        if ok:
            self._maybe_snapshot()

    async def take_snapshot(self) -> SnapshotInfo | None:
        """Save the state machine as of its applied index, then compact the log before it.

        Returns the new snapshot, or None when nothing was applied since the last one. The state is serialized
        on the event loop, where the apply loop runs, so no entry is applied while it is being saved (the apply
        loop only ever applies between awaits); the file is written and fsynced on the snapshot thread and the
        log compacted on the I/O thread, so the loop keeps serving meanwhile."""
        if self._apply is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine: there is nothing to snapshot")
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        loop = asyncio.get_running_loop()
        async with self._snapshot_lock:
            apply = self._apply
            index = apply.applied_index
            if index <= self._last_snapshot_index:
                return None
            header = self._log.entries(index, index + 1)[0].header
            applied_bytes = apply.applied_bytes
            t0 = time.perf_counter()
            buf = io.BytesIO()
            self._state_machine.save_snapshot(buf)
            data = buf.getbuffer()
            self.stats["snapshot_serialize_us"] += int((time.perf_counter() - t0) * 1e6)
            info = await loop.run_in_executor(
                self._snap_io,
                self.snapshots.save,
                index,
                header.term,
                header.chain_crc,
                header.end,
                self._state_machine.name,
                lambda f: f.write(data),
            )
            self._last_snapshot_index = index
            self._last_snapshot_bytes = applied_bytes
            self.stats["snapshots_taken"] += 1
            await self._on_io(self._log.compact_prefix, index + 1)
            log.info(
                "%s: snapshot of %s at index %d (%d bytes); the log now starts at %d",
                self.id,
                info.state_machine,
                index,
                info.size,
                self._log.first_index,
            )
            return info

    async def snapshot_now(self) -> tuple[bool, SnapshotInfo | None, int]:
        """On demand (``dledger snapshot``): (taken, newest snapshot, first log index afterwards)."""
        info = await self.take_snapshot()
        taken = info is not None
        if info is None:
            infos = await asyncio.get_running_loop().run_in_executor(self._snap_io, self.snapshots.infos)
            info = infos[-1] if infos else None
        return taken, info, self._log.first_index

    async def _snapshot_stream(
        self, info: SnapshotInfo, chunk_size: int = 1 << 20
    ) -> AsyncIterator[SnapshotChunk]:
        """The snapshot's metadata, then its data in chunks read on the snapshot thread."""
        loop = asyncio.get_running_loop()
        yield SnapshotChunk(SNAPSHOT_META, 0, info.to_json(), False)
        f = await loop.run_in_executor(self._snap_io, self.snapshots.open_data, info)
        try:
            offset = 0
            while True:
                data = await loop.run_in_executor(self._snap_io, f.read, chunk_size)
                last = offset + len(data) >= info.size or not data
                yield SnapshotChunk(SNAPSHOT_DATA, offset, data, last)
                offset += len(data)
                if last:
                    return
        finally:
            f.close()

    async def _install_snapshot_data(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk]
    ) -> bool:
        """Receive a snapshot (metadata chunk, then data), verify it, load it into the state machine and reset
        the apply loop. Returns False when it was not needed (stale or already covered). Until the checksum has
        been verified nothing is visible: an interrupted or corrupt transfer leaves the node as it was."""
        first = await anext(chunks, None)
        if first is None:
            return False  # a meta-only snapshot (no state machine on the leader)
        if self._state_machine is None:
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
        sm = self._state_machine
        if info.state_machine != sm.name:
            raise InvalidRequestError(
                f"the leader sends a snapshot of {info.state_machine!r}; node {self.id} runs {sm.name!r}"
            )
        if msg.term < self._core.term or info.index <= self._apply.applied_index:
            return False  # stale sender or nothing new: the core answers the meta as usual
        if self._install_in_progress:
            raise UnavailableError(f"node {self.id} is already installing a snapshot; retry later")
        self._install_in_progress = True
        loop = asyncio.get_running_loop()
        try:
            async with self._snapshot_lock:
                install = await loop.run_in_executor(self._snap_io, self.snapshots.begin_install, info)
                try:
                    complete = False
                    async for c in chunks:
                        if c.file != SNAPSHOT_DATA:
                            raise InvalidRequestError(f"unexpected snapshot file {c.file!r}")
                        await loop.run_in_executor(self._snap_io, install.write, c.offset, c.data)
                        if c.last:
                            complete = True
                            break
                    if not complete:
                        raise InvalidRequestError(
                            f"the snapshot stream ended after {install.received} of {info.size} bytes"
                        )
                    await loop.run_in_executor(self._snap_io, install.commit)
                except BaseException:
                    await asyncio.shield(loop.run_in_executor(self._snap_io, install.abort))
                    raise
                raw = await loop.run_in_executor(self._snap_io, self._read_snapshot, info)
                # On the loop, between two apply chunks: the state machine is never loaded while applying.
                if info.index <= self._apply.applied_index:
                    return False
                sm.load_snapshot(io.BytesIO(raw))
                self._apply.reset_to_snapshot(info.index)
                self._last_snapshot_index = info.index
                self._last_snapshot_bytes = self._apply.applied_bytes
                self.stats["snapshots_installed"] += 1
                self._resolve_applied(info.index)
                log.info(
                    "%s installed snapshot of %s at index %d from %s", self.id, sm.name, info.index, msg.src
                )
                return True
        except SnapshotError as e:
            raise InvalidRequestError(f"snapshot from {msg.src} refused: {e}") from e
        finally:
            self._install_in_progress = False

    def _read_snapshot(self, info: SnapshotInfo) -> bytes:
        self.snapshots.verify(info)
        with self.snapshots.open_data(info) as f:
            return f.read()

    # -- linearizable reads (read index) -----------------------------------------------------------------------

    async def read_index(self, timeout_s: float | None = None) -> int:
        """A linearizable read point (Raft thesis 6.4): the leader confirms with a quorum that it still leads,
        then waits until its state machine has applied the commit index it had when asked. State read after
        this returns reflects every write acknowledged before the call.

        Raises ``NotLeaderError``/``UnavailableError`` (retriable) when this node is not, or stops being, the
        leader, or cannot reach a quorum within ``timeout_s`` (default: twice the maximum election timeout)."""
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        core = self._core
        if core is None or core.role is not Role.LEADER:
            raise self._not_leader()
        if timeout_s is None:
            timeout_s = 2 * self.config.raft.election_timeout_max_ms / 1000
        loop = asyncio.get_running_loop()
        self._read_seq += 1
        context = self._read_seq
        fut = loop.create_future()
        self._read_waiters[context] = fut
        try:
            core.read_index(context)
            self._wake.set()
            async with asyncio.timeout(timeout_s):
                index = await fut
                await self._wait_applied(index)
        except TimeoutError:
            raise UnavailableError(
                f"node {self.id} could not confirm its leadership with a quorum within {timeout_s:.2f} s; retry"
            ) from None
        finally:
            self._read_waiters.pop(context, None)
        return index

    async def linearizable_read(self, read: Callable[[StateMachine], object]) -> object:
        """``read(state_machine)`` after ``read_index()``: e.g. ``await node.linearizable_read(lambda kv:
        kv.get(b"k"))``. ``read`` runs on the loop and must not block."""
        if self._state_machine is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine")
        await self.read_index()
        return read(self._state_machine)

    def _read_states_ready(self, read_states: tuple[tuple[int, int], ...]) -> None:
        for context, index in read_states:
            fut = self._read_waiters.get(context)
            if fut is not None and not fut.done():
                fut.set_result(index)

    def _fail_reads(self, role: Role | None, term: int) -> None:
        """Role listener: a read index is only valid in the leader's term it was asked in."""
        if not self._read_waiters:
            return
        err = self._not_leader() if role is not None else UnavailableError(f"node {self.id} is shutting down")
        if role is Role.LEADER:
            err = UnavailableError(f"node {self.id} changed term during the read; retry")
        for fut in self._read_waiters.values():
            _fail(fut, err)

    async def _wait_applied(self, index: int) -> None:
        applied = self._apply.applied_index if self._apply is not None else self._commit_index
        if applied >= index:
            return
        if self._apply is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine to wait for")
        fut = asyncio.get_running_loop().create_future()
        self._read_seq += 1
        heapq.heappush(self._applied_waiters, (index, self._read_seq, fut))
        await fut

    def _resolve_applied(self, applied_index: int) -> None:
        waiters = self._applied_waiters
        while waiters and waiters[0][0] <= applied_index:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(applied_index)

    # -- the ready loop ----------------------------------------------------------------------------------------

    async def _ready_loop(self) -> None:
        core = self._core
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                if self._queued:
                    self._propose_queued()
                if not core.has_ready():
                    # Messages stepped since the last Ready produced nothing to answer (e.g. a stale term).
                    waiters, self._reply_waiters = self._reply_waiters, []
                    for w in waiters:
                        if not w.future.done():
                            w.future.set_result([])
                    break
                rd = core.ready()
                waiters, self._reply_waiters = self._reply_waiters, []
                # 0. a leader's own replication goes out while it writes the same entries (split_early).
                early, messages = split_early(rd, core.role)
                if early:
                    self._dispatch(early, [])
                # 1. persist. Nothing below runs until storage has it (fsync per flush policy).
                if (
                    rd.hard_state is not None
                    or rd.snapshot is not None
                    or rd.truncate_from is not None
                    or rd.frames
                ):
                    t0 = time.perf_counter()
                    inline = self._persist_inline(rd)
                    if inline and early:
                        await asyncio.sleep(0)  # the senders put the early AppendEntries on the wire first
                        inline = self._io_pending == 0
                    try:
                        if inline:
                            self._persist(rd)
                            self.stats["persists_inline"] += 1
                        else:
                            await self._on_io(self._persist, rd)
                    except _AppendRefused as e:
                        # Nothing this Ready asked for is sent, committed or advanced: the core is rebuilt
                        # from what storage holds, exactly as a restart would find it.
                        for w in waiters:
                            if not w.future.done():
                                w.future.set_result([])  # no answer: to the sender, a lost message
                        self._enter_disk_full(e.cause)
                        core = self._core
                        continue
                    if rd.frames and self._disk_full is not None:
                        self._leave_disk_full()
                    self.stats["persist_wait_us"] += int((time.perf_counter() - t0) * 1e6)
                # 2. send (answers ride back on the calls that asked; the rest go through the senders).
                self._dispatch(messages, waiters)
                # 3. hand on what committed.
                if rd.commit_index > self._commit_index:
                    self._committed(rd.commit_index)
                if rd.read_states:
                    self._read_states_ready(rd.read_states)
                self._watch_role()
                # 4. tell the core its work was done.
                core.advance(rd)

    def _enter_disk_full(self, cause: DiskFullError) -> None:
        """The disk is full: refuse writes instead of stopping, and lose nothing.

        The failed Ready is dropped whole (its append was rolled back; none of its messages left, apart from a
        leader's early AppendEntries, which a crash at the same point would have sent too), and the core is
        rebuilt from storage: the state a restart would find, kept in a live process that still answers
        status, reads and votes. A leader thereby steps down and the rest of the group elects another one;
        waiting appends fail (proposed ones with "outcome unknown": followers may hold and commit them). For
        one election timeout the node does not campaign, so that it does not win an election it cannot serve.
        Any later append that succeeds (an AppendEntries from the leader, or its own no-op after winning an
        election) proves there is space again and lifts the refusal."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        first = self._disk_full is None
        self._disk_full = str(cause)
        self.stats["disk_full_refusals"] += 1
        if first or now - self._disk_full_logged > 10:
            self._disk_full_logged = now
            log.error(
                "%s: %s; refusing writes until an append succeeds (%d refusals so far)",
                self.id,
                cause,
                self.stats["disk_full_refusals"],
            )
        err = self._storage_full()
        for p in self._queued:
            _fail(p.future, err)
        self._queued.clear()
        self._queued_entries = 0
        self._fail_proposed(f"node {self.id} could not write the entries: {cause}; their outcome is unknown")
        applied = min(self._commit_index, self._log.last_index)
        self._core = self._new_core(self._meta.load_hard_state(), applied)
        self._quiet_until = now + self.config.raft.election_timeout_max_ms / 1000
        self._watch_role()

    def _leave_disk_full(self) -> None:
        log.warning("%s: an append succeeded again: accepting writes", self.id)
        self._disk_full = None

    def _storage_full(self) -> StorageFullError:
        return StorageFullError(
            f"node {self.id} refuses writes: {self._disk_full}. Free space in {self.config.data_dir}; the node "
            "accepts writes again as soon as an append succeeds"
        )

    def _persist_inline(self, rd: Ready) -> bool:
        """Write this Ready on the event loop itself rather than in the I/O thread?

        Handing a write to the thread and back costs about as much as a small fdatasync here (a thread wake-up and
        the GIL), and that hand-off sits on every commit's critical path, on the leader and on the followers. So
        small appends are written inline while the disk is fast: the loop (and a leader's heartbeats) then waits
        for at most one fast write. Truncations, snapshots and large batches always go to the thread, and a slow
        write (EWMA above ``INLINE_MAX_PERSIST_S``) sends everything back to it until the disk is fast again."""
        return (
            rd.snapshot is None
            and rd.truncate_from is None
            and len(rd.frames) <= INLINE_MAX_BYTES
            and self._persist_ewma_s < INLINE_MAX_PERSIST_S
            and self._io_pending == 0  # the I/O thread is idle: the log keeps a single writer at a time
        )

    async def _on_io(self, fn: Callable, *args: object) -> object:
        """Run ``fn`` in the I/O thread; ``_io_pending`` counts jobs until they have really finished (a
        cancelled waiter does not end the job)."""
        loop = asyncio.get_running_loop()
        job = self._io.submit(fn, *args)
        self._io_pending += 1
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._io_finished))
        return await asyncio.wrap_future(job)

    def _io_finished(self) -> None:
        self._io_pending -= 1

    def _persist(self, rd: Ready) -> None:
        """Runs in the I/O thread: the only writer of the log and the metadata."""
        t0 = time.perf_counter()
        if rd.hard_state is not None:
            self._meta.save_hard_state(rd.hard_state)
        if rd.snapshot is not None:
            s = rd.snapshot
            self._log.reset_to_snapshot(s.index, s.term, s.chain_crc, s.end_pos)
        if rd.truncate_from is not None:
            self._log.truncate_suffix(rd.truncate_from)
        if rd.frames:
            try:
                self._log.append(rd.frames)
            except DiskFullError as e:  # rolled back by the store: the log is as it was before this append
                raise _AppendRefused(e) from e
            self._dirty_since_sync = True
        if self._sync_each_ready and (rd.frames or rd.truncate_from is not None):
            self._log.sync()
            self._dirty_since_sync = False
        self.stats["persists"] += 1
        took = time.perf_counter() - t0
        self._persist_ewma_s += (took - self._persist_ewma_s) / 8
        self.stats["persist_io_us"] += int(took * 1e6)
        self.metrics.persist.observe(took)

    def _dispatch(self, messages: tuple[Message, ...], waiters: list[_ReplyWaiter]) -> None:
        for m in messages:
            for w in waiters:
                if w.src == m.dst and isinstance(m, w.kind) and not w.replies:
                    w.replies.append(m)
                    break
            else:
                q = self._peer_queues.get(m.dst)
                if q is None:
                    log.warning("%s: dropping %s for unknown node %s", self.id, type(m).__name__, m.dst)
                else:
                    q.put_nowait(m)
        for w in waiters:
            if not w.future.done():
                w.future.set_result(w.replies)

    def _watch_role(self) -> None:
        """Appends waiting on a node that is no longer the leader of the term they were proposed in fail:
        proposed ones with "outcome unknown" (they may still commit), queued ones with "not leader"."""
        core = self._core
        role = core.role
        if self._proposed and (role is not Role.LEADER or core.term != self._leader_term):
            self._fail_proposed(
                f"node {self.id} lost leadership (now {role.value} at term {core.term}, "
                f"leader {core.leader_id or 'unknown'}): the outcome of the append is unknown"
            )
        if self._queued and role is not Role.LEADER:
            # Not proposed yet (e.g. they arrived while the previous write was in progress): nothing happened.
            err = self._not_leader()
            for p in self._queued:
                _fail(p.future, err)
            self._queued.clear()
            self._queued_entries = 0
        self._role = role
        if role is Role.LEADER:
            self._leader_term = core.term
        if (role, core.term) != self._seen_role_term:
            self._seen_role_term = (role, core.term)
            for listener in self._role_listeners:
                listener(role, core.term)

    def _fail_proposed(self, reason: str) -> None:
        while self._proposed:
            _fail(self._proposed.popleft().future, OutcomeUnknownError(reason))
        self._proposed_entries = 0
        if self._apply is not None:
            # Committed entries still apply here; only what may never commit is reported as unknown.
            self._apply.fail_pending(reason, above=self._commit_index)

    def _propose_queued(self) -> None:
        """Group commit: everything queued becomes one proposal (one write, one fsync, one AppendEntries)."""
        queued, self._queued = self._queued, []
        self._queued_entries = 0
        core = self._core
        if core.role is not Role.LEADER:
            for p in queued:
                _fail(p.future, self._not_leader())
            return
        bodies = [b for p in queued for b in p.bodies]
        try:
            proposed = core.propose(bodies, prepare=_combined_prepare(queued))
        except DLedgerError as e:
            for p in queued:
                _fail(p.future, e)
            return
        self._leader_term = proposed.term
        i = 0
        for p in queued:
            n = len(p.bodies)
            p.first_index = proposed.first_index + i
            p.term = proposed.term
            p.positions = proposed.positions[i : i + n]
            if p.want_results:
                p.applied = [self._apply.register(p.first_index + k, p.term) for k in range(n)]
            i += n
            self._proposed.append(p)
        self._proposed_entries += len(bodies)
        self.stats["proposals"] += 1
        self.stats["proposed_entries"] += len(bodies)

    # -- time --------------------------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.raft.tick_ms / 1000
        deadline = loop.time()
        while True:
            deadline += interval
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                # The loop stalled: drop the missed ticks instead of firing them in a burst.
                deadline = loop.time()
                await asyncio.sleep(0)
            if self._disk_full is not None and loop.time() < self._quiet_until:
                continue  # the disk just filled up: no election timeout runs (see _enter_disk_full)
            core = self._core  # rebuilt after a full disk
            core.tick()
            if core.has_ready():
                self._wake.set()

    async def _flusher(self) -> None:
        """The ``async`` flush policy: entries reach the page cache at once and the disk every interval.
        Under both policies, the commit index is checkpointed in the MetaStore (unsynced) for readers such
        as the audit; Raft itself does not need it."""
        interval = self.config.flush_interval_ms / 1000 if self.config.flush == "async" else 0.1
        while True:
            await asyncio.sleep(interval)
            if self._dirty_since_sync:
                self._dirty_since_sync = False
                await self._on_io(self._sync_and_checkpoint)
            elif self._commit_index > self._checkpointed_commit:
                await self._on_io(self._checkpoint_commit)

    def _sync_and_checkpoint(self) -> None:
        self._log.sync()
        self._checkpoint_commit()

    def _checkpoint_commit(self) -> None:
        c = self._commit_index
        if c > self._checkpointed_commit:
            self._meta.put(COMMIT_INDEX_KEY, str(c).encode())
            self._checkpointed_commit = c

    # -- peers: outbound ---------------------------------------------------------------------------------------

    async def _sender(self, peer: str, queue: asyncio.Queue) -> None:
        """Deliver messages to one peer in order. Everything queued while the previous write was in progress
        goes out as one pipe write (AppendEntries, heartbeats, answers); answers come back through
        ``_step_all``. Votes and TimeoutNow use their own unary calls, snapshots their own stream."""
        side: set[asyncio.Task] = set()
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                piped = []
                for m in batch:
                    if isinstance(m, RequestVote | TimeoutNow):
                        t = asyncio.create_task(self._call(m))
                    elif isinstance(m, InstallSnapshot):
                        t = asyncio.create_task(self._send_snapshot(m))
                    else:
                        piped.append(m)
                        continue
                    side.add(t)
                    t.add_done_callback(side.discard)
                if piped:
                    try:
                        await self._transport.deliver(peer, piped)
                    except PeerUnreachableError as e:
                        self._note_unreachable(e)
                        continue
                    self._unreachable_logged.pop(peer, None)
                    self.stats["pipe_writes"] += 1
                    self.stats["piped_messages"] += len(piped)
        finally:
            for t in side:
                t.cancel()

    async def _call(self, msg: Message) -> None:
        try:
            replies = await self._transport.call(msg)
        except PeerUnreachableError as e:
            self._note_unreachable(e)
            return
        self._unreachable_logged.pop(msg.dst, None)
        self._step_all(replies)

    async def _send_snapshot(self, msg: InstallSnapshot) -> None:
        """Stream the newest snapshot the log continues from (a node without a state machine sends the meta
        only: the follower's log restarts after the compaction point)."""
        chunks = None
        if self._state_machine is not None:
            sm_name = self._state_machine.name
            first = self._log.first_index
            try:
                info = await asyncio.get_running_loop().run_in_executor(
                    self._snap_io,
                    lambda: self.snapshots.latest(
                        usable=lambda s: s.state_machine == sm_name and s.index >= first - 1
                    ),
                )
            except SnapshotError as e:
                info = None
                log.error("%s: no intact snapshot to send to %s: %s", self.id, msg.dst, e)
            if info is None:
                self._step_all(
                    [SnapshotStatus(term=self._core.term, src=msg.dst, dst=self.id, success=False)]
                )
                return
            msg = InstallSnapshot(
                msg.term, msg.src, msg.dst, SnapshotMeta(info.index, info.term, info.chain_crc, info.end_pos)
            )
            chunks = self._snapshot_stream(info)
        try:
            replies = await self._transport.install_snapshot(msg, chunks)
        except PeerUnreachableError as e:
            self._note_unreachable(e)
            self._step_all([SnapshotStatus(term=self._core.term, src=msg.dst, dst=self.id, success=False)])
            return
        self._step_all(
            [*replies, SnapshotStatus(term=self._core.term, src=msg.dst, dst=self.id, success=True)]
        )

    def _step_all(self, messages: list[Message]) -> None:
        """Answers from peers (and local reports) go into the core; wake the ready loop if there is work."""
        if self._stopping or not messages:
            return
        for m in messages:
            self._step(m)
        if self._core.has_ready():
            self._wake.set()

    def _step(self, m: Message) -> None:
        """Step one message. A core that raises anything but a refusal has found broken safety (e.g. a log
        conflict below the commit index): the node stops rather than diverge."""
        try:
            self._core.step(m)
        except DLedgerError:
            raise
        except Exception as e:
            log.critical(
                "%s: the Raft core failed on %s; stopping the node", self.id, type(m).__name__, exc_info=e
            )
            self.failure = self.failure or e
            asyncio.get_running_loop().create_task(self.stop())
            raise UnavailableError(f"node {self.id} stopped: {e}") from e

    def _note_unreachable(self, e: PeerUnreachableError) -> None:
        now = time.monotonic()
        last = self._unreachable_logged.get(e.peer)
        if last is None or now - last > 5.0:
            self._unreachable_logged[e.peer] = now
            log.warning("%s: %s", self.id, e)

    # -- peers: inbound (PeerHandler) --------------------------------------------------------------------------

    def _check_sender(self, msg: Message) -> None:
        """Only the group's other voters may speak Raft to this node: a stray process (a node of another
        group, a tool, a fuzzer) is refused before the core sees anything."""
        if msg.dst != self.id:
            raise InvalidRequestError(
                f"message for {msg.dst} delivered to {self.id}: check the peer addresses"
            )
        if msg.src == self.id or msg.src not in self.config.peers:
            raise InvalidRequestError(
                f"{type(msg).__name__} from {msg.src!r}, which is not a member of group {self.group} "
                f"(members: {', '.join(sorted(self.config.peers))}): refused"
            )

    async def handle_message(self, msg: Message) -> list[Message]:
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        self._check_sender(msg)
        core = self._core
        if core is None:
            raise UnavailableError(f"node {self.id} is starting")
        kind = _RESPONSE_TO.get(type(msg))
        self._step(msg)
        self._wake.set()
        if kind is None:
            return []  # a response delivered one way: nothing answers it
        w = _ReplyWaiter(msg.src, kind, asyncio.get_running_loop().create_future())
        self._reply_waiters.append(w)
        return await w.future

    async def handle_batch(self, messages: list[Message]) -> list[Message]:
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        core = self._core
        if core is None:
            raise UnavailableError(f"node {self.id} is starting")
        waiters = []
        loop = asyncio.get_running_loop()
        for msg in messages:
            self._check_sender(msg)
        for msg in messages:
            self._step(msg)
            kind = _RESPONSE_TO.get(type(msg))
            if kind is not None:
                w = _ReplyWaiter(msg.src, kind, loop.create_future())
                self._reply_waiters.append(w)
                waiters.append(w.future)
        self._wake.set()
        if not waiters:
            return []
        return [r for rs in await asyncio.gather(*waiters) for r in rs]

    async def handle_snapshot(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk]
    ) -> list[Message]:
        """Install the snapshot's data into the state machine first (verified; nothing changes if the transfer
        breaks), then step the meta into the core, which restarts the log after it."""
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        if self._core is None:
            raise UnavailableError(f"node {self.id} is starting")
        await self._install_snapshot_data(msg, chunks.__aiter__())
        return await self.handle_message(msg)

    # -- clients (ClientHandler) -------------------------------------------------------------------------------

    def _not_leader(self) -> NotLeaderError | UnavailableError:
        """Not the leader: point at the one we know (FAILED_PRECONDITION), or UNAVAILABLE when none is known."""
        core = self._core
        leader = core.leader_id if core is not None else None
        if leader and leader != self.id:
            addr = self.config.peers.get(leader, "?")
            return NotLeaderError(
                leader, f"node {self.id} is not the leader; the leader is {leader} at {addr}"
            )
        return UnavailableError(
            f"node {self.id} is not the leader and no leader is known (an election is under way or there is "
            "no quorum); retry shortly"
        )

    def address_of(self, node_id: str) -> str | None:
        return self.config.peers.get(node_id)

    def leader_address(self) -> str | None:
        leader = self._core.leader_id if self._core is not None else None
        return self.config.peers.get(leader) if leader else None

    async def append(self, bodies: list[bytes], prepare: Prepare | None = None) -> AppendedRun:
        """Append bodies as consecutive entries; resolves once they are committed (and synced under ``sync``).

        ``prepare(index, pos, body)`` may fill in what depends on an entry's place (see ``RaftCore.propose``)."""
        return await self._enqueue(bodies, prepare, want_results=False).future

    async def submit(
        self, bodies: list[bytes], prepare: Prepare | None = None
    ) -> list[Applied | BaseException]:
        """Append bodies and wait until the state machine has applied them; one outcome per body: an
        ``Applied`` carrying the state machine's result, or the error it returned for that entry.

        Raises like ``append`` when the entries did not commit (not leader, outcome unknown, ...)."""
        if self._apply is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine")
        p = self._enqueue(bodies, prepare, want_results=True)
        try:
            await p.future
        except BaseException:
            for f in p.applied:  # they fail too ("outcome unknown"); the caller has its answer already
                f.add_done_callback(_retrieve)
            raise
        return list(await asyncio.gather(*p.applied, return_exceptions=True))

    def _enqueue(self, bodies: list[bytes], prepare: Prepare | None, want_results: bool) -> _PendingAppend:
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        if not bodies:
            raise InvalidRequestError("empty batch: an append needs at least one body")
        limit = self.config.max_body_bytes
        for i, b in enumerate(bodies):
            if len(b) > limit:
                raise InvalidRequestError(
                    f"body {i} has {len(b)} bytes; the limit is {limit} (max_body_bytes)"
                )
        if len(bodies) > self.config.max_pending_entries:
            raise InvalidRequestError(
                f"a batch of {len(bodies)} bodies can never fit: at most {self.config.max_pending_entries} "
                "entries may wait to commit (max_pending_entries); split it"
            )
        core = self._core
        if core.role is not Role.LEADER:
            raise self._not_leader()
        if self._disk_full is not None:
            raise self._storage_full()
        pending = self._queued_entries + self._proposed_entries
        if pending + len(bodies) > self.config.max_pending_entries:
            raise BackpressureError(
                f"{pending} entries are waiting to commit (limit {self.config.max_pending_entries}); "
                "back off and retry"
            )
        p = _PendingAppend(list(bodies), asyncio.get_running_loop().create_future(), prepare, want_results)
        self._queued.append(p)
        self._queued_entries += len(bodies)
        self._wake.set()
        return p

    def get(self, index: int) -> Entry:
        commit = self._commit_index
        if index < 0:
            raise InvalidRequestError(f"index must be >= 0, got {index}")
        if index > commit:
            raise NotFoundError(
                f"index {index} is not committed on node {self.id} (commit index {commit}); "
                "retry later or ask the leader"
            )
        try:
            return self._log.entry(index)
        except Compacted:
            raise NotFoundError(
                f"index {index} was compacted on node {self.id} (first index {self._log.first_index})"
            ) from None
        except IndexOutOfRange as e:
            raise NotFoundError(f"index {index} is not held by node {self.id}: {e}") from None

    def metadata(self) -> NodeInfo:
        st = self._core.status()
        leader = st.leader
        return NodeInfo(
            group=self.group,
            node_id=self.id,
            address=self.config.address,
            role=_ROLE_NAMES.get(st.role, str(st.role)),
            term=st.term,
            leader_id=leader,
            leader_address=self.config.peers.get(leader) if leader else None,
            last_index=st.last_index,
            commit_index=self._commit_index,  # what this node holds in storage and serves (core may be ahead)
            applied_index=self._apply.applied_index if self._apply is not None else self._commit_index,
            peers=tuple(
                PeerInfo(p, a, st.match.get(p, -1) if st.role is Role.LEADER else -1)
                for p, a in sorted(self.config.peers.items())
            ),
            data_dir=str(self.config.data_dir),
            pid=os.getpid(),
            flush=self.config.flush,
        )

    async def transfer_leadership(self, target: str) -> str:
        core = self._core
        if target not in self.config.peers:
            raise InvalidRequestError(
                f"unknown node {target!r}; members: {', '.join(sorted(self.config.peers))}"
            )
        if core.role is not Role.LEADER:
            raise self._not_leader()
        if target == self.id:
            return self.id
        core.transfer_leadership(target)
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * self.config.raft.election_timeout_max_ms / 1000
        while loop.time() < deadline:
            if core.leader_id == target or (core.role is not Role.LEADER and core.leader_id):
                return core.leader_id
            await asyncio.sleep(self.config.raft.tick_ms / 1000)
        raise UnavailableError(
            f"leadership transfer to {target} did not complete in time; {core.leader_id} leads"
        )

    # -- introspection -----------------------------------------------------------------------------------------

    @property
    def core(self):
        return self._core

    @property
    def log_store(self) -> LogStore:
        return self._log


def _combined_prepare(queued: list[_PendingAppend]) -> Prepare | None:
    """One prepare for a group-commit batch: each body goes through the prepare of the append it came from."""
    fns = [p.prepare for p in queued for _ in p.bodies]
    if not any(fns):
        return None
    first: list[int] = []

    def prepare(index: int, pos: int, body: bytes) -> bytes:
        if not first:
            first.append(index)
        fn = fns[index - first[0]]
        return body if fn is None else fn(index, pos, body)

    return prepare


def lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's exclusive lock (``node.lock``, released when the process ends, even by kill -9):
    two processes writing one log would corrupt it, so a second node on the same directory refuses to start,
    and ``dledger repair`` refuses a directory a node holds. The holder's pid is written into the file."""
    path = data_dir / "node.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryInUseError(
            f"the data directory {data_dir} is in use by another node process (pid {holder}); stop it first",
            holder,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _fail(fut: asyncio.Future, err: BaseException) -> None:
    if not fut.done():
        fut.set_exception(err)


async def run_node(config: NodeConfig) -> None:
    """Run one node in the foreground until SIGTERM/SIGINT (``dledger node``)."""
    node = Node(config)
    await node.start()
    node.install_signal_handlers()
    await node.wait_stopped()
    if node.failure is not None:
        raise UnavailableError(
            f"node {config.node_id} stopped after a failure: {node.failure!r}"
        ) from node.failure
