"""What a producer does around the wire (docs/broker.md, "Producer sessions"): number its messages (producer
id, sequence, queue) and encode them in their stored form before the first attempt, and send them over its
sessions, one ``SendStream`` per node, shared by every concurrent send. ``broker_adapter.client``'s producers
are built on it.
"""

from __future__ import annotations

import itertools
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Sequence

from broker_adapter.core import message
from broker_adapter.core.model import SendResult, encode_outgoing
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger.batch_stream import Answer, BatchStream
from dledger.connections import Streams
from dledger.errors import DLedgerError, InvalidRequestError
from dledger.routing import Router
from dledger.transport import convert

MAX_PACK = 1024  # messages in one batch: the broker's MAX_SEND_BATCH


class Numbering:
    """What a producer stamps on a message before its first attempt: its id, a sequence, a queue."""

    def __init__(self, producer_id: str | None):
        self.producer_id = producer_id or uuid.uuid4().hex
        self._id_prefix = uuid.uuid4().hex.upper()[:22]
        self._seq = itertools.count()  # thread-safe in CPython: one producer may be shared by threads
        self._queues: dict[str, int] = {}
        self._rr = itertools.count(1)

    def _next(self, queues: int, keys: Sequence[str] | None) -> tuple[int, int, str]:
        """(sequence, queue id, message id) of the next message: fixed before its first attempt."""
        seq = next(self._seq)
        queue_id = zlib.crc32(keys[0].encode()) % queues if keys else next(self._rr) % queues
        return (
            seq,
            queue_id,
            f"{self._id_prefix}{seq:010X}",
        )  # unique: a prefix per producer, then the sequence

    def _number(
        self, queues: int, body: bytes, tags: str | None, keys: Sequence[str] | None
    ) -> broker_pb2.OutgoingMessage:
        seq, queue_id, msg_id = self._next(queues, keys)
        return broker_pb2.OutgoingMessage(
            queue_id=queue_id,
            body=body,
            tags=tags or "",
            keys=list(keys or ()),
            msg_id=msg_id,
            producer_id=self.producer_id,
            sequence=seq,
            born_timestamp=int(time.time() * 1000),
        )

    def _stored(
        self, topic: str, queues: int, body: bytes, tags: str | None, keys: Sequence[str] | None
    ) -> Stored:
        """A numbered message in its stored form, for a session (no ``OutgoingMessage`` in between)."""
        seq, queue_id, msg_id = self._next(queues, keys)
        raw, _ = message.encode_send(
            topic,
            body,
            queue_id,
            msg_id,
            tags=tags or "",
            keys=keys or (),
            producer_id=self.producer_id,
            sequence=seq,
            born_timestamp=int(time.time() * 1000),
        )
        return raw, msg_id, queue_id

    def _learn_topics(self, topics: Iterable[tuple[str, int]], topic: str) -> int:
        """Remember the group's topics ((name, queues) each); the queues of ``topic``, or NOT_FOUND."""
        for name, queues in topics:
            self._queues[name] = queues
        n = self._queues.get(topic)
        if n is None:
            raise DLedgerError(f"NOT_FOUND: unknown topic {topic!r}")
        return n


# (stored bytes, message id, queue id) of one message a producer numbered and encoded
Stored = tuple[bytes, str, int]
# (queue offset, CommitLog offset, duplicate) of one message a session stored
Placed = tuple[int, int, bool]


def stored_of(topic: str, m: broker_pb2.OutgoingMessage) -> bytes:
    """An ``OutgoingMessage`` a caller built (``outgoing``), in its stored form for a session."""
    try:
        return encode_outgoing(topic, m, m.msg_id, m.born_timestamp)[0]
    except message.MessageFormatError as e:
        raise InvalidRequestError(str(e)) from None


def _session_request(batch_id: int, raws: list[bytes]) -> broker_pb2.SendBatch:
    return broker_pb2.SendBatch(batch_id=batch_id, messages=raws)


def _session_answer(r: broker_pb2.SendBatchResult) -> Answer[Placed]:
    if r.HasField("error"):
        return r.batch_id, convert.append_error_from_pb(r.error), ()
    return r.batch_id, None, list(zip(r.queue_offsets, r.commitlog_offsets, r.duplicates, strict=True))


def results(topic: str, sent: Sequence[tuple[str, int]], placed: Sequence[Placed]) -> list[SendResult]:
    """``SendResult``s of messages ((message id, queue id) each) of one topic from what their session answered."""
    return [SendResult(i, topic, q, qo, co, dup) for (i, q), (qo, co, dup) in zip(sent, placed, strict=True)]


class Sessions:
    """A producer's sessions: one ``SendStream`` per node it sends to (the leader, normally), shared by every
    concurrent send of the producer. Follows the leader like any call (``dledger.routing``); a batch whose
    outcome is unknown (the leader died under it) is sent again, which is safe: the leader recognises each
    message by its producer id and sequence, so nothing is stored twice or lost."""

    def __init__(
        self,
        router: Router,
        timeout_s: float,
        retry_for_s: float,
        stub: Callable[[str], broker_pb2_grpc.BrokerStub],
    ):
        self._router = router
        self._timeout_s = timeout_s
        self._retry_for_s = retry_for_s
        # stub: an asyncio stub of the node at an address
        self._streams: Streams[bytes, Placed] = Streams(
            lambda address: BatchStream(
                stub(address).SendStream(), address, MAX_PACK, _session_request, _session_answer
            )
        )

    async def send(self, raws: list[bytes], within_s: float | None = None) -> Sequence[Placed]:
        """Where each message was stored, retrying (and following the leader) for ``within_s`` (default: the
        sessions' ``retry_for_s``)."""
        budget = self._retry_for_s if within_s is None else within_s
        attempts = self._router.attempts(budget, "SendStream", retry_unknown=True)
        return await self._streams.submit(attempts, raws, min(self._timeout_s, budget))

    async def close(self) -> None:
        await self._streams.close()
