"""The broker's state machine: committed entries become ConsumeQueue units, topics and consumer offsets.

Every node runs it on the same committed entries in the same order, so queue offsets, topics and committed
consumer offsets are identical on every node across any number of failovers. The leader chose each message's
queue offset (dense per queue) and wrote it into the message before proposing; dispatching checks that the
offset continues its queue and writes the unit. Replaying entries that were already dispatched (a restart from an
older snapshot) finds the existing unit, checks it points at the same position, and moves on: dispatch is
idempotent, which is what makes ConsumeQueues repairable from the log.

Idempotent producers: a message carrying PRODUCER_ID / PRODUCER_SEQ properties is recorded per producer (the
highest sequence and a bounded window of recent results). The table is derived from the log alone, so every node
holds the same one and it survives failovers and restarts (it is part of the snapshot). The leader consults it
(with the allocator's view of the uncommitted tail) before appending a send, so a retried send is answered with
the original result instead of being stored twice; ``duplicates`` counts any that got through anyway.

Delivery state (docs/rocketmq.md, Delivery): consumer-group settings (FIFO, attempts, backoff), the timer index of
delayed messages (``timer``), open transactions (``transactions``) and the pop state's dead letters. A message
dispatched to the timer or half topic opens an entry; a copy the leader made of it (a due timer message, a
committed half message, a dead letter) carries ``message.PROPERTY_ORIGIN`` and ends its entry when dispatched, so
the copy and the state change are one log entry. ``repeats`` counts copies whose entry had already ended: a
leader's mistake for timer and half copies (should stay 0), or, for a dead letter, a consumer's late ack of its
last delivery that raced the move (the message was then both processed and dead-lettered: at least once).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from array import array
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from broker_adapter.core import commands, groups, message
from broker_adapter.core.consumequeue import (
    OPEN_FILES,
    UNIT,
    UNIT_SIZE,
    UNITS_PER_FILE,
    ConsumeQueue,
    OpenFiles,
    holds,
)
from broker_adapter.core.invisibility import PopStates
from broker_adapter.core.keyindex import KeyIndex
from broker_adapter.core.timer import TimerIndex, Waiting
from broker_adapter.core.topics import DLQ_PREFIX, HALF_TOPIC, TIMER_TOPIC
from broker_adapter.core.transactions import COMMIT, DEFAULT_IMMUNITY_MS, ROLLBACK, Half, HalfMessages
from statemachine.api import CommittedEntry
from storage.codec import HEADER_SIZE
from storage.fileio import is_disk_full

log = logging.getLogger(__name__)

PRODUCER_WINDOW: Final = 4096  # results remembered per producer for answering retried sends
POSITIONS_KEPT: Final = 1 << 17  # recent messages whose CommitLog offset -> index stays in memory (2-4 MiB)
# A replay (a restart from a snapshot older than the queues) checks the units a queue already holds: read
# REPLAY_UNITS of them at once instead of one ``pread`` per message, and keep the last REPLAY_READS such reads
# (20 KiB each, 5 MiB at most).
REPLAY_UNITS: Final = 1024
REPLAY_READS: Final = 256


class DispatchError(RuntimeError):
    """A committed message does not fit its ConsumeQueue: the node's derived state disagrees with the log."""


