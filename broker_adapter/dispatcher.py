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
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from broker_adapter import commands, message
from broker_adapter.consumequeue import UNITS_PER_FILE, ConsumeQueue
from broker_adapter.rocketmq.invisibility import PopStates
from statemachine.api import CommittedEntry
from storage.codec import HEADER_SIZE

PRODUCER_WINDOW: Final = 4096  # results remembered per producer for answering retried sends


class DispatchError(RuntimeError):
    """A committed message does not fit its ConsumeQueue: the node's derived state disagrees with the log."""


@dataclass(frozen=True, slots=True)
class Dispatched:
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
        self.last_seq = max(self.last_seq, seq)
        if seq not in self.recent:
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
    ):
        self.root = Path(consumequeue_root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._units_per_file = units_per_file
        self.topics: dict[str, int] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.next_offsets: dict[
            tuple[str, int], int
        ] = {}  # per queue: the offset the next message must carry
        self.producers: dict[str, ProducerState] = {}
        # RocketMQ 5 consumption (receive / ack / change invisible duration): replicated like everything else.
        self.pops = PopStates()
        self.applied_index = -1  # the last entry given to ``apply`` (with the apply loop's, after a restore)
        self.duplicates = 0  # messages whose (producer, sequence) was already in the log: should stay 0
        self.short_queues: dict[tuple[str, int], int] = {}  # after a snapshot: queues with a hole to repair
        # CommitLog offset -> index for messages dispatched since start (positions grow with the index).
        self._positions = array("q")
        self._indices = array("q")
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._on_dispatch = on_dispatch  # (topic, queue_id, next queue offset): wakes long-polling pulls

    # -- retention (broker_adapter/retention.py; set by the plugin when a policy is configured) ---------------
    retention: Any = None

    def retain_from(self) -> int | None:
        """The first log index retention keeps, for the runtime's compaction; None: no retention policy."""
        return None if self.retention is None else self.retention.retain_from()

    def queues_held(self) -> list[tuple[str, int, ConsumeQueue, int]]:
        """Every queue of every topic: (topic, queue id, its ConsumeQueue, its next offset)."""
        return [
            (t, q, self.queue(t, q), self.next_offset(t, q)) for t, n in self.topics.items() for q in range(n)
        ]

    # -- queues --------------------------------------------------------------------------------------------
    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self._units_per_file)
            self._queues[key] = cq
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
        if self._on_dispatch is not None:
            for topic, qid in touched:
                self._on_dispatch(topic, qid, self.next_offsets[(topic, qid)])
        return results

    def _dispatch(self, e: CommittedEntry) -> Dispatched | message.MessageFormatError:
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
        if r.topic not in self.topics:
            # Only the leader's auto-create path sends to a topic not yet created; every node does the same.
            self.topics[r.topic] = r.queue_id + 1
        elif r.queue_id >= self.topics[r.topic]:
            self.topics[r.topic] = r.queue_id + 1
        cq = self.queue(r.topic, r.queue_id)
        q = r.queue_offset
        expected = self.next_offsets.get((r.topic, r.queue_id), 0)
        if q != expected:
            raise DispatchError(
                f"{r.topic}/{r.queue_id}: entry {e.index} carries queue offset {q} but the queue's next offset is "
                f"{expected}: the leader allocated offsets that are not dense"
            )
        if q == cq.max_offset:
            cq.append(commitlog_offset, r.size, message.tags_code(r.tags))
        elif q < cq.max_offset:
            unit = cq.get(q)
            if unit.commitlog_offset != commitlog_offset or unit.size != r.size:
                raise DispatchError(
                    f"{r.topic}/{r.queue_id} offset {q}: ConsumeQueue points at {unit.commitlog_offset} "
                    f"(size {unit.size}) but entry {e.index} puts the message at {commitlog_offset} (size {r.size})"
                )
        else:
            raise DispatchError(
                f"{r.topic}/{r.queue_id}: entry {e.index} carries queue offset {q} but the queue ends at "
                f"{cq.max_offset}; rebuild the ConsumeQueue from the log"
            )
        self.next_offsets[(r.topic, r.queue_id)] = q + 1
        if not self._positions or commitlog_offset > self._positions[-1]:
            self._positions.append(commitlog_offset)
            self._indices.append(e.index)
        d = Dispatched(r.topic, r.queue_id, q, commitlog_offset, r.size)
        ident = message.peek_producer(e.body)
        if ident is not None:
            pid, seq = ident
            st = self.producers.get(pid)
            if st is None:
                st = self.producers[pid] = ProducerState()
            if self.sent(pid, seq) is not False:
                self.duplicates += 1
            st.record(seq, d)
        return d

    def _command(self, body) -> Any:
        try:
            cmd = commands.decode(body)
        except commands.CommandError as err:
            return err
        if isinstance(cmd, commands.CreateTopic):
            have = self.topics.get(cmd.topic)
            if have is not None and have != cmd.queues:
                return commands.CommandError(f"topic {cmd.topic!r} already exists with {have} queues")
            self.topics[cmd.topic] = cmd.queues
            return cmd
        if cmd.topic not in self.topics or cmd.queue_id >= self.topics[cmd.topic]:
            return commands.CommandError(f"unknown queue {cmd.topic}/{cmd.queue_id}")
        key = (cmd.group, cmd.topic, cmd.queue_id)
        if isinstance(cmd, commands.CommitOffset):
            self.offsets[key] = cmd.offset
            self.pops.reset(*key, cmd.offset)
            return cmd
        if isinstance(cmd, commands.Pop):
            end = self.next_offsets.get((cmd.topic, cmd.queue_id), 0)
            result: Any = self.pops.pop(cmd, self.offsets.get(key, 0), end)
        elif isinstance(cmd, commands.Ack):
            result = self.pops.ack(cmd)
        else:
            result = self.pops.change_invisible(cmd)
        q = self.pops.get(key)
        if q is not None and q.low != self.offsets.get(key, 0):
            self.offsets[key] = q.low  # the group's committed offset follows its acknowledgements
        return result

    # -- repair --------------------------------------------------------------------------------------------
    def truncate_beyond(self, log_end_pos: int) -> int:
        """Drop units pointing at or past ``log_end_pos`` (the log lost its tail); returns units removed."""
        removed = 0
        for topic_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for qdir in sorted(p for p in topic_dir.iterdir() if p.name.isdigit()):
                cq = self.queue(topic_dir.name, int(qdir.name))
                lo, hi = 0, cq.max_offset  # first unit at or past the end: units grow with position
                while lo < hi:
                    mid = (lo + hi) // 2
                    if cq.get(mid).commitlog_offset >= log_end_pos:
                        hi = mid
                    else:
                        lo = mid + 1
                removed += cq.truncate(lo)
        return removed

    def flush(self) -> None:
        for cq in self._queues.values():
            cq.flush()

    # -- snapshots: topics and offsets; ConsumeQueue files are derived from the log and kept on disk ----------
    def save_snapshot(self, writer: BinaryIO) -> None:
        self.flush()
        state = {
            "topics": self.topics,
            "offsets": [[g, t, q, o] for (g, t, q), o in sorted(self.offsets.items())],
            "queues": [[t, q, n] for (t, q), n in sorted(self.next_offsets.items())],
            "producers": [
                [pid, st.last_seq, [[seq, *_dispatched_row(st.recent[seq])] for seq in st.order]]
                for pid, st in sorted(self.producers.items())
            ],
            "applied_index": self.applied_index,
            "duplicates": self.duplicates,
            "pops": self.pops.to_json(),
        }
        writer.write(json.dumps(state, sort_keys=True).encode())

    def load_snapshot(self, reader: BinaryIO) -> None:
        state = json.loads(reader.read())
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
        for t, q, max_offset in state["queues"]:
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
        for cq in self._queues.values():
            cq.close()
        self._queues.clear()


def _dispatched_row(d: Dispatched) -> list[Any]:
    return [d.topic, d.queue_id, d.queue_offset, d.commitlog_offset, d.size]
