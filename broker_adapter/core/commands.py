"""Broker administration that goes through the log, so that every node agrees on it.

Topic creation and consumer-offset commits are log entries like messages: replicated, committed on quorum and
applied in order by every node's dispatcher. (RocketMQ's DLedger mode syncs offsets to followers every 10 s, so
a failover can rewind a consumer group; ours cannot.)

A command body mirrors the message layout's first two fields so that one look at bytes 4..8 tells a message
(MAGICCODE 0xDAA320A7) from a command (0x444C4243, "DLBC"):

    0  TOTALSIZE  4
    4  MAGIC      4   0x444C4243
    8  OP         1   1 create topic, 2 commit consumer offset, 3 pop, 4 ack, 5 change invisible duration,
                      6 group settings, 7 settle a pending timer / half message, 8 transaction check,
                      9 recall a timer message, 10 delete a topic, 11 delete a consumer group,
                      12 run-time broker settings
    9  PAYLOAD    n   UTF-8 JSON object

Ops 3-5 carry the consumption state of RocketMQ 5 consumers (``broker_adapter.rocketmq``): which messages a group
received and until when they stay invisible, and which it acknowledged. Time is decided once, by the leader:
it stamps ``now_ms`` into the command and every node applies the same deadline.

Ops 6-8 carry delivery state (docs/rocketmq.md, Delivery): a consumer group's FIFO / retry settings, the end of a
timer or half message that is not delivered (a rolled-back or unreadable one), and a transaction check-back
counted before it is sent, so the check limit holds across failovers. Op 9 is a producer's recall of a delayed
message before it is due (RocketMQ 5.3's RecallMessage).

Ops 10-12 are administration (docs/broker.md, Administration): a topic's deletion (its queues, offsets and pop
state go; its messages stay in the log until retention), a consumer group's deletion (its offsets, pop state and
settings), and the run-time broker settings (``core/runtime_settings.py``) every node applies alike.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Final

from broker_adapter.core.formats import COMMAND_MAGIC, MAGIC_CODE, OVERHEAD

_HEAD: Final = struct.Struct(">iIB")
OP_CREATE_TOPIC: Final = 1
OP_COMMIT_OFFSET: Final = 2
OP_POP: Final = 3
OP_ACK: Final = 4
OP_CHANGE_INVISIBLE: Final = 5
OP_GROUP_SETTINGS: Final = 6
OP_SETTLE: Final = 7
OP_TX_CHECK: Final = 8
OP_RECALL: Final = 9
OP_DELETE_TOPIC: Final = 10
OP_DELETE_GROUP: Final = 11
OP_SET_CONFIG: Final = 12
SETTLE_KINDS: Final = ("timer", "half")

MAX_QUEUES: Final = 1024
# RocketMQ's topic rule: letters, digits, '%', '-', '_', '|', at most 127 characters.
TOPIC_RE: Final = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
GROUP_RE: Final = TOPIC_RE


class CommandError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CreateTopic:
    topic: str
    queues: int


@dataclass(frozen=True, slots=True)
class CommitOffset:
    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class Pop:
    """A group receives ``offsets`` of a queue (new ones and ones whose invisible time ran out), invisible
    until ``now_ms + invisible_ms``; ``skip`` are offsets the group's filter does not select (done at once)."""

    group: str
    topic: str
    queue_id: int
    now_ms: int
    invisible_ms: int
    offsets: tuple[int, ...]
    skip: tuple[int, ...] = ()
    # FIFO groups: the message group of each offset the pop names (pairs), so the state machine holds one
    # message of each message group in flight at a time.
    groups: tuple[tuple[int, str], ...] = ()
    # A PushConsumer's auto-renewed receive: the client's id. The leader keeps renewing what it grants while the
    # client lives, and a new leader takes that over (broker_adapter/rocketmq/renewal.py). Absent: "".
    renew: str = ""


@dataclass(frozen=True, slots=True)
class Ack:
    """A group acknowledges the delivery ``epoch`` of a queue offset (named by a receipt handle)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ChangeInvisible:
    """A group keeps the delivery ``epoch`` of a queue offset invisible until ``now_ms + invisible_ms``."""

    group: str
    topic: str
    queue_id: int
    offset: int
    epoch: int
    now_ms: int
    invisible_ms: int
    # The leader renewing an auto-renewed delivery (it stays one); False: the client changed it itself, and
    # renewing it ends. Absent: False.
    renew: bool = False


@dataclass(frozen=True, slots=True)
class GroupSettingsCmd:
    """Replace a consumer group's delivery settings (``broker_adapter.core.groups.GroupSettings`` as JSON)."""

    group: str
    settings: dict[str, object]  # GroupSettings.to_json(): JSON values