@dataclass(slots=True)
class Dispatched:
    """Where a message is. Not frozen: see ``formats.Route``."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int


@dataclass(slots=True)
class ProducerState:
    """What the log says about one idempotent producer: its highest sequence and recent results by sequence."""

    last_seq: int = -1
    recent: dict[int, Dispatched] = field(default_factory=dict)
    order: deque[int] = field(default_factory=deque)  # sequences of ``recent`` in log order

    def record(self, seq: int, d: Dispatched) -> None:
        if seq > self.last_seq:  # the usual case: a sequence above every one recorded is not in ``recent``
            self.last_seq = seq
            self.order.append(seq)
        elif seq not in self.recent:
            self.order.append(seq)
        self.recent[seq] = d
        if len(self.order) > PRODUCER_WINDOW:
            del self.recent[self.order.popleft()]  # the oldest in log order: the same on every node


class BrokerStateMachine:
    name = "broker"

    def __init__(
        self,
        consumequeue_root: str | Path,
        units_per_file: int = UNITS_PER_FILE,
        on_dispatch: Callable[[str, int, int], None] | None = None,
        tx_immunity_ms: int = DEFAULT_IMMUNITY_MS,
        open_files: int = OPEN_FILES,
        index_dir: str | Path | None = None,
    ):
        self.tx_immunity_ms = tx_immunity_ms  # a half message's first check-back: the same on every node
        self.root = Path(consumequeue_root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._units_per_file = units_per_file
        self.topics: dict[str, int] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.next_offsets: dict[
            tuple[str, int], int
        ] = {}  # per queue: the offset the next message must carry
        self.producers: dict[str, ProducerState] = {}
        # On the leader, the route of each message its allocator placed, by index: (term, route with its
        # offsets), so dispatching the entry reads nothing of it again. The same (index, term) is the same entry
        # on every node (Raft's log matching); any other entry at that index is read from its bytes.
        self.placed: dict[int, tuple[int, message.Route]] = {}
        # RocketMQ 5 consumption (receive / ack / change invisible duration): replicated like everything else.
        self.pops = PopStates()
        self.groups: dict[str, groups.GroupSettings] = {}
        self.timer = TimerIndex()
        self.halves = HalfMessages()
        self.repeats = 0  # broker copies whose origin had already ended: should stay 0
        # (half message, the leader's time of the check): a transaction check-back was counted (a side effect
        # for the node's own clients, never state)
        self.on_tx_check: Callable[[Half, int], None] | None = None
        self.applied_index = -1  # the last entry given to ``apply`` (with the apply loop's, after a restore)
        self.duplicates = 0  # messages whose (producer, sequence) was already in the log: should stay 0
        self.short_queues: dict[tuple[str, int], int] = {}  # after a snapshot: queues with a hole to repair
        # CommitLog offset -> index for the last POSITIONS_KEPT to 2 * POSITIONS_KEPT messages dispatched
        # (positions grow with the index); older ones are found in the log (``CommitLog.locate``).
        self._positions = array("q")
        self._indices = array("q")
        # Queues opened since start: a queue is opened at its first use, not at start (there may be 80,000).
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._files = OpenFiles(limit=open_files)
        self._log_end: int | None = None  # the log's end at start: units at or past it are cut at first open
        self._unwritten: list[ConsumeQueue] = []  # queues with units appended in this apply, not yet written
        self._to_index: list[tuple[int, bytes | None, bytes | None]] = []  # this apply's (pos, id, keys)
        self._unsynced: list[str] = []  # ConsumeQueue files a failed snapshot sync did not make durable
        # The units a replay read ahead, per queue: (first queue offset, the queue's ``rewrites`` then, bytes).
        self._replayed: OrderedDict[ConsumeQueue, tuple[int, int, bytes]] = OrderedDict()
        self._on_dispatch = on_dispatch  # (topic, queue_id, next queue offset): wakes long-polling pulls
        # Administration (docs/broker.md, Administration): deleted topics (topic -> the deleting entry's index;
        # a send to one is refused until it is created again), run-time settings set through the log (JSON
        # values by key, over the node config's [broker] table) and who is told when they change.
        self.deleted_topics: dict[str, int] = {}
        self.config: dict[str, Any] = {}
        self.on_config: Callable[[dict[str, Any]], None] | None = None
        self.on_topics: Callable[[], None] | None = None  # a topic was created or deleted
        # The key and message-id index, maintained at dispatch (None: not kept, as in unit tests).
        self.keyindex: KeyIndex | None = None if index_dir is None else KeyIndex(index_dir)

    # -- retention (broker_adapter/core/retention.py; set by the plugin when a policy is configured) ---------------
    retention: Any = None

    def retain_from(self) -> int | None:
        """The first log index retention keeps, for the runtime's compaction; None: no retention policy."""
        return None if self.retention is None else self.retention.retain_from()

    def queues_to_trim(self) -> list[tuple[str, int, ConsumeQueue, int]]:
        """The queues retention may delete a file of: (topic, queue id, its ConsumeQueue, its next offset).
        Retention never deletes a queue's last file, so a queue whose units fit in its first file is left out,
        unopened: a node may hold 80,000 queues, and opening every one (a directory listing and a ``stat``)
        at each move of the log's start held the event loop for seconds."""
        per_file = self._units_per_file
        return [
            (t, q, self.queue(t, q), end)
            for t, n in self.topics.items()
            for q in range(n)
            if (end := self.next_offset(t, q)) > per_file
        ]

    # -- queues --------------------------------------------------------------------------------------------
    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self._units_per_file, files=self._files)
            self._queues[key] = cq
            self._cut_past_log_end(cq)
        return cq

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.queue(topic, queue_id).max_offset

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offsets.get((group, topic, queue_id))

    def next_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next dispatched message of this queue carries (= messages dispatched so far)."""
        return self.next_offsets.get((topic, queue_id), 0)

    def index_of(self, commitlog_offset: int) -> int | None:
        """The entry index of a message dispatched since start, by its CommitLog offset (None if unknown)."""
        i = bisect_left(self._positions, commitlog_offset)
        if i < len(self._positions) and self._positions[i] == commitlog_offset:
            return self._indices[i]
        return None

    def group_settings(self, group: str) -> groups.GroupSettings:
        return self.groups.get(group, groups.DEFAULT)

    def sent(self, producer_id: str, seq: int) -> Dispatched | bool:
        """A committed send of (producer, seq): its result if remembered, True if older than the window, False
        if the log holds no such send."""
        st = self.producers.get(producer_id)
        if st is None or seq > st.last_seq:
            return False
        d = st.recent.get(seq)
        if d is not None:
            return d
        # Sequences may arrive out of order (concurrent sends) or never (a failed send): only a full window
        # says that a sequence below it was forgotten rather than never stored.
        return len(st.order) >= PRODUCER_WINDOW and seq < st.order[0]

    # -- apply ---------------------------------------------------------------------------------------------
    def apply(self, entries: Sequence[CommittedEntry]) -> list[Any]:
        results: list[Any] = []
        touched: set[tuple[str, int]] = set()
        try:
            for e in entries:
                body = e.body
                self.applied_index = e.index
                if commands.is_message(body):
                    d = self._dispatch(e)
                    if isinstance(d, Dispatched):
                        touched.add((d.topic, d.queue_id))
                    results.append(d)
                elif commands.is_command(body):
                    results.append(self._command(body))
                else:
                    results.append(
                        message.MessageFormatError(f"entry {e.index} is neither a message nor a command")
                    )
        finally:
            unwritten, self._unwritten = self._unwritten, []
            for cq in unwritten:  # the chunk's units: one write per queue (ConsumeQueue.append buffers them)
                try:
                    cq.write_appended()
                except OSError as e:  # a full disk: the units stay buffered, written by the next apply or
                    if not is_disk_full(e):  # read of the queue (which fails until then), not a stopped node
                        raise
                    self._unwritten.append(cq)
                    log.warning("%s: %s; its ConsumeQueue units wait in memory", cq.topic, e)
            to_index, self._to_index = self._to_index, []
            if self.keyindex is not None:
                self.keyindex.add_many(to_index)  # the chunk's messages in one loop
                self.keyindex.commit()
        if self._on_dispatch is not None:
            for topic, qid in touched:
                self._on_dispatch(topic, qid, self.next_offsets.get((topic, qid), 0))
        return results

    def _dispatch(self, e: CommittedEntry) -> Dispatched | message.MessageFormatError:
        placed = self.placed.pop(e.index, None) if self.placed else None
        if placed is not None and placed[0] == e.term:
            r = placed[1]
        else:
            try:
                r = message.peek_route(e.body)
            except message.MessageFormatError as err:
                return message.MessageFormatError(f"entry {e.index}: {err}; not dispatched")
        commitlog_offset = e.pos + HEADER_SIZE
        if r.physical_offset != commitlog_offset:
            # Not placed by the broker's allocator (which always writes PHYSICALOFFSET): e.g. bytes appended
            # through the raw DLedger API. Every node skips it the same way, so it cannot stop the group.
            return message.MessageFormatError(
                f"entry {e.index} carries PHYSICALOFFSET {r.physical_offset}, not its place {commitlog_offset}: "
                "not placed by the broker, not dispatched"
            )
        topic, queue_id = r.topic, r.queue_id
        queues = self.topics.get(topic)
        if queues is None:
            # Only the leader's auto-create path sends to a topic not yet created; every node does the same.
            self.topics[topic] = queue_id + 1
            self.deleted_topics.pop(topic, None)
        elif queue_id >= queues:
            self.topics[topic] = queue_id + 1
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            cq = self.queue(topic, queue_id)
        q = r.queue_offset
        expected = self.next_offsets.get(key, 0)
        if q != expected:
            raise DispatchError(
                f"{topic}/{queue_id}: entry {e.index} carries queue offset {q} but the queue's next offset is "
                f"{expected}: the leader allocated offsets that are not dense"
            )
        if q == cq.max_offset:
            if not cq.has_appended:
                self._unwritten.append(cq)
            cq.append(commitlog_offset, r.size, message.tags_code(r.tags))
        elif q < cq.max_offset:
            held_offset, held_size = self._held_unit(cq, q)
            if held_offset > commitlog_offset:
                # A replay (a restart from an older snapshot) of a message of a topic deleted and created again
                # since: the unit belongs to a later message of the new topic (positions grow in a queue). The
                # deletion, replayed later, removes this queue and the new topic's messages are dispatched again.
                self.next_offsets[key] = q + 1
                return Dispatched(topic, queue_id, q, commitlog_offset, r.size)
            if held_offset != commitlog_offset or held_size != r.size:
                raise DispatchError(
                    f"{topic}/{queue_id} offset {q}: ConsumeQueue points at {held_offset} "
                    f"(size {held_size}) but entry {e.index} puts the message at {commitlog_offset} (size {r.size})"
                )
        else:
            raise DispatchError(
                f"{topic}/{queue_id}: entry {e.index} carries queue offset {q} but the queue ends at "
                f"{cq.max_offset}; rebuild the ConsumeQueue from the log"
            )
        self.next_offsets[key] = q + 1
        positions = self._positions
        if not positions or commitlog_offset > positions[-1]:
            positions.append(commitlog_offset)
            self._indices.append(e.index)
            if len(positions) >= 2 * POSITIONS_KEPT:
                del positions[:POSITIONS_KEPT]
                del self._indices[:POSITIONS_KEPT]
        d = Dispatched(topic, queue_id, q, commitlog_offset, r.size)
        if r.uniq is not None or r.keys is not None:
            self._to_index.append((commitlog_offset, r.uniq, r.keys))
        ident = r.producer
        if ident is not None:
            pid, seq = ident
            st = self.producers.get(pid)
            if st is None:
                st = self.producers[pid] = ProducerState()
            elif seq <= st.last_seq and self.sent(pid, seq) is not False:  # (``sent`` is False above it)
                self.duplicates += 1
            st.record(seq, d)
        if r.topic == TIMER_TOPIC or r.topic == HALF_TOPIC:
            self._pending(e.body, r.topic, q)
        else:
            if r.origin is not None:
                self._origin(r.origin, r.topic)
        return d

    def _held_unit(self, cq: ConsumeQueue, q: int) -> tuple[int, int]:
        """(CommitLog offset, size) of the unit ``cq`` already holds at ``q`` (below its ``max_offset``), read
        ahead ``REPLAY_UNITS`` at a time: a replay meets a queue's units in order."""
        held = self._replayed.get(cq)
        if held is not None:
            first, rewrites, raw = held
            at = (q - first) * UNIT_SIZE
            if rewrites == cq.rewrites and 0 <= at < len(raw):
                commitlog_offset, size, _ = UNIT.unpack_from(raw, at)
                return commitlog_offset, size
        raw = cq.raw_units(q, REPLAY_UNITS)
        if not raw:
            raise IndexError(f"{cq.topic}/{cq.queue_id}: queue offset {q} not in [0, {cq.max_offset})")
        self._replayed[cq] = (q, cq.rewrites, raw)
        self._replayed.move_to_end(cq)
        if len(self._replayed) > REPLAY_READS:
            self._replayed.popitem(last=False)
        commitlog_offset, size, _ = UNIT.unpack_from(raw, 0)
        return commitlog_offset, size

    def index_message(self, body: bytes | memoryview, pos: int) -> None:
        """Add a message at CommitLog offset ``pos`` to the key index (dispatch, and the index's catch-up)."""
        assert self.keyindex is not None
        self.keyindex.add_raw(pos, *message.peek_id_and_keys(body))

    def _pending(self, body: bytes | memoryview, topic: str, offset: int) -> None:
        """A timer or half message: index it (a malformed one is kept out of the index on every node alike)."""
        p = message.peek_properties(body)
        try:
            real_topic = p[message.PROPERTY_REAL_TOPIC]
            real_qid = int(p.get(message.PROPERTY_REAL_QUEUE_ID, "0"))
            if topic == TIMER_TOPIC:
                self.timer.add(
                    Waiting(offset, int(p[message.PROPERTY_TIMER_DELIVER_MS]), real_topic, real_qid)
                )
            else:
                stored = message.peek_store_timestamp(body)
                immunity = int(p.get(message.PROPERTY_CHECK_IMMUNITY_S, "0")) * 1000 or self.tx_immunity_ms
                self.halves.add(
                    Half(
                        offset,
                        stored,
                        real_topic,
                        real_qid,
                        p.get(message.PROPERTY_PRODUCER_GROUP, ""),
                        p.get(message.PROPERTY_UNIQ_KEY, ""),
                        0,
                        stored + immunity,
                    )
                )
        except (KeyError, ValueError):
            self.repeats += 1

    def _origin(self, origin: str, topic: str) -> None:
        """A copy the leader made: end what it names."""
        kind, _, rest = origin.partition("/")
        try:
            if kind == "timer":
                ended = self.timer.remove(int(rest)) is not None
            elif kind == "half":
                ended = self.halves.end(int(rest), COMMIT) is not None
            elif kind == "dlq":
                qid, offset, epoch, src = rest.split("/", 3)
                group = topic.removeprefix(DLQ_PREFIX)
                ended = self.pops.dead(group, src, int(qid), int(offset), int(epoch))
                self._follow_low((group, src, int(qid)))
            elif kind == "retry":
                ended = True  # a dead letter of an offset consumer's "later": nothing was open
            else:
                ended = False
        except ValueError:
            ended = False
        if not ended:
            self.repeats += 1

    def _follow_low(self, key: tuple[str, str, int]) -> None:
        q = self.pops.get(key)
        if q is not None and q.low != self.offsets.get(key, 0):
            self.offsets[key] = q.low  # the group's committed offset follows its acknowledgements

    def _command(self, body: bytes | memoryview) -> Any:
        try:
            cmd = commands.decode(body)
        except commands.CommandError as err:
            return err
        if isinstance(cmd, commands.GroupSettingsCmd):
            try:
                settings = groups.GroupSettings.from_json(cmd.settings)
            except groups.GroupSettingsError as err:
                return commands.CommandError(str(err))
            self.groups[cmd.group] = settings
            return settings
        if isinstance(cmd, commands.Settle):
            if cmd.kind == "timer":
                return self.timer.remove(cmd.offset)
            return self.halves.end(cmd.offset, ROLLBACK)
        if isinstance(cmd, commands.Recall):
            return self.timer.recall(cmd.offset, cmd.msg_id)
        if isinstance(cmd, commands.TxCheck):
            checked = self.halves.checked(cmd.offset, cmd.now_ms)
            if checked is not None and self.on_tx_check is not None:
                self.on_tx_check(checked, cmd.now_ms)  # every node asks the producers connected to it
            return checked
        if isinstance(cmd, commands.CreateTopic):
            have = self.topics.get(cmd.topic)
            if have is not None and have != cmd.queues:
                return commands.CommandError(f"topic {cmd.topic!r} already exists with {have} queues")
            self.topics[cmd.topic] = cmd.queues
            self.deleted_topics.pop(cmd.topic, None)
            if self.on_topics is not None:
                self.on_topics()
            return cmd
        if isinstance(cmd, commands.DeleteTopic):
            return self._delete_topic(cmd)
        if isinstance(cmd, commands.DeleteGroup):
            return self._delete_group(cmd)
        if isinstance(cmd, commands.SetConfig):
            self.config.update(cmd.settings)
            if self.on_config is not None:
                self.on_config(dict(self.config))
            return dict(self.config)
        if cmd.topic not in self.topics or cmd.queue_id >= self.topics[cmd.topic]:
            return commands.CommandError(f"unknown queue {cmd.topic}/{cmd.queue_id}")
        key = (cmd.group, cmd.topic, cmd.queue_id)
        if isinstance(cmd, commands.CommitOffset):
            self.offsets[key] = cmd.offset
            self.pops.reset(*key, cmd.offset)
            return cmd
        if isinstance(cmd, commands.Pop):
            end = self.next_offsets.get((cmd.topic, cmd.queue_id), 0)
            gs = self.group_settings(cmd.group)
            result: Any = self.pops.pop(cmd, self.offsets.get(key, 0), end, gs.fifo, gs.max_attempts)
        elif isinstance(cmd, commands.Ack):
            result = self.pops.ack(cmd)
        else:
            result = self.pops.change_invisible(cmd)
        self._follow_low(key)
        return result

    # -- administration ------------------------------------------------------------------------------------
    def _delete_topic(self, cmd: commands.DeleteTopic) -> Any:
        """The topic's queues go (their files too), with the groups' offsets and pop state on it; its messages
        stay in the log (until retention). Created again, its queues start at offset 0."""
        topic = cmd.topic
        if self.topics.pop(topic, None) is None:
            return commands.CommandError(f"unknown topic {topic!r}")
        self.deleted_topics[topic] = self.applied_index
        for key in [k for k in self.next_offsets if k[0] == topic]:
            del self.next_offsets[key]
            self.short_queues.pop(key, None)
        self.offsets = {k: o for k, o in self.offsets.items() if k[1] != topic}
        for pop_key in [k for k in self.pops.queues if k[1] == topic]:
            del self.pops.queues[pop_key]
        for key in [k for k in self._queues if k[0] == topic]:
            cq = self._queues.pop(key)
            self._unwritten = [u for u in self._unwritten if u is not cq]
            cq.remove()
        shutil.rmtree(self.root / topic, ignore_errors=True)  # queues never opened since the start
        if self.on_topics is not None:
            self.on_topics()
        return cmd

    def _delete_group(self, cmd: commands.DeleteGroup) -> Any:
        group = cmd.group
        if group not in self.group_names():
            return commands.CommandError(f"unknown consumer group {group!r}")
        self.offsets = {k: o for k, o in self.offsets.items() if k[0] != group}
        for pop_key in [k for k in self.pops.queues if k[0] == group]:
            del self.pops.queues[pop_key]
        self.groups.pop(group, None)
        return cmd

    def group_names(self) -> set[str]:
        """Every consumer group with state here: committed offsets, pop state or settings."""
        return {g for g, _, _ in self.offsets} | {g for g, _, _ in self.pops.queues} | set(self.groups)

    # -- repair --------------------------------------------------------------------------------------------
    def truncate_beyond(self, log_end_pos: int) -> int:
        """Drop units pointing at or past ``log_end_pos``, the log's end at start (it lost its tail): now in the
        queues already open, and in every other queue when it is first opened (until then nothing writes to
        it, so whatever it holds past that end is from before the start). Returns the units removed now."""
        self._log_end = log_end_pos
        return sum(self._cut_past_log_end(cq) for cq in self._queues.values())

    def _cut_past_log_end(self, cq: ConsumeQueue) -> int:
        end = self._log_end
        if end is None or cq.max_offset <= cq.min_offset or cq.get(cq.max_offset - 1).commitlog_offset < end:
            return 0  # the usual case: one read of the last unit
        lo, hi = cq.min_offset, cq.max_offset  # first unit at or past the end: units grow with position
        while lo < hi:
            mid = (lo + hi) // 2
            if cq.get(mid).commitlog_offset >= end:
                hi = mid
            else:
                lo = mid + 1
        return cq.truncate(lo)

    def flush(self) -> None:
        """Make the ConsumeQueue files written since the last flush durable (only those: there may be 80,000
        queues), on the calling thread."""
        paths = [path for cq in list(self._files.written) for path in cq.take_written()]
        paths += self._unsynced
        self._unsynced = []
        try:
            self._files.sync(paths)
        except BaseException:
            self._unsynced += paths  # taken again by the next flush or snapshot
            raise
        if self.keyindex is not None:
            self.keyindex.flush()

    def prepare_snapshot(self) -> Callable[[], None]:
        """Called by the runtime on the event loop just before ``save_snapshot``: takes the ConsumeQueue files
        written since the last flush and returns their syncing, which the runtime runs off the loop before it
        publishes the snapshot (so a snapshot claims only units that are durable, without stalling the loop for
        one fdatasync per file), and the key index's files likewise. Files a failed sync left are taken again
        next time."""
        paths = [path for cq in list(self._files.written) for path in cq.take_written()]
        if self.keyindex is not None:  # its memory map's pages too: an msync here held the loop ~10 ms
            paths += self.keyindex.take_unsynced()
        paths += self._unsynced
        self._unsynced = []

        def sync() -> None:
            try:
                self._files.sync(paths)
            except BaseException:
                self._unsynced += paths
                raise

        return sync

    # -- snapshots: topics and offsets; ConsumeQueue files are derived from the log and kept on disk ----------
    def save_snapshot(self, writer: BinaryIO) -> None:
        """The state, with the files it points at made durable here first (the runtime instead calls
        ``prepare_snapshot`` and ``capture_snapshot``, and syncs off the loop)."""
        self.flush()
        self.capture_snapshot()(writer)

    def capture_snapshot(self) -> Callable[[BinaryIO], None]:
        """The state as of now, and the function that writes it: called by the runtime on the event loop, which
        runs the function on the snapshot thread (dledger/runtime/snapshots.py). What grows with the number of
        queues and consumer groups (offsets, next offsets, topics) is copied here at C speed and sorted and
        serialized there, so a node with 80,000 queues does not hold its loop for the JSON (docs/broker.md,
        "Many topics, a long log"); what may change in place under the thread is turned into fresh rows here.
        Nothing is synced here: ``prepare_snapshot``, called just before, took the files to sync."""
        offsets, queues, topics = dict(self.offsets), dict(self.next_offsets), dict(self.topics)
        rows = {
            "producers": [
                [pid, st.last_seq, [[seq, *_dispatched_row(st.recent[seq])] for seq in st.order]]
                for pid, st in sorted(self.producers.items())
            ],
            "applied_index": self.applied_index,
            "duplicates": self.duplicates,
            "pops": self.pops.to_json(),
            "groups": {g: st.to_json() for g, st in sorted(self.groups.items())},
            "timer": self.timer.to_json(),
            "halves": self.halves.to_json(),
            "repeats": self.repeats,
            "deleted_topics": dict(self.deleted_topics),
            "config": copy.deepcopy(self.config),
        }

        def write(writer: BinaryIO) -> None:
            state = {
                **rows,
                "topics": topics,
                "offsets": [[g, t, q, o] for (g, t, q), o in sorted(offsets.items())],
                "queues": [[t, q, n] for (t, q), n in sorted(queues.items())],
            }
            writer.write(json.dumps(state, sort_keys=True).encode())

        return write

    def load_snapshot(self, reader: BinaryIO) -> None:
        state = json.loads(reader.read())
        self.placed.clear()
        self.topics = {str(t): int(n) for t, n in state["topics"].items()}
        self.offsets = {(g, t, int(q)): int(o) for g, t, q, o in state["offsets"]}
        self.next_offsets = {(t, int(q)): int(n) for t, q, n in state["queues"]}
        self.producers = {
            pid: ProducerState(
                int(last),
                {int(row[0]): Dispatched(*row[1:]) for row in recent},
                deque(int(row[0]) for row in recent),
            )
            for pid, last, recent in state.get("producers", [])
        }
        self.applied_index = int(state.get("applied_index", -1))
        self.duplicates = int(state.get("duplicates", 0))
        self.pops = PopStates.from_json(state.get("pops", []))
        self.groups = {str(g): groups.GroupSettings.from_json(d) for g, d in state.get("groups", {}).items()}
        self.timer = TimerIndex.from_json(state.get("timer", []))
        self.halves = HalfMessages.from_json(state.get("halves", {}))
        self.repeats = int(state.get("repeats", 0))
        self.deleted_topics = {str(t): int(i) for t, i in state.get("deleted_topics", {}).items()}
        self.config = dict(state.get("config", {}))
        if self.config and self.on_config is not None:
            self.on_config(dict(self.config))
        for t, q, max_offset in state["queues"]:
            cq = self._queues.get((t, int(q)))
            if cq is None:
                if holds(self.root, t, int(q), max_offset, self._units_per_file):
                    continue  # one stat: a queue is opened at its first use, not here
                cq = self.queue(t, int(q))
            if cq.max_offset < max_offset:
                # Units the snapshot covers are missing (deleted files, or a snapshot installed from the leader):
                # leave a hole so dispatch continues at the right offset; ``repair`` fills it from the log.
                self.short_queues[(t, int(q))] = max_offset
                cq.skip_to(max_offset)

    def repair(self, entries: Iterable[tuple[int, int, bytes | memoryview]]) -> int:
        """Fill holes of short ConsumeQueues from log entries (index, pos, body) at or before the snapshot
        point; returns the units written. What the log no longer holds stays a hole (reads say so)."""
        written = 0
        for _, pos, body in entries:
            if not self.short_queues:
                break
            if not commands.is_message(body):
                continue
            r = message.peek_route(body)
            target = self.short_queues.get((r.topic, r.queue_id))
            if target is None or r.queue_offset >= target:
                continue
            cq = self.queue(r.topic, r.queue_id)
            held = cq.read(
                r.queue_offset, 1
            )  # empty in a hole's missing file, a size-0 unit in its sparse part
            if not held or held[0].size == 0:
                cq.put(r.queue_offset, pos + HEADER_SIZE, r.size, message.tags_code(r.tags))
                written += 1
        self.short_queues.clear()
        return written

    def close(self) -> None:
        self.flush()
        if self.keyindex is not None:
            self.keyindex.close()
        self._files.close_all()
        self._queues.clear()
        self._replayed.clear()


def _dispatched_row(d: Dispatched) -> list[Any]:
    return [d.topic, d.queue_id, d.queue_offset, d.commitlog_offset, d.size]
