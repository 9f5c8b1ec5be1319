"""Retention: how long the broker keeps messages, by age and by disk use, independent of how often snapshots are
taken (docs/broker.md, "Retention"; why a log-derived decision per node: docs/decisions/0016-retention-from-the-log.md).

RocketMQ deletes CommitLog files older than ``fileReservedTime`` (hours), and sooner when the disk is fuller than
``diskMaxUsedSpaceRatio``. Here the CommitLog is the replicated log, and deleting its prefix is Raft log
compaction, which a snapshot must cover. So the broker tells the runtime the first log index it wants kept
(``BrokerStateMachine.retain_from``), and the runtime compacts exactly to it: after a snapshot no further than it
(a snapshot no longer deletes messages the policy keeps), and up to it as soon as a snapshot covers it (taking
one first when none does). The policy, ``[broker]`` in the node config:

- ``retention_hours``: a message is kept until a message stored that many hours after it was applied. Age is
  measured against the newest stored message's STORETIMESTAMP (stamped by the leader, replicated), not against
  this node's clock: every node computes the same point from the same log prefix.
- ``retention_bytes``: the log's bytes from its first kept entry to its applied end stay under this, as the
  log's positions (replicated) say: the same point on every node again.
- ``disk_max_used_percent``: a per-node safety valve, as RocketMQ's forced cleanup: when this node's file system
  is fuller than that, it deletes its oldest messages until the excess is freed (its disk is its own).

0 turns each off; with all three off the snapshot policy alone compacts the log (the behaviour before
retention). ConsumeQueue files wholly below the first kept message are deleted with it, and a consumer whose
offset fell behind is answered from the first kept offset (``first_held``).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker_adapter.core import commands
from broker_adapter.core.consumequeue import ConsumeQueue
from broker_adapter.core.formats import peek_store_timestamp
from storage.api import LogStore
from storage.codec import HEADER_SIZE, MAGIC_NORMAL

log = logging.getLogger(__name__)

_PROBE: Final = 64  # entries looked at past a bisection probe for a message (commands have no store time)
CHECK_INTERVAL_S: Final = 0.5


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    hours: float = 0.0
    max_bytes: int = 0
    disk_max_used_percent: float = 0.0

    @property
    def active(self) -> bool:
        return bool(self.hours or self.max_bytes or self.disk_max_used_percent)

    @classmethod
    def of(cls, config: Any) -> RetentionPolicy:
        return cls(
            getattr(config, "retention_hours", 0.0) or 0.0,
            getattr(config, "retention_bytes", 0) or 0,
            getattr(config, "disk_max_used_percent", 0.0) or 0.0,
        )


def store_timestamp(body: bytes | memoryview) -> int | None:
    """A message entry's STORETIMESTAMP (ms), None for a command or anything else."""
    if not commands.is_message(body):
        return None
    return peek_store_timestamp(body)


def _message_time(log: LogStore, i: int, hi: int) -> int | None:
    """The store time of the first message at or after ``i`` (within ``_PROBE`` entries, not past ``hi``)."""
    for j in range(i, min(hi, i + _PROBE - 1) + 1):
        e = log.entry(j)
        if e.magic == MAGIC_NORMAL:
            ts = store_timestamp(e.body)
            if ts is not None:
                return ts
    return None


def _newest_time(log: LogStore, lo: int, hi: int) -> int | None:
    for j in range(hi, max(lo, hi - _PROBE) - 1, -1):
        e = log.entry(j)
        if e.magic == MAGIC_NORMAL:
            ts = store_timestamp(e.body)
            if ts is not None:
                return ts
    return None


def _bisect(lo: int, hi: int, before: Callable[[int], bool]) -> int:
    """The first index in [lo, hi] for which ``before`` is false (hi + 1 when none); ``before`` is monotone."""
    while lo <= hi:
        mid = (lo + hi) // 2
        if before(mid):
            lo = mid + 1
        else:
            hi = mid - 1
    return lo


