"""ReceiveMessage, AckMessage and ChangeInvisibleDuration on the RocketMQ 5 face: the official consumers' receipt
handles checked and their deliveries popped, acknowledged and made invisible longer through the broker's pop state
(``Broker.pops``; docs/rocketmq.md, "Consumption state"), with the PushConsumer's automatic renewal
(``renewal.Renewals``). The leader's side: ``servicer`` forwards these calls from followers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2

from broker_adapter.core.broker import Broker
from broker_adapter.core.clock import now_ms
from broker_adapter.core.invisibility import Handled, Outcome
from broker_adapter.core.model import check_group
from broker_adapter.rocketmq import convert
from broker_adapter.rocketmq.forward import client_id
from broker_adapter.rocketmq.receipt import ReceiptHandle, ReceiptHandleError
from broker_adapter.rocketmq.renewal import Renewals
from broker_adapter.rocketmq.status import RocketMQError, bad_request, from_dledger, of, status
from dledger.errors import DLedgerError

MAX_RECEIVE_BATCH: Final = 1024
MIN_INVISIBLE_MS: Final = 1_000
MAX_INVISIBLE_MS: Final = 12 * 3600 * 1000  # RocketMQ's upper bound
DEFAULT_INVISIBLE_MS: Final = 60_000  # a push consumer asks for none (auto renew): RocketMQ's proxy default
MAX_POLLING_MS: Final = 60_000


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


class Receives:
    """The leader's side of receiving and acknowledging: ``deadline(context, margin_s)`` is the loop time by
    which a call must be answered (the servicer's, from the client's timeout)."""

    def __init__(self, broker: Broker, renewals: Renewals, deadline: Callable[[Any, float], float]):
        self._broker = broker
        self.renewals = renewals
        self._deadline = deadline

    def _queue(self, mq: definition_pb2.MessageQueue) -> tuple[str, int]:
        self._broker.check_queue(mq.topic.name, mq.id)
        return mq.topic.name, mq.id

    async def receive(self, request, context) -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        group = check_group(request.group.name)
        self.renewals.touch(client_id(context))  # a long-polling client is alive: its messages stay renewed
        topic, qid = self._queue(request.message_queue)
        batch = request.batch_size
        if not 1 <= batch <= MAX_RECEIVE_BATCH:
            raise bad_request(f"batch_size must be in 1..{MAX_RECEIVE_BATCH}, got {batch}")
        # no invisible duration: a PushConsumer's auto-renewed receive ([broker] auto_renew_invisible_ms)
        invisible_ms = self.renewals.slice_ms if request.auto_renew else DEFAULT_INVISIBLE_MS
        if request.HasField("invisible_duration"):
            invisible_ms = duration_ms(request.invisible_duration)
            if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
                raise bad_request(
                    f"invisible_duration must be {MIN_INVISIBLE_MS} ms to {MAX_INVISIBLE_MS} ms, got {invisible_ms} ms",
                    Code.ILLEGAL_INVISIBLE_TIME,
                )
        poll_ms = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        poll_ms = polling_ms(poll_ms)
        got = await self._broker.pops.receive(
            group,
            topic,
            qid,
            convert.check_filter(request.filter_expression),
            batch,
            invisible_ms,
            poll_ms,
            self._deadline(context, margin_s=0.3),
            renew=client_id(context) if request.auto_renew else "",
        )
        if not got:
            yield service_pb2.ReceiveMessageResponse(
                status=status(Code.MESSAGE_NOT_FOUND, "no message to receive")
            )
            return
        qid, popped, msgs = got
        if request.auto_renew:
            self.renewals.received(group, topic, popped, client_id(context))
        yield service_pb2.ReceiveMessageResponse(status=status())
        # As RocketMQ's proxy does: the clients time delivery latency from it (the PushConsumer fails every
        # received batch without it).
        yield service_pb2.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(now_ms()))
        handle = ReceiptHandle(group, topic, qid, 0, 0, popped.deadline_ms).encoder()
        response = service_pb2.ReceiveMessageResponse
        for d in popped.deliveries:
            r = response()  # the message is built in place: no copy of it (and its body) into the response
            convert.incoming(
                msgs[d.offset],
                receipt_handle=handle(d.offset, d.epoch),
                attempt=d.attempt,
                invisible_ms=invisible_ms,
                out=r.message,
            )
            yield r

    def handle(self, text: str, group: str, topic: str) -> ReceiptHandle:
        try:
            h = ReceiptHandle.decode(text)
        except ReceiptHandleError as e:
            raise bad_request(str(e), Code.INVALID_RECEIPT_HANDLE) from None
        if (h.group, h.topic) != (group, topic):
            raise bad_request(
                f"the receipt handle is for group {h.group!r} and topic {h.topic!r}, not {group!r} and {topic!r}",
                Code.INVALID_RECEIPT_HANDLE,
            )
        return h

    async def ack(self, request, context) -> service_pb2.AckMessageResponse:
        group = check_group(request.group.name)
        topic = request.topic.name
        self._broker.queues(topic)
        entries = request.entries
        if len(entries) == 1:  # the official clients ack one message per call: no per-entry lists
            e = entries[0]
            try:
                h = self.handle(e.receipt_handle, group, topic)
            except RocketMQError as err:
                st = of(err)
            else:
                renewals = self.renewals
                epoch = renewals.epoch(group, topic, h.queue_id, h.offset, h.epoch)
                (r,) = await self._broker.pops.ack(group, topic, ((h.queue_id, h.offset, epoch),))
                renewals.done(group, topic, h.queue_id, h.offset)
                st = handled_status(r, "acknowledge")
            resp = service_pb2.AckMessageResponse(status=st)
            resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle, status=st)
            return resp
        if not 1 <= len(entries) <= MAX_RECEIVE_BATCH:
            raise bad_request(f"an AckMessageRequest carries 1..{MAX_RECEIVE_BATCH} entries")
        statuses: list[definition_pb2.Status | None] = []
        acks: list[tuple[int, tuple[int, int, int]]] = []
        for i, e in enumerate(request.entries):
            try:
                h = self.handle(e.receipt_handle, group, topic)
            except RocketMQError as err:
                statuses.append(of(err))
                continue
            statuses.append(None)
            epoch = self.renewals.epoch(group, topic, h.queue_id, h.offset, h.epoch)
            acks.append((i, (h.queue_id, h.offset, epoch)))
        if acks:
            done = await self._broker.pops.ack(group, topic, [a for _, a in acks])
            for _, (q, o, _e) in acks:
                self.renewals.done(group, topic, q, o)
            for (i, _), r in zip(acks, done, strict=True):
                statuses[i] = handled_status(r, "acknowledge")
        resp = service_pb2.AckMessageResponse(status=overall(statuses))
        for e, st in zip(request.entries, statuses, strict=True):
            resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle, status=st)
        return resp

    async def change(self, request, context) -> service_pb2.ChangeInvisibleDurationResponse:
        group = check_group(request.group.name)
        topic = request.topic.name
        self._broker.queues(topic)
        h = self.handle(request.receipt_handle, group, topic)
        invisible_ms = duration_ms(request.invisible_duration)
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise bad_request(
                f"invisible_duration must be 0..{MAX_INVISIBLE_MS} ms, got {invisible_ms} ms",
                Code.ILLEGAL_INVISIBLE_TIME,
            )
        epoch = self.renewals.epoch(group, topic, h.queue_id, h.offset, h.epoch)
        self.renewals.done(group, topic, h.queue_id, h.offset)  # the client decides from now on
        r = await self._broker.pops.change_invisible(group, topic, h.queue_id, h.offset, epoch, invisible_ms)
        st = handled_status(r, "change the invisible duration of")
        if st.code != Code.OK:
            return service_pb2.ChangeInvisibleDurationResponse(status=st)
        new = ReceiptHandle(group, topic, h.queue_id, h.offset, r.epoch, r.deadline_ms)
        return service_pb2.ChangeInvisibleDurationResponse(status=st, receipt_handle=new.encode())


def polling_ms(poll_ms: int) -> int:
    if not 0 <= poll_ms <= MAX_POLLING_MS:
        raise bad_request(
            f"long_polling_timeout must be 0..{MAX_POLLING_MS} ms, got {poll_ms} ms",
            Code.ILLEGAL_POLLING_TIME,
        )
    return poll_ms


def handled_status(r: Any, verb: str) -> definition_pb2.Status:
    """The status of one applied Ack / ChangeInvisible."""
    if isinstance(r, Handled):
        if r.outcome is Outcome.DONE:
            return status()
        if r.outcome is Outcome.ALREADY:
            if verb == "acknowledge":
                return status(message="already acknowledged")
            return status(Code.INVALID_RECEIPT_HANDLE, "the message was already acknowledged")
        if r.outcome is Outcome.REDELIVERED:
            return status(
                Code.INVALID_RECEIPT_HANDLE,
                f"cannot {verb} this delivery: its invisible time ran out and the message was delivered again "
                "(use the newer receipt handle)",
            )
        return status(Code.INVALID_RECEIPT_HANDLE, f"cannot {verb} a message the group never received")
    if isinstance(r, DLedgerError):
        return of(from_dledger(r))
    return status(Code.INVALID_RECEIPT_HANDLE, str(r))


def overall(statuses: Sequence[definition_pb2.Status | None]) -> definition_pb2.Status:
    if len(statuses) == 1 and statuses[0] is not None:  # the official clients ack one message per call
        return statuses[0]
    codes = {s.code for s in statuses if s is not None}
    if codes == {Code.OK}:
        return status()
    if len(codes) == 1:
        return next(s for s in statuses if s is not None)
    return status(Code.MULTIPLE_RESULTS, "entries have different results")
