"""What the protocol-neutral broker (``broker_adapter.core.broker``) takes and gives: messages to send, send results,
pulled batches, and the errors it raises.

The errors are ``dledger.errors`` classes (so the Broker gRPC face maps them to statuses as it maps any of
ours), narrowed where a face must tell cases apart: RocketMQ 5 answers a bad topic name, an unknown topic, an
unknown queue and an offset out of range with different protocol codes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from broker_adapter.core import commands, message, topics
from dledger.errors import InvalidRequestError, NotFoundError


class InvalidTopicError(InvalidRequestError):
    """A topic name that breaks RocketMQ's naming rule."""


class InvalidGroupError(InvalidRequestError):
    """A consumer group name that breaks RocketMQ's naming rule."""


class UnknownTopicError(NotFoundError):
    """A topic that does not exist (and is not created automatically)."""

    def __init__(self, topic: str, message: str):
        super().__init__(message)
        self.topic = topic


class UnknownQueueError(NotFoundError):
    """A queue id outside the topic's queues."""


class UnknownGroupError(NotFoundError):
    """A consumer group that never committed an offset."""


class OffsetRangeError(InvalidRequestError):
    """A queue offset outside the queue's range."""


def check_topic(topic: str) -> str:
    try:
        return commands.check_topic(topic)
    except commands.CommandError as e:
        raise InvalidTopicError(str(e)) from None


def check_user_topic(topic: str) -> str:
    """A topic a client may send to or read from (not one of the broker's system topics)."""
    check_topic(topic)
    if topic.startswith(topics.SYSTEM_PREFIX):
        raise InvalidTopicError(
            f"topic {topic!r} is the broker's own (delayed / transactional messages wait there); "
            f"clients cannot use topics starting with {topics.SYSTEM_PREFIX!r}"
        )
    return topic


def check_group(group: str) -> str:
    try:
        return commands.check_group(group)
    except commands.CommandError as e:
        raise InvalidGroupError(str(e)) from None


# How one message of a request is stored (``Broker.send_kinds``): as it is, held until its delivery time in the
# timer topic, or held as a transaction's half message until the transaction ends.
NORMAL: Final = "normal"
DELAY: Final = "delay"
TRANSACTION: Final = "transaction"


class Outgoing(Protocol):
    """A message to send, as a face hands it over: ``dledger.v1.OutgoingMessage`` satisfies it as it is (no
    copy on the Broker face's hot path); other faces build an ``OutgoingMessage``."""

    @property
    def queue_id(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str: ...
    @property
    def keys(self) -> Iterable[str]: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def producer_id(self) -> str: ...
    @property
    def sequence(self) -> int: ...


def encode_outgoing(
    topic: str, m: Outgoing, msg_id: str, born_timestamp: int
) -> tuple[bytes, dict[str, str]]:
    """An ``Outgoing`` in its stored form and the properties stamped in (``message.encode_send``): the leader's
    for a ``Send``, the client's for a producer session's message built with ``outgoing``."""
    return message.encode_send(
        topic,
        m.body,
        m.queue_id,
        msg_id,
        tags=m.tags,
        keys=m.keys,
        producer_id=m.producer_id,
        sequence=m.sequence,
        properties=m.properties,
        born_timestamp=born_timestamp,
    )


@dataclass(slots=True)
class OutgoingMessage:
    """An ``Outgoing`` built by a face that does not speak ``dledger.v1`` (RocketMQ 5)."""

    queue_id: int
    body: bytes
    tags: str = ""
    keys: list[str] = field(default_factory=list)
    msg_id: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    producer_id: str = ""  # with ``sequence``: an idempotent send, stored once however often it is retried
    sequence: int = 0


@dataclass(slots=True)
class SendResult:
    """Where one sent message is. ``duplicate``: a retry of a (producer, sequence) already in the log; its offsets
    are -1 when the first attempt is older than the remembered window. Not frozen: see ``formats.Route``."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Pulled:
    """A pull's messages (consecutive queue offsets from the one asked), the offset to pull next and the queue's
    end on this node."""

    messages: list[message.Message]
    next_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class PulledRaw:
    """A pull at batch granularity: ``count`` messages as the CommitLog stores them, concatenated (each starts
    with its TOTALSIZE), the offset to pull next and the queue's end on this node."""

    data: bytes
    count: int
    next_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class RouteInfo:
    node_id: str
    leader_id: str | None
    leader_address: str | None
    term: int
    max_commitlog_offset: int


# -- administration (core/admin.py; the admin client answers with the same) ------------------------------------
@dataclass(frozen=True, slots=True)
class QueueStatus:
    topic: str
    queue_id: int
    min_offset: int  # the first offset this node's log still holds
    max_offset: int  # the queue's end: the offset of its next message
    last_store_ms: int  # the store time of its last message (0: none held)


@dataclass(frozen=True, slots=True)
class GroupQueue:
    topic: str
    queue_id: int
    committed: int | None  # None: the group committed nothing on this queue
    max_offset: int
    in_flight: int  # RocketMQ receives not yet acknowledged (pop consumers)

    @property
    def lag(self) -> int:
        return max(0, self.max_offset - (self.committed or 0))


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group: str
    topics: tuple[str, ...]
    lag: int
    has_settings: bool


@dataclass(frozen=True, slots=True)
class OffsetReset:
    queue_id: int
    old: int | None
    new: int