def first_kept(log: LogStore, hi: int, policy: RetentionPolicy, disk: tuple[int, int] | None = None) -> int:
    """The first log index the policy keeps among entries up to ``hi`` (the applied index): a pure function of
    the log for age and bytes (the same on every node); ``disk`` = (used, total) bytes of this node's file
    system for the per-node valve. Never past ``hi``: the newest applied entry is always kept."""
    lo = log.first_index
    if hi < lo:
        return lo
    cut = lo
    last = log.entry(hi)
    end = last.pos + last.header.size
    if policy.max_bytes:
        floor = end - policy.max_bytes
        cut = max(cut, _bisect(lo, hi, lambda i: log.entry(i).pos < floor))
    if policy.hours:
        newest = _newest_time(log, lo, hi)
        if newest is not None:
            oldest_kept = newest - int(policy.hours * 3_600_000)

            def old(i: int) -> bool:
                ts = _message_time(log, i, hi)
                return ts is not None and ts < oldest_kept  # no message near: keep (never deleted by guess)

            cut = max(cut, _bisect(lo, hi, old))
    if policy.disk_max_used_percent and disk is not None:
        used, total = disk
        excess = used - int(total * policy.disk_max_used_percent / 100)
        if excess > 0:
            start = log.entry(lo).pos
            cut = max(cut, _bisect(lo, hi, lambda i: log.entry(i).pos < start + excess))
    return min(cut, hi)


def first_held(cq: ConsumeQueue, end: int, first_pos: int) -> int:
    """The first queue offset (< ``end``) whose message this node's log still holds: its unit points at or past
    ``first_pos``, the position where the log's first entry starts; ``end`` when none does. Units grow with the
    offset; a hole (size 0, before a snapshot) counts as not held."""
    floor = cq.min_offset

    def gone(q: int) -> bool:
        if q < floor:
            return True
        units = cq.read(q, 1)
        return not units or units[0].size == 0 or units[0].commitlog_offset < first_pos + HEADER_SIZE

    return _bisect(0, end - 1, gone)


class Retention:
    """One node's retention: ``retain_from()`` (asked by the runtime after every applied chunk, and every second
    when idle) evaluates the policy every ``CHECK_INTERVAL_S`` or every eighth of ``max_bytes`` of new log,
    whichever comes first, and, when the log's start moved since, deletes the ConsumeQueue files wholly below
    each queue's first held offset. Runs on the node's event loop, like the dispatcher."""

    def __init__(
        self,
        policy: RetentionPolicy,
        log: LogStore,
        applied: Callable[[], int],
        queues: Callable[[], Iterable[tuple[str, int, ConsumeQueue, int]]],
        data_dir: Path,
        clock: Callable[[], float] = time.monotonic,
        prune: Callable[[int], object] | None = None,
    ):
        self._log = log
        self._applied = applied
        self._queues = queues
        self._data_dir = data_dir
        self._clock = clock
        self._prune = (
            prune  # also given the log's first position when it moves (the key index's old files go)
        )
        self._checked_at = float("-inf")
        self._checked_end = 0
        self._point: int | None = None
        self._cleaned_first = -1
        self.stats = {"evaluations": 0, "consumequeue_files_deleted": 0}
        self.set_policy(policy)

    def set_policy(self, policy: RetentionPolicy) -> None:
        """The policy (at start, and when run-time settings change it): evaluated again at the next
        ``retain_from``; also evaluated after ``_step`` new log bytes, so a fast producer cannot outrun it."""
        self.policy = policy
        self._step = max(64 << 10, policy.max_bytes // 8) if policy.max_bytes else 4 << 20
        self._checked_at = float("-inf")

    def disk(self) -> tuple[int, int] | None:
        if not self.policy.disk_max_used_percent:
            return None
        u = shutil.disk_usage(self._data_dir)
        return u.used, u.total

    def retain_from(self) -> int | None:
        now = self._clock()
        end = self._log.tail().end_pos
        if now - self._checked_at >= CHECK_INTERVAL_S or end - self._checked_end >= self._step:
            self._checked_at, self._checked_end = now, end
            self.stats["evaluations"] += 1
            point = first_kept(self._log, self._applied(), self.policy, self.disk())
            if point != self._point:
                log.debug("retention keeps the log from index %d (%s)", point, self.policy)
            self._point = point
            self.clean_queues()
        return self._point

    def clean_queues(self) -> None:
        """Delete ConsumeQueue files below what the log holds (once per move of the log's start), of the queues
        that have more than one file (``BrokerStateMachine.queues_to_trim``)."""
        first = self._log.first_index
        if first == self._cleaned_first:
            return
        self._cleaned_first = first
        first_pos = self._log.snapshot_point().end_pos
        for _topic, _qid, cq, end in self._queues():
            self.stats["consumequeue_files_deleted"] += cq.drop_before(first_held(cq, end, first_pos))
        if self._prune is not None:
            self._prune(first_pos)