@dataclass(frozen=True, slots=True)
class Settle:
    """A pending ``kind`` message (a timer or half message, by its offset in the system queue) ends without
    being delivered: a rollback, a check limit reached, or a message the log no longer holds."""

    kind: str
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class TxCheck:
    """The leader checks back an orphaned half message at ``now_ms`` (counted before the check is sent)."""

    offset: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class Recall:
    """A producer recalls the timer message at ``offset`` (its message id ``msg_id``) before it is due."""

    offset: int
    msg_id: str


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """Remove a topic: its queues, the consumer offsets and pop state on it (its messages stay in the log)."""

    topic: str


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Remove a consumer group: its committed offsets, pop state and delivery settings."""

    group: str


@dataclass(frozen=True, slots=True)
class SetConfig:
    """Replace run-time broker settings (``runtime_settings.RuntimeSettings`` as JSON; absent keys unchanged)."""

    settings: dict[str, object]


Command = (
    CreateTopic
    | CommitOffset
    | Pop
    | Ack
    | ChangeInvisible
    | GroupSettingsCmd
    | Settle
    | TxCheck
    | Recall
    | DeleteTopic
    | DeleteGroup
    | SetConfig
)


def check_topic(topic: str) -> str:
    if not isinstance(topic, str) or not TOPIC_RE.match(topic):
        raise CommandError(
            f"invalid topic name {topic!r}: use 1-127 characters from letters, digits, '%', '-', '_' and '|'"
        )
    return topic


def check_group(group: str) -> str:
    if not isinstance(group, str) or not GROUP_RE.match(group):
        raise CommandError(
            f"invalid consumer group {group!r}: use 1-127 characters from letters, digits, '%', '-', '_' and '|'"
        )
    return group


def encode(cmd: Command) -> bytes:
    if isinstance(cmd, CreateTopic):
        check_topic(cmd.topic)
        if not 1 <= cmd.queues <= MAX_QUEUES:
            raise CommandError(f"a topic needs 1..{MAX_QUEUES} queues, got {cmd.queues}")
        op, payload = OP_CREATE_TOPIC, {"topic": cmd.topic, "queues": cmd.queues}
    elif isinstance(cmd, CommitOffset):
        check_group(cmd.group)
        check_topic(cmd.topic)
        if cmd.queue_id < 0 or cmd.offset < 0:
            raise CommandError(f"queue id and offset must be >= 0, got {cmd.queue_id} and {cmd.offset}")
        op = OP_COMMIT_OFFSET
        payload = {"group": cmd.group, "topic": cmd.topic, "queue_id": cmd.queue_id, "offset": cmd.offset}
    elif isinstance(cmd, Pop | Ack | ChangeInvisible):
        check_group(cmd.group)
        check_topic(cmd.topic)
        numbers = [
            cmd.queue_id,
            *(getattr(cmd, f) for f in ("offset", "epoch", "now_ms", "invisible_ms") if hasattr(cmd, f)),
        ]
        if isinstance(cmd, Pop):
            numbers += [*cmd.offsets, *cmd.skip, *(o for o, _ in cmd.groups)]
        if any(n < 0 for n in numbers):
            raise CommandError(f"queue ids, offsets, epochs and times must be >= 0: {cmd!r}")
        op = {Pop: OP_POP, Ack: OP_ACK, ChangeInvisible: OP_CHANGE_INVISIBLE}[type(cmd)]
        payload = {f: (list(v) if isinstance(v, tuple) else v) for f, v in _fields(cmd)}
        if isinstance(cmd, Pop) and not cmd.groups:
            del payload["groups"]
        if isinstance(cmd, Pop | ChangeInvisible) and not cmd.renew:
            del payload["renew"]  # an optional key: a node from before it reads the command as before
    elif isinstance(cmd, GroupSettingsCmd):
        check_group(cmd.group)
        op, payload = OP_GROUP_SETTINGS, {"group": cmd.group, "settings": cmd.settings}
    elif isinstance(cmd, Settle):
        if cmd.kind not in SETTLE_KINDS or cmd.offset < 0:
            raise CommandError(f"a settle names a kind in {SETTLE_KINDS} and an offset >= 0: {cmd!r}")
        op, payload = OP_SETTLE, {"kind": cmd.kind, "offset": cmd.offset, "reason": cmd.reason}
    elif isinstance(cmd, TxCheck):
        if cmd.offset < 0 or cmd.now_ms < 0:
            raise CommandError(f"a transaction check names an offset and a time >= 0: {cmd!r}")
        op, payload = OP_TX_CHECK, {"offset": cmd.offset, "now_ms": cmd.now_ms}
    elif isinstance(cmd, Recall):
        if cmd.offset < 0 or not cmd.msg_id:
            raise CommandError(f"a recall names an offset >= 0 and a message id: {cmd!r}")
        op, payload = OP_RECALL, {"offset": cmd.offset, "msg_id": cmd.msg_id}
    elif isinstance(cmd, DeleteTopic):
        op, payload = OP_DELETE_TOPIC, {"topic": check_topic(cmd.topic)}
    elif isinstance(cmd, DeleteGroup):
        op, payload = OP_DELETE_GROUP, {"group": check_group(cmd.group)}
    elif isinstance(cmd, SetConfig):
        op, payload = OP_SET_CONFIG, {"settings": cmd.settings}
    else:
        raise TypeError(f"not a broker command: {cmd!r}")
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return _HEAD.pack(_HEAD.size + len(raw), COMMAND_MAGIC, op) + raw


_MAGIC_U32 = struct.Struct(">I")  # a command's magic, at bytes 4..8
_MAGIC_I32 = struct.Struct(">i")  # a message's MAGICCODE, at bytes 4..8 (a Java int)


def is_command(body: bytes | memoryview) -> bool:
    return len(body) >= _HEAD.size and _MAGIC_U32.unpack_from(body, 4)[0] == COMMAND_MAGIC


def is_message(body: bytes | memoryview) -> bool:
    return len(body) >= OVERHEAD and _MAGIC_I32.unpack_from(body, 4)[0] == MAGIC_CODE


def decode(body: bytes | memoryview) -> Command:
    if not is_command(body):
        raise CommandError("not a broker command (magic differs)")
    total, _, op = _HEAD.unpack_from(body, 0)
    if total != len(body):
        raise CommandError(f"command TOTALSIZE {total} != {len(body)} bytes")
    try:
        payload = json.loads(bytes(body[_HEAD.size :]))
        if op == OP_CREATE_TOPIC:
            return CreateTopic(str(payload["topic"]), int(payload["queues"]))
        if op == OP_COMMIT_OFFSET:
            return CommitOffset(
                str(payload["group"]), str(payload["topic"]), int(payload["queue_id"]), int(payload["offset"])
            )
        if op == OP_POP:
            return Pop(
                str(payload["group"]),
                str(payload["topic"]),
                int(payload["queue_id"]),
                int(payload["now_ms"]),
                int(payload["invisible_ms"]),
                tuple(int(o) for o in payload["offsets"]),
                tuple(int(o) for o in payload.get("skip", ())),
                tuple((int(o), str(g)) for o, g in payload.get("groups", ())),
                str(payload.get("renew", "")),
            )
        if op == OP_ACK:
            return Ack(
                str(payload["group"]),
                str(payload["topic"]),
                int(payload["queue_id"]),
                int(payload["offset"]),
                int(payload["epoch"]),
            )
        if op == OP_CHANGE_INVISIBLE:
            return ChangeInvisible(
                str(payload["group"]),
                str(payload["topic"]),
                int(payload["queue_id"]),
                int(payload["offset"]),
                int(payload["epoch"]),
                int(payload["now_ms"]),
                int(payload["invisible_ms"]),
                bool(payload.get("renew", False)),
            )
        if op == OP_GROUP_SETTINGS:
            if not isinstance(payload["settings"], dict):
                raise TypeError("settings must be an object")
            return GroupSettingsCmd(str(payload["group"]), payload["settings"])
        if op == OP_SETTLE:
            return Settle(str(payload["kind"]), int(payload["offset"]), str(payload["reason"]))
        if op == OP_TX_CHECK:
            return TxCheck(int(payload["offset"]), int(payload["now_ms"]))
        if op == OP_RECALL:
            return Recall(int(payload["offset"]), str(payload["msg_id"]))
        if op == OP_DELETE_TOPIC:
            return DeleteTopic(str(payload["topic"]))
        if op == OP_DELETE_GROUP:
            return DeleteGroup(str(payload["group"]))
        if op == OP_SET_CONFIG:
            if not isinstance(payload["settings"], dict):
                raise TypeError("settings must be an object")
            return SetConfig(payload["settings"])
    except (ValueError, KeyError, TypeError) as err:
        raise CommandError(f"malformed command payload: {err}") from err
    raise CommandError(f"unknown command op {op}")


def _fields(cmd: Command) -> list[tuple[str, Any]]:
    return [(f, getattr(cmd, f)) for f in cmd.__slots__]
