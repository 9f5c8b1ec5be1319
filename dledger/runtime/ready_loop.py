"""The ready loop: the only place that performs the core's work, persist before send.

For each ``Ready``, strictly in order: persist (hard state, snapshot reset, truncation, append + fsync per flush
policy), then send the messages, then hand on what committed, then ``core.advance(ready)``. Persist before send
is enforced here and nowhere else (one exception: a leader's own AppendEntries leave while it writes the same
entries, see ``dledger.core.messages.split_early``).

Writes go to the I/O thread, except appends up to ``INLINE_MAX_BYTES`` while the disk is fast and that thread idle
(``persist_inline``); a leader under the ``sync`` policy then waits for that write's fdatasync on the thread, its
loop serving calls meanwhile (``sync_written``). A full disk makes the node refuse writes rather than stop
(``_enter_disk_full``); the next append that succeeds lifts the refusal. The flusher makes ``async``-policy writes
durable every interval and records the commit index at most every ``COMMIT_CHECKPOINT_S``.

A leader also hands on a commit outside the Ready order, in the turn that steps the follower's acknowledgement
(``commit_acked``, docs/send-budget.md fix 3): a ready-loop turn fewer on every commit. It is bounded by
``persisted_index``, so a leader's own entry still counts toward its commit only once its write completed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable

from dledger import timeline
from dledger.core.messages import Ready, Role, split_early
from dledger.core.raft import RaftCore
from dledger.errors import StorageFullError
from dledger.metrics import NodeMetrics
from dledger.nodeconfig import NodeConfig
from dledger.runtime.datadir import SNAPSHOT_CONF_KEY, DataDir
from dledger.runtime.iothread import IoThread
from dledger.runtime.peers import Peers, ReplyWaiter
from dledger.runtime.proposals import Proposals
from storage.api import LogStore, MetaStore
from storage.errors import DiskFullError

# Appends up to this size are written on the event loop while writes take less than this on average. 1 MiB holds a
# Raft round of 64 concurrent 1 KiB messages (about 85 KB) and a broker batch of 256 (about 340 KB): handing those
# to the I/O thread and back cost more than the write (docs/decisions/0006-small-writes-inline.md, 2026-11-28).
INLINE_MAX_BYTES = 1 << 20
INLINE_MAX_PERSIST_S = 0.002
# A write or fdatasync slower than SLOW_PERSIST_S marks the disk slow for SLOW_DISK_HOLD_S: a follower then waits
# for its fdatasync off its event loop, and goes on answering its leader's heartbeats meanwhile (stalls come in
# spells; docs/decisions/0031-heartbeats-during-a-stalled-write.md).
SLOW_PERSIST_S = 0.05
SLOW_DISK_HOLD_S = 30.0
SLOW_PERSIST_WARN_S = 1.0  # and one this slow is logged as a warning
# The flusher records the commit index in the MetaStore at most this often: each record is an LMDB commit, which
# LMDB syncs (about 55 us of CPU and an fdatasync on this machine); at the ``async`` policy's 10 ms interval it
# would be a hundred a second on every node.
COMMIT_CHECKPOINT_S = 0.1
log = logging.getLogger("dledger.runtime")


class AppendRefused(Exception):
    """The log store refused an append for want of space and rolled it back (raised from ``persist``)."""

    def __init__(self, cause: DiskFullError):
        super().__init__(str(cause))
        self.cause = cause


class ReadyLoop:
    """Drives one core. What it hands on goes through explicit seams: ``proposals`` (group commit, failing
    appends), ``peers`` (answers and outbound messages), ``committed(index)`` (the node's commit seam),
    ``read_states(states)``, ``watch_role()`` (after each Ready), ``rebuild_core()`` (a full disk: a core
    rebuilt from what storage holds) and ``calls_waiting()`` (clients' calls waiting here on the leader).
    ``commit_index`` is the highest index committed *and* persisted here; ``persisted_index`` the last index of
    the log as of the last completed write (synced under ``sync``)."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        data: DataDir,
        io_thread: IoThread,
        core: RaftCore,
        *,
        wake: asyncio.Event,
        proposals: Proposals,
        peers: Peers,
        committed: Callable[[int], None],
        read_states: Callable[[tuple[tuple[int, int], ...]], None],
        watch_role: Callable[[], None],
        rebuild_core: Callable[[int], RaftCore],
        stats: collections.Counter[str],
        metrics: NodeMetrics,
        calls_waiting: Callable[[], int],
    ):
        self.id = node_id
        self.config = config
        self._data = data
        log_store, meta_store = data.log, data.meta
        assert log_store is not None and meta_store is not None, (
            "the ready loop starts once the stores are open"
        )
        self._log: LogStore = log_store
        self._meta: MetaStore = meta_store
        self._io = io_thread
        self.core = core
        self._wake = wake
        self._proposals = proposals
        self._peers = peers
        self._committed = committed
        self._read_states = read_states
        self._watch_role = watch_role
        self._rebuild_core = rebuild_core
        self._calls_waiting = calls_waiting
        self.stats = stats
        self.metrics = metrics
        self.commit_index = -1
        self.persisted_index = log_store.last_index  # what storage held at start is persisted
        self._dirty_since_sync = False
        self._persist_ewma_s = 0.0  # recent time per persist (decides inline writes on followers)
        self.slow_disk_until = 0.0  # monotonic time until which the disk counts as slow (SLOW_PERSIST_S)
        self.disk_full: str | None = None  # why writes are refused (a full disk), until a write succeeds
        self.quiet_until = 0.0  # loop time before which a node whose disk filled up does not campaign
        self._disk_full_logged = 0.0
        self._flush_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{node_id}-flush")

    async def run(self) -> None:
        core = self.core
        proposals = self._proposals
        peers = self._peers
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                if proposals.queued:
                    proposals.propose_queued()
                if not core.has_ready():
                    # Messages stepped since the last Ready produced nothing to answer (e.g. a stale term).
                    for w in peers.take_waiters():
                        if not w.future.done():
                            w.future.set_result([])
                    break
                rd = core.ready()
                timeline.mark("ready")
                waiters = peers.take_waiters()
                # 0. a leader's own replication goes out while it writes the same entries (split_early).
                early, messages = split_early(rd, core.role)
                if early:
                    peers.dispatch(early, [])
                # 1. persist. Nothing below runs until storage has it (fsync per flush policy).
                if (
                    rd.hard_state is not None
                    or rd.snapshot is not None
                    or rd.truncate_from is not None
                    or rd.frames
                ):
                    t0 = time.perf_counter()
                    inline = self.persist_inline(rd)
                    if inline and early:
                        await asyncio.sleep(0)  # the senders put the early AppendEntries on the wire first
                        inline = self._io.pending == 0
                    try:
                        if inline:
                            if (
                                self._data.sync_each_ready
                                and rd.frames
                                and (
                                    core.role is Role.LEADER
                                    or self._calls_waiting()
                                    or time.monotonic() < self.slow_disk_until
                                )
                            ):
                                # A leader under ``sync``: the write inline, its fdatasync on the I/O thread, so
                                # that the loop takes the next calls meanwhile (decision 0006, 2026-11-28 night);
                                # a follower too while clients' calls wait on it for the leader (decision 0029),
                                # or while its disk is slow: it answers heartbeats meanwhile (decision 0031).
                                self.persist(rd, sync=False)
                                await self._io.run(self.sync_written)
                            else:
                                self.persist(rd)
                            self.stats["persists_inline"] += 1
                        else:
                            await self._io.run(self.persist, rd)
                    except AppendRefused as e:
                        # Nothing this Ready asked for is sent, committed or advanced: the core is rebuilt
                        # from what storage holds, exactly as a restart would find it.
                        _answer_nothing(waiters)
                        self._enter_disk_full(e.cause)
                        core = self.core
                        continue
                    timeline.mark("persisted")
                    if rd.frames and self.disk_full is not None:
                        self._leave_disk_full()
                    self.stats["persist_wait_us"] += int((time.perf_counter() - t0) * 1e6)
                # 2. send (answers ride back on the calls that asked; the rest go through the senders).
                peers.dispatch(messages, waiters)
                # 3. hand on what committed.
                if rd.commit_index > self.commit_index:
                    timeline.mark("commit")
                    self.commit_index = rd.commit_index
                    self._committed(rd.commit_index)
                self.commit_acked()  # acknowledgements stepped while this Ready was written
                if rd.read_states:
                    self._read_states(rd.read_states)
                self._watch_role()
                # 4. tell the core its work was done.
                core.advance(rd)

    def commit_acked(self) -> None:
        """Hand on what a leader's core committed, up to what this node has persisted, now: called right after
        stepping peers' answers (``Peers.step_all``) and after each Ready.

        Without it a follower's acknowledgement that commits an entry wakes the ready loop, and the append is
        answered one loop turn later, from the next Ready (docs/send-budget.md, fix 3). The core counts a
        leader's own entries toward commit as soon as it proposed them (``_maybe_commit``); the runtime keeps
        the rule that an entry is persisted on the leader before it commits there by taking the minimum with
        ``persisted_index``, which ``persist`` raises only once a write is complete. Only a leader: its log is
        never truncated, so every index up to ``persisted_index`` holds the entry its core commits (a
        follower's store may still hold a suffix its core has replaced but not yet truncated)."""
        core = self.core
        if core.role is not Role.LEADER:
            return
        c = min(core.commit_index, self.persisted_index)
        if c > self.commit_index:
            timeline.mark("commit")
            self.commit_index = c
            self._committed(c)
            self.stats["commits_at_ack"] += 1

    async def ticker(self) -> None:
        """``core.tick()`` every ``tick_ms``. Missed ticks are dropped, never replayed in a burst: a loop stall
        must not look like a silent leader."""
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
            if self.disk_full is not None and loop.time() < self.quiet_until:
                continue  # the disk just filled up: no election timeout runs (see _enter_disk_full)
            core = self.core  # rebuilt after a full disk
            core.tick()
            if core.writing:  # a slow write holds the Ready: heartbeats leave now (decision 0031)
                self._peers.send_heartbeats(core.take_heartbeats())
            elif core.has_ready():
                self._wake.set()

    # -- persisting --------------------------------------------------------------------------------------------

    def persist_inline(self, rd: Ready) -> bool:
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
            and self._io.pending == 0  # the I/O thread is idle: the log keeps a single writer at a time
        )

    def persist(self, rd: Ready, sync: bool = True) -> None:
        """Runs in the I/O thread (or inline, see ``persist_inline``): the only writer of the log and the
        metadata. ``sync=False``: the caller runs ``sync_written`` next (the ``sync`` policy's fdatasync)."""
        t0 = time.perf_counter()
        if rd.hard_state is not None:
            self._meta.save_hard_state(rd.hard_state)
        if rd.snapshot is not None:
            s = rd.snapshot
            if s.conf is not None:  # the configuration survives the entries the snapshot replaces
                self._meta.put(SNAPSHOT_CONF_KEY, s.conf.encode(), sync=True)
            self._log.reset_to_snapshot(s.index, s.term, s.chain_crc, s.end_pos)
        if rd.truncate_from is not None:
            self._log.truncate_suffix(rd.truncate_from)
        if rd.frames:
            try:
                self._log.append(rd.frames)
            except DiskFullError as e:  # rolled back by the store: the log is as it was before this append
                raise AppendRefused(e) from e
            self._dirty_since_sync = True
        if not sync:
            return
        if self._data.sync_each_ready and (rd.frames or rd.truncate_from is not None):
            self._log.sync()
            self._dirty_since_sync = False
        self._persisted(t0)

    def sync_written(self) -> None:
        """The ``sync`` policy's fdatasync of what ``persist(rd, sync=False)`` wrote (on the I/O thread)."""
        t0 = time.perf_counter()
        self._log.sync()
        self._dirty_since_sync = False
        self._persisted(t0)

    def _persisted(self, t0: float) -> None:
        self.persisted_index = self._log.last_index  # complete (and synced under ``sync``): see commit_acked
        self.stats["persists"] += 1
        took = time.perf_counter() - t0
        self._persist_ewma_s += (took - self._persist_ewma_s) / 8
        if took > SLOW_PERSIST_S:
            if time.monotonic() >= self.slow_disk_until:
                # INFO: a virtual disk's first writes often take this long; a write of a second or more, as
                # etcd's "slow fdatasync", is worth an operator's look.
                log.log(
                    logging.WARNING if took >= SLOW_PERSIST_WARN_S else logging.INFO,
                    "%s: a write took %.0f ms; for %.0f s this node waits for its disk off its event loop",
                    self.id,
                    took * 1e3,
                    SLOW_DISK_HOLD_S,
                )
            self.slow_disk_until = time.monotonic() + SLOW_DISK_HOLD_S
            self.stats["slow_writes"] += 1
        self.stats["persist_io_us"] += int(took * 1e6)
        self.metrics.persist.observe(took)

    async def flusher(self) -> None:
        """The ``async`` flush policy: entries reach the page cache at once and the disk every interval.
        Under both policies, the commit index is checkpointed in the MetaStore, at most every
        ``COMMIT_CHECKPOINT_S``, for readers such as the audit; Raft itself does not need it."""
        interval = self.config.flush_interval_ms / 1000 if self.config.flush == "async" else 0.1
        data = self._data
        loop = asyncio.get_running_loop()
        checkpointed_at = loop.time()
        while True:
            await asyncio.sleep(interval)
            # On the flush thread, not the I/O thread: an fdatasync there would count as pending I/O and send
            # every append of its window to the I/O thread behind it. ``log.sync`` is safe beside a writer (it
            # syncs duplicated descriptors) and LMDB serialises its write transactions itself.
            # Read before the sync: every entry up to it is written, so the sync makes it durable, and a record
            # never names a commit the disk may not hold after a power cut.
            commit = self.commit_index
            # Under ``sync`` the ready loop syncs every write itself (``persist``, ``sync_written``); a flag seen
            # set here is a write whose sync is on its way.
            if self._dirty_since_sync and not data.sync_each_ready:
                self._dirty_since_sync = False
                await loop.run_in_executor(self._flush_thread, data.sync_log)
            now = loop.time()
            if now - checkpointed_at >= COMMIT_CHECKPOINT_S and commit > data.checkpointed_commit:
                checkpointed_at = now
                await loop.run_in_executor(self._flush_thread, data.checkpoint_commit, commit)

    def shutdown(self) -> None:
        """Wait for a flush in progress (before the stores close)."""
        self._flush_thread.shutdown(wait=True)

    # -- a full disk -------------------------------------------------------------------------------------------

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
        now = asyncio.get_running_loop().time()
        first = self.disk_full is None
        self.disk_full = str(cause)
        self.stats["disk_full_refusals"] += 1
        if first or now - self._disk_full_logged > 10:
            self._disk_full_logged = now
            log.error(
                "%s: %s; refusing writes until an append succeeds (%d refusals so far)",
                self.id,
                cause,
                self.stats["disk_full_refusals"],
            )
        self._proposals.fail_queued(self.storage_full())
        self._proposals.fail_proposed(
            f"node {self.id} could not write the entries: {cause}; their outcome is unknown",
            self.commit_index,
        )
        self.core = self._rebuild_core(min(self.commit_index, self._log.last_index))
        self.quiet_until = now + self.config.raft.election_timeout_max_ms / 1000
        self._watch_role()

    def _leave_disk_full(self) -> None:
        log.warning("%s: an append succeeded again: accepting writes", self.id)
        self.disk_full = None

    def storage_full(self) -> StorageFullError:
        return StorageFullError(
            f"node {self.id} refuses writes: {self.disk_full}. Free space in {self.config.data_dir}; the node "
            "accepts writes again as soon as an append succeeds"
        )

    def refusal(self) -> StorageFullError | None:
        """The error to refuse a client's write with, if writes are refused."""
        return self.storage_full() if self.disk_full is not None else None


def _answer_nothing(waiters: list[ReplyWaiter]) -> None:
    for w in waiters:
        if not w.future.done():
            w.future.set_result([])  # no answer: to the sender, a lost message
