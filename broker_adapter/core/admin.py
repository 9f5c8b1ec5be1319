"""The broker's administration (docs/broker.md, Administration; ``dledger.v1.BrokerAdmin``): consumer groups
(list, describe with offsets and lag, reset, delete), topics (status, delete), messages found by id, key or
store time, and run-time settings.

Every change goes through the log like an offset commit (``commands``: a reset is one ``CommitOffset`` per
queue, proposed together; a deletion is a ``DeleteTopic`` / ``DeleteGroup``; settings a ``SetConfig``), so every
node agrees and a failover loses none. Reads are answered on the leader after its read barrier, or from any
node that applied them when the caller allows it. Input is checked before anything is written: bad names,
modes and offsets are ``InvalidRequestError``, unknown topics, queues and groups ``NotFoundError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from broker_adapter.core import commands, keyindex, message, runtime_settings
from broker_adapter.core.commitlog import CommitLog, CommitLogError
from broker_adapter.core.group_commit import GroupCommit
from broker_adapter.core.leadership import Leadership
from broker_adapter.core.model import (
    GroupQueue,
    GroupSummary,
    OffsetRangeError,
    OffsetReset,
    QueueStatus,
    UnknownGroupError,
    check_group,
)
from broker_adapter.core.reader import QueueReader
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.core.topic_registry import TopicRegistry
from broker_adapter.core.topics import SYSTEM_PREFIX
from broker_adapter.settings import BrokerSettings
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError

RESET_MODES: Final = ("earliest", "latest", "offset", "time")
MAX_QUERY: Final = 1024  # messages one query answers at most
QUERY_KINDS: Final = {"key": keyindex.KEY, "id": keyindex.MSG_ID}


class Admin:
    def __init__(
        self,
        sm: BrokerStateMachine,
        leadership: Leadership,
        proposer: GroupCommit,
        topics: TopicRegistry,
        reader: QueueReader,
        commitlog: CommitLog,
        settings: BrokerSettings,
        settled: Callable[[], Awaitable[None]],
    ):
        self._sm = sm
        self._leadership = leadership
        self._proposer = proposer
        self._topics = topics
        self._reader = reader
        self._commitlog = commitlog
        self._settings = settings  # the node config's [broker] table, under the run-time values
        # until the leader applied its whole log: a read sees every send acknowledged before it (acknowledged at
        # commit, dispatched at apply)
        self._settled = settled

    async def _state(self, allow_follower: bool) -> None:
        if not allow_follower:
            await self._leadership.leader_state()
            await self._settled()

    async def _submit(self, cmds: Sequence[commands.Command]) -> list[Any]:
        self._leadership.require_leader()
        results = await self._proposer.submit(cmds)
        for r in results:
            if isinstance(r, commands.CommandError):
                raise NotFoundError(str(r))
            if isinstance(r, BaseException):
                raise r if isinstance(r, DLedgerError) else DLedgerError(str(r))
        return results

    # -- topics --------------------------------------------------------------------------------------------
    def _queues(self, topic: str) -> int:
        return self._topics.queues(topic)

    async def topic_status(self, topic: str, allow_follower: bool = False) -> list[QueueStatus]:
        await self._state(allow_follower)
        out = []
        for q in range(self._queues(topic)):
            end = self._sm.next_offset(topic, q)
            first = self._reader.first_held(topic, q) if end else 0
            last = self._reader.read(topic, q, end - 1) if end > first else None
            out.append(QueueStatus(topic, q, first, end, last.store_timestamp if last is not None else 0))
        return out

    async def delete_topic(self, topic: str) -> int:
        """Delete a topic; returns how many queues it had."""
        await self._state(False)
        if topic.startswith(SYSTEM_PREFIX):
            raise InvalidRequestError(f"topic {topic!r} is the broker's own: it cannot be deleted")
        n = self._queues(topic)
        await self._submit([commands.DeleteTopic(topic)])
        return n

    # -- consumer groups -----------------------------------------------------------------------------------
    async def list_groups(self, allow_follower: bool = False) -> list[GroupSummary]:
        await self._state(allow_follower)
        sm = self._sm
        out = []
        for g in sorted(sm.group_names()):
            queues = self._group_queues(g, None)
            out.append(
                GroupSummary(
                    g, tuple(sorted({q.topic for q in queues})), sum(q.lag for q in queues), g in sm.groups
                )
            )
        return out

    def _group_queues(self, group: str, topic: str | None) -> list[GroupQueue]:
        sm = self._sm
        keys = {(t, q) for g, t, q in sm.offsets if g == group} | {
            (t, q) for g, t, q in sm.pops.queues if g == group
        }
        if topic is not None:
            keys |= {(topic, q) for q in range(self._queues(topic))}
            keys = {k for k in keys if k[0] == topic}
        out = []
        for t, q in sorted(keys):
            if t not in sm.topics:
                continue
            pop = sm.pops.get((group, t, q))
            out.append(
                GroupQueue(
                    t,
                    q,
                    sm.offsets.get((group, t, q)),
                    sm.next_offset(t, q),
                    len(pop.inflight) if pop is not None else 0,
                )
            )
        return out

    async def describe_group(
        self, group: str, topic: str | None = None, allow_follower: bool = False
    ) -> list[GroupQueue]:
        """Each queue the group has state on (or every queue of ``topic``): committed offset, end, lag."""
        check_group(group)
        await self._state(allow_follower)
        if group not in self._sm.group_names():
            raise UnknownGroupError(
                f"unknown consumer group {group!r}: it has no offsets, pop state or settings"
            )
        return self._group_queues(group, topic)

    async def delete_group(self, group: str) -> None:
        check_group(group)
        await self._state(False)
        if group not in self._sm.group_names():
            raise UnknownGroupError(f"unknown consumer group {group!r}: nothing to delete")
        await self._submit([commands.DeleteGroup(group)])

    async def reset_offsets(
        self, group: str, topic: str, mode: str, value: int = 0, queue_id: int | None = None
    ) -> list[OffsetReset]:
        """Set the group's offsets of the topic's queues (or of one) to the first held offset ("earliest"), the
        end ("latest"), ``value`` ("offset"), or the first message stored at or after ``value`` ms since the
        epoch ("time", a binary search over the ConsumeQueue by store time)."""
        check_group(group)
        if mode not in RESET_MODES:
            raise InvalidRequestError(f"reset mode must be one of {', '.join(RESET_MODES)}, got {mode!r}")
        if mode in ("offset", "time") and value < 0:
            raise InvalidRequestError(f"a reset to an {mode} needs a value >= 0, got {value}")
        await self._state(False)
        n = self._queues(topic)
        if queue_id is not None and not 0 <= queue_id < n:
            raise NotFoundError(f"unknown queue {topic}/{queue_id}: the topic has queues 0..{n - 1}")
        plan = []
        for q in range(n) if queue_id is None else (queue_id,):
            end = self._sm.next_offset(topic, q)
            if mode == "earliest":
                new = self._reader.first_held(topic, q) if end else 0
            elif mode == "latest":
                new = end
            elif mode == "time":
                new = self.first_stored_at(topic, q, value)
            else:
                if value > end:
                    raise OffsetRangeError(f"offset {value} is beyond the end of {topic}/{q} ({end})")
                new = value
            plan.append(OffsetReset(q, self._sm.offsets.get((group, topic, q)), new))
        await self._submit([commands.CommitOffset(group, topic, r.queue_id, r.new) for r in plan])
        return plan

    def first_stored_at(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``ts_ms`` (store times grow with the
        offset; messages this node no longer holds count as older): a binary search over the ConsumeQueue."""
        lo, hi = self._reader.first_held(topic, queue_id), self._sm.next_offset(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            m = self._reader.read(topic, queue_id, mid)
            if m is None or m.store_timestamp < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- messages ------------------------------------------------------------------------------------------
    async def query(
        self, kind: str, value: str, topic: str = "", limit: int = 32, allow_follower: bool = False
    ) -> list[message.Message]:
        """Messages whose key (``kind`` "key") or message id ("id") is ``value``, newest first, through the
        key index (no log scan); only those their queue still holds (not of a deleted topic)."""
        idx = self._sm.keyindex
        if kind not in QUERY_KINDS:
            raise InvalidRequestError(f"query by {kind!r}: use one of {', '.join(QUERY_KINDS)}")
        if not value:
            raise InvalidRequestError(f"a query by {kind} needs a value")
        self._check_limit(limit)
        if topic:
            self._queues(topic)
        if idx is None:
            raise InvalidRequestError("this node keeps no key index ([broker] key_index = false)")
        await self._state(allow_follower)
        found: list[message.Message] = []
        for pos in idx.lookup(QUERY_KINDS[kind], value, 4 * limit + 16):
            m = self._live(pos)
            if m is None or (topic and m.topic != topic):
                continue
            if (value in m.keys) if kind == "key" else (m.msg_id == value):
                found.append(m)
                if len(found) >= limit:
                    break
        return found

    def _live(self, pos: int) -> message.Message | None:
        """The message at CommitLog offset ``pos`` if its queue still points at it (a user topic)."""
        sm = self._sm
        try:
            m = self._commitlog.message_at(pos, sm.applied_index)
        except (CommitLogError, message.MessageFormatError):
            return None
        if m.topic.startswith(SYSTEM_PREFIX) or m.queue_id >= sm.topics.get(m.topic, 0):
            return None
        units = sm.queue(m.topic, m.queue_id).read(m.queue_offset, 1)
        return m if units and units[0].commitlog_offset == pos else None

    async def query_time(
        self, topic: str, start_ms: int, end_ms: int, limit: int = 32, allow_follower: bool = False
    ) -> list[message.Message]:
        """Messages of ``topic`` stored in [start_ms, end_ms), oldest first in each queue, at most ``limit``."""
        self._check_limit(limit)
        if not 0 <= start_ms < end_ms:
            raise InvalidRequestError(f"a time range needs 0 <= start < end, got {start_ms}..{end_ms}")
        await self._state(allow_follower)
        found: list[message.Message] = []
        for q in range(self._queues(topic)):
            lo, hi = self.first_stored_at(topic, q, start_ms), self.first_stored_at(topic, q, end_ms)
            for o in range(lo, min(hi, lo + limit - len(found))):
                m = self._reader.read(topic, q, o)
                if m is not None:
                    found.append(m)
            if len(found) >= limit:
                break
        return found

    @staticmethod
    def _check_limit(limit: int) -> None:
        if not 1 <= limit <= MAX_QUERY:
            raise InvalidRequestError(f"limit must be in 1..{MAX_QUERY}, got {limit}")

    # -- run-time settings ---------------------------------------------------------------------------------
    def config(self) -> dict[str, dict[str, Any]]:
        return runtime_settings.shown(self._settings, self._sm.config)

    async def set_config(self, values: dict[str, str]) -> dict[str, dict[str, Any]]:
        if not values:
            raise InvalidRequestError(
                f"give at least one key=value; settable: {', '.join(sorted(runtime_settings.RUNTIME_KEYS))}"
            )
        typed = runtime_settings.parse(values)
        runtime_settings.effective(self._settings, {**self._sm.config, **typed})  # checked before writing
        await self._state(False)
        await self._submit([commands.SetConfig(typed)])
        return self.config()
