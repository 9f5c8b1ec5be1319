"""The broker's state machine: committed entries become ConsumeQueue units, topics and consumer offsets.

Every node runs it on the same committed entries in the same order, so queue offsets, topics and committed
consumer offsets are identical on every node across any number of failovers. The leader chose each message's
queue offset (dense per queue) and wrote it into the message before proposing; dispatching checks that the
offset continues its queue and writes the unit. Replaying entries that were already dispatched (a restart from an
older snapshot) finds the existing unit, checks it points at the same position, and moves on: dispatch is
idempotent, which is what makes ConsumeQueues repairable from the log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from broker_adapter import commands, message
from broker_adapter.consumequeue import UNITS_PER_FILE, ConsumeQueue
from statemachine.api import CommittedEntry
from storage.codec import HEADER_SIZE


class DispatchError(RuntimeError):
    """A committed message does not fit its ConsumeQueue: the node's derived state disagrees with the log."""


@dataclass(frozen=True, slots=True)
class Dispatched:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int


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
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._on_dispatch = on_dispatch  # (topic, queue_id, next queue offset): wakes long-polling pulls

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

    # -- apply ---------------------------------------------------------------------------------------------
    def apply(self, entries: Sequence[CommittedEntry]) -> list[Any]:
        results: list[Any] = []
        touched: set[tuple[str, int]] = set()
        for e in entries:
            body = e.body
            if commands.is_message(body):
                d = self._dispatch(e)
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
                self._on_dispatch(topic, qid, self._queues[(topic, qid)].max_offset)
        return results

    def _dispatch(self, e: CommittedEntry) -> Dispatched:
        r = message.peek_route(e.body)
        commitlog_offset = e.pos + HEADER_SIZE
        if r.topic not in self.topics:
            # Only the leader's auto-create path sends to a topic not yet created; every node does the same.
            self.topics[r.topic] = r.queue_id + 1
        elif r.queue_id >= self.topics[r.topic]:
            self.topics[r.topic] = r.queue_id + 1
        cq = self.queue(r.topic, r.queue_id)
        q = r.queue_offset
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
        return Dispatched(r.topic, r.queue_id, q, commitlog_offset, r.size)

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
        self.offsets[(cmd.group, cmd.topic, cmd.queue_id)] = cmd.offset
        return cmd

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
            "queues": [[t, q, cq.max_offset] for (t, q), cq in sorted(self._queues.items())],
        }
        writer.write(json.dumps(state, sort_keys=True).encode())

    def load_snapshot(self, reader: BinaryIO) -> None:
        state = json.loads(reader.read())
        self.topics = {str(t): int(n) for t, n in state["topics"].items()}
        self.offsets = {(g, t, int(q)): int(o) for g, t, q, o in state["offsets"]}
        for t, q, max_offset in state["queues"]:
            if self.queue(t, int(q)).max_offset < max_offset:
                raise DispatchError(
                    f"{t}/{q}: ConsumeQueue ends at {self.queue(t, int(q)).max_offset} but the snapshot covers "
                    f"{max_offset} units; rebuild the ConsumeQueue from the log"
                )

    def close(self) -> None:
        for cq in self._queues.values():
            cq.close()
        self._queues.clear()
