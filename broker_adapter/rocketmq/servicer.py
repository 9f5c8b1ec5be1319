"""``apache.rocketmq.v2.MessagingService`` on every node of a broker group: the official RocketMQ 5 clients
produce and consume unchanged. A face over ``broker_adapter.core.broker``: it checks what is particular to the
protocol (batch sizes, durations, receipt handles, message types), converts, calls the broker and answers its
errors with protocol codes (``status.from_dledger``).

Every call answers with a protocol ``Status`` (never a bare gRPC error, except for bytes that are not the
request message at all: INVALID_ARGUMENT). Calls that read or change broker state are served by the leader; a
follower forwards them (``forward``); those are not written out one by one but made from the tables
``LEADER_UNARY`` and ``LEADER_STREAMS`` (method -> what serves it on the leader). What each call does:

- QueryRoute / QueryAssignment: the topic's queues on one broker (the group), the client's own access point
  as its endpoints (``route.advertised``); an unknown topic is TOPIC_NOT_FOUND. Every push consumer is assigned every queue.
- Heartbeat / NotifyClientTermination: the node's table of live clients (not replicated: it is only advice).
- Telemetry: answers each client ``Settings`` with the server's settings (``route.settings_for``, with a
  consumer group's replicated delivery settings), and sends a producer the leader's transaction check-backs
  (RecoverOrphanedTransactionCommand) on its stream.
- SendMessage: the messages become the broker's outgoing messages (``convert``), sent through ``Broker.send``
  (idempotent, acknowledged at quorum commit); the queue is the message group's hash, else round robin.
  Delayed messages wait in the timer topic and transactional ones in the half topic (``broker_delivery``).
  A follower of a plain group relays normal and FIFO messages on its own producer session to the leader
  instead of forwarding the call (``RELAYED``, ``sending.Sends.relay``).
- EndTransaction: commits (a copy to the topic) or rolls back an open transaction, by its transaction id (the
  message id, which every send receipt carries as its transaction id, as RocketMQ does).
- ForwardMessageToDeadLetterQueue: copies the delivery named by a receipt handle to ``%DLQ%<group>``.
- ReceiveMessage: a pop (``broker_pop``), streamed with a receipt handle per message. With nothing deliverable
  it long-polls until a message is dispatched, an invisible time runs out, or the client's polling time ends
  (then MESSAGE_NOT_FOUND).
- AckMessage / ChangeInvisibleDuration: ``Ack`` / ``ChangeInvisible`` commands through the log.
- PullMessage / UpdateOffset / GetOffset / QueryOffset: ConsumeQueue reads and the replicated committed offsets
  our own ``Consumer`` uses (``CommitOffset`` commands).
- RecallMessage: cancels a delayed message before it is due, named by the recall handle of its send receipt
  (``recall``), with a ``Recall`` command through the log; NOT_FOUND once it was delivered.
- SyncLiteSubscription: UNSUPPORTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import grpc
from rocketmq.grpc_protocol import (
    ClientType,
    Code,
    MessageType,
    TransactionResolution,
    definition_pb2,
    service_pb2,
    service_pb2_grpc,
)

from broker_adapter.core import message
from broker_adapter.core.broker import Broker
from broker_adapter.core.clock import now_ms
from broker_adapter.core.groups import DEFAULT as DEFAULT_GROUP
from broker_adapter.core.invisibility import Handled
from broker_adapter.core.model import UnknownTopicError, check_group
from broker_adapter.core.transactions import Half
from broker_adapter.rocketmq import cluster_routes, convert, route
from broker_adapter.rocketmq.forward import Forwarder, client_id, forwarded
from broker_adapter.rocketmq.recall import RecallHandle, RecallHandleError
from broker_adapter.rocketmq.receiving import (
    MAX_RECEIVE_BATCH,
    Receives,
    duration_ms,
    handled_status,
    polling_ms,
)
from broker_adapter.rocketmq.renewal import Renewals
from broker_adapter.rocketmq.sending import HEADROOM, Sends
from broker_adapter.rocketmq.status import RocketMQError, bad_request, from_dledger, of, status, unsupported
from dledger.errors import DLedgerError, NotLeaderError, OutcomeUnknownError

DEFAULT_DEADLINE_S: Final = 10.0
MAX_CLIENTS: Final = 10_000
TELEMETRY_OUTBOX: Final = 1024  # commands waiting to go out on one Telemetry stream; more are dropped
# Lite-topic consumers (docs/rocketmq.md, Not supported): refused at their settings, before any receive.
_LITE_CLIENTS: Final = frozenset({ClientType.LITE_PUSH_CONSUMER, ClientType.LITE_SIMPLE_CONSUMER})

SERVICE: Final = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
SERVICE_NAME: Final = SERVICE.full_name
# Calls the leader serves again, on whichever node leads next, when leadership was lost under them (the outcome
# unknown): those whose second attempt cannot undo or repeat what a first one did. An ack names a delivery epoch,
# so acknowledging a delivery twice answers "already acknowledged" (``invisibility``). The official clients never
# retry an ack, and an ack lost to a leader change is a redelivery (docs/rocketmq.md, "Consumption state").
RETRIED_ON_LEADER_CHANGE: Final = frozenset({"AckMessage"})


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_type: int
    group: str
    last_seen: float


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, broker: Broker, cluster: Any = None):
        """``cluster``: the node's name-server registrar (``broker_adapter.nameserver.registrar.Registrar``) when
        its group belongs to a cluster; routes then also list the topic's queues in the other groups."""
        self._broker = broker
        self._cluster = cluster
        self._node = broker.node
        self._forward = Forwarder(broker.node)
        self._sends = Sends(broker, self._forward.channel)
        # (method, "here" | "relayed" | "forwarded"): how this node's leader calls were served (its metrics)
        self.calls: Counter[tuple[str, str]] = Counter()
        self.routes = route.Routes(self._node.group, self._node.config.peers.values())
        self._node.add_role_listener(self.routes.clear)
        self.clients: OrderedDict[str, ClientInfo] = OrderedDict()
        # the PushConsumer's auto_renew: the leader keeps its messages invisible while its listener runs
        self.renewals = Renewals(
            broker.pops.change_invisible,
            now_ms,
            broker.settings.auto_renew_invisible_ms,
            ready=broker.leader_state,
            pops=lambda: broker.sm.pops,  # replaced when a snapshot loads: read it through the state machine
        )
        self._node.add_role_listener(self.renewals.role_changed)
        self._receives = Receives(broker, self.renewals, self._deadline)
        # Producers' open Telemetry streams on this node, by client id: (their topics, the stream's outbox).
        self._producers: dict[str, tuple[frozenset[str], asyncio.Queue]] = {}
        broker.delivery.on_tx_check = self._check_transaction

    def secure(self) -> bool:
        """Whether the group checks signatures: then followers forward call by call, not on a stream."""
        return self._node.config.security is not None

    def credentials_reloaded(self) -> None:
        """The node reloaded its certificates: forwarding dials the leader with them from now on."""
        self._forward.redial()

    async def close(self) -> None:
        await self.renewals.close()
        await self._sends.close()
        await self._forward.close()

    # -- plumbing ------------------------------------------------------------------------------------------
    def _deadline(self, context: grpc.aio.ServicerContext, margin_s: float = 0.1) -> float:
        left = context.time_remaining()
        left = DEFAULT_DEADLINE_S if left is None else left
        return asyncio.get_running_loop().time() + max(0.05, left - margin_s)

    async def _unary(
        self,
        method: str,
        request: Any,
        context: Any,
        local: Callable,
        response: type,
        raw: bytes | None,
        relay: Callable | None = None,
    ) -> Any:
        """Serve on the leader, or forward (the client's bytes, ``raw``, when the handler passed them). On the
        leader the call goes straight to ``local`` (no deadline, forwarding coroutine or closure per call: the
        forwarder would do the same after asking the same question). ``relay``: what a follower tries before
        forwarding (its answer, or None to forward)."""
        calls = self.calls
        try:
            try:
                if self._node.is_leader():
                    calls[(method, "here")] += 1
                    return await local(request, context)
            except (OutcomeUnknownError, NotLeaderError):
                if method not in RETRIED_ON_LEADER_CHANGE:
                    raise
                # Once more, on whichever node leads next (this one again, or forwarded there).
            # A secure group's leader checks every client's signature on a call of its own: no relaying there.
            if relay is not None and not forwarded(context) and not self.secure():
                answer = await relay(request, context, self._deadline(context))
                if answer is not None:
                    calls[(method, "relayed")] += 1
                    return answer
            calls[(method, "forwarded")] += 1
            return await self._forward.unary(
                method,
                request if raw is None else raw,
                context,
                self._deadline(context),
                lambda: local(request, context),
                _lost_leadership(response) if method in RETRIED_ON_LEADER_CHANGE else None,
            )
        except RocketMQError as e:
            return response(status=of(e))
        except DLedgerError as e:
            return response(status=of(from_dledger(e)))

    async def _stream(
        self, method: str, request: Any, context: Any, local: Callable, response: type, raw: bytes | None
    ):
        try:
            if self._node.is_leader():  # as in ``_unary``
                self.calls[(method, "here")] += 1
                async for r in local(request, context):
                    yield r
                return
            self.calls[(method, "forwarded")] += 1
            async for r in self._forward.stream(
                method,
                request if raw is None else raw,
                context,
                self._deadline(context),
                lambda: local(request, context),
            ):
                yield r
        except RocketMQError as e:
            yield response(status=of(e))
        except DLedgerError as e:
            yield response(status=of(from_dledger(e)))

    def _queue(self, mq: definition_pb2.MessageQueue) -> tuple[str, int]:
        self._broker.check_queue(mq.topic.name, mq.id)
        return mq.topic.name, mq.id

    # -- routes, clients, settings -------------------------------------------------------------------------
    def _leader_address(self) -> str | None:
        node = self._node
        lead = node.id if node.is_leader() else node.leader_id
        return node.address_of(lead) if lead else None

    async def QueryRoute(self, request, context, raw=None):
        return await self._known_topic(
            "QueryRoute",
            request,
            context,
            lambda n: (
                self.routes.route(request.topic, n, self._leader_address(), request.endpoints)
                + self._other_groups(request, cluster_routes.route_tail)
            ),
            service_pb2.QueryRouteResponse,
            raw,
        )

    async def QueryAssignment(self, request, context, raw=None):
        def answer(n: int) -> bytes:
            check_group(request.group.name)
            return self.routes.assignment(
                request.topic, n, self._leader_address(), request.endpoints
            ) + self._other_groups(request, cluster_routes.assignment_tail)

        return await self._known_topic(
            "QueryAssignment", request, context, answer, service_pb2.QueryAssignmentResponse, raw
        )

    def _other_groups(self, request, tail: Callable[..., bytes]) -> bytes:
        """The topic's queues in the cluster's other groups (docs/cluster.md), serialized to follow this
        group's answer; nothing for a group on its own."""
        if self._cluster is None:
            return b""
        others = self._cluster.other_groups(request.topic.name, self._node.group)
        return tail(request.topic, others, len(request.endpoints.addresses) == 1)

    async def _known_topic(
        self,
        method: str,
        request,
        context,
        answer: Callable[[int], Any],
        response: type,
        raw: bytes | None = None,
    ):
        """Answer from this node's topics; a topic it does not know (yet) is asked of the leader, which creates
        it first when auto-create is on (as RocketMQ's autoCreateTopicEnable does at a producer's first route
        query)."""
        topic = request.topic.name
        b = self._broker
        try:
            try:
                return answer(b.queues(topic))
            except UnknownTopicError:
                if self._forward.is_leader():
                    return answer(await b.ensure_topic(topic))
                if forwarded(context):
                    raise

            async def leader_view(_req, _ctx):
                await b.leader_state()
                return answer(await b.ensure_topic(topic))

            try:
                return await self._forward.unary(
                    method,
                    request if raw is None else raw,
                    context,
                    self._deadline(context),
                    lambda: leader_view(request, context),
                )
            except RocketMQError as e:
                if e.code == Code.HA_NOT_AVAILABLE:
                    return answer(b.queues(topic))  # no leader: this node's view (not found)
                raise
        except RocketMQError as e:
            return response(status=of(e))
        except DLedgerError as e:
            return response(status=of(from_dledger(e)))

    def _seen(self, context, client_type: int, group: str) -> None:
        cid = client_id(context)
        if not cid:
            raise bad_request("requests must carry the x-mq-client-id header", Code.CLIENT_ID_REQUIRED)
        self.clients.pop(cid, None)
        self.clients[cid] = ClientInfo(client_type, group, time.monotonic())
        self.renewals.touch(cid)
        while len(self.clients) > MAX_CLIENTS:
            self.clients.popitem(last=False)

    async def Heartbeat(self, request, context):
        try:
            group = check_group(request.group.name) if request.HasField("group") else ""
            self._seen(context, request.client_type, group)
            return service_pb2.HeartbeatResponse(status=status())
        except RocketMQError as e:
            return service_pb2.HeartbeatResponse(status=of(e))
        except DLedgerError as e:
            return service_pb2.HeartbeatResponse(status=of(from_dledger(e)))

    async def NotifyClientTermination(self, request, context):
        self.clients.pop(client_id(context), None)
        return service_pb2.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator, context):
        """Answers settings as they come, and relays what the broker sends a producer (transaction
        check-backs) through the same stream: one reader task feeds one outbox."""
        max_body = self._node.config.max_body_bytes - HEADROOM
        outbox: asyncio.Queue = asyncio.Queue(maxsize=TELEMETRY_OUTBOX)
        cid = client_id(context)

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if not cmd.HasField("settings"):
                        continue  # thread stack traces, verify-message results: nothing asked them of this broker
                    s = cmd.settings
                    if not s.HasField("client_type") or s.client_type == 0:
                        await outbox.put(
                            service_pb2.TelemetryCommand(
                                status=status(Code.UNRECOGNIZED_CLIENT_TYPE, "settings carry no client type")
                            )
                        )
                        continue
                    if s.client_type in _LITE_CLIENTS:
                        await outbox.put(service_pb2.TelemetryCommand(status=of(unsupported("lite topics"))))
                        continue
                    try:
                        convert.check_subscriptions(s)
                    except RocketMQError as e:
                        await outbox.put(service_pb2.TelemetryCommand(status=of(e)))
                        continue
                    group = s.subscription.group.name if s.HasField("subscription") else ""
                    with contextlib.suppress(RocketMQError):
                        self._seen(context, s.client_type, group)
                    if s.client_type == ClientType.PRODUCER and cid:
                        self._producers[cid] = (frozenset(t.name for t in s.publishing.topics), outbox)
                    gs = self._broker.sm.group_settings(group) if group else DEFAULT_GROUP
                    await outbox.put(
                        service_pb2.TelemetryCommand(
                            status=status(), settings=route.settings_for(s, max_body, gs)
                        )
                    )
            finally:
                await outbox.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await outbox.get()) is not None:
                yield item
        finally:
            reader.cancel()
            if cid and self._producers.get(cid, (None, None))[1] is outbox:
                del self._producers[cid]

    def _check_transaction(self, half: Half, m: message.Message) -> None:
        """Ask a producer of the half message's topic whose stream this node holds to resolve it (the leader's
        check-back, counted in the log and applied on every node). Nodes without one ask nobody."""
        for topics, outbox in list(self._producers.values()):
            if half.topic in topics or not topics:
                msg = convert.incoming(m)
                msg.topic.name = half.topic
                msg.system_properties.message_type = int(MessageType.TRANSACTION)
                cmd = service_pb2.TelemetryCommand(status=status())
                rc = cmd.recover_orphaned_transaction_command
                rc.message.CopyFrom(msg)
                rc.transaction_id = half.transaction_id
                with contextlib.suppress(asyncio.QueueFull):
                    outbox.put_nowait(cmd)
                return

    # -- offsets -------------------------------------------------------------------------------------------
    async def _pull(self, request, context) -> AsyncIterator[service_pb2.PullMessageResponse]:
        check_group(request.group.name)
        topic, qid = self._queue(request.message_queue)
        batch = request.batch_size
        if not 1 <= batch <= MAX_RECEIVE_BATCH:
            raise bad_request(f"batch_size must be in 1..{MAX_RECEIVE_BATCH}, got {batch}")
        poll_ms = polling_ms(duration_ms(request.long_polling_timeout))
        found, next_offset = await self._broker.pull_selected(
            topic,
            qid,
            request.offset,
            batch,
            convert.check_filter(request.filter_expression),
            poll_ms,
            self._deadline(context, margin_s=0.3),
        )
        if found:
            yield service_pb2.PullMessageResponse(status=status())
        else:
            yield service_pb2.PullMessageResponse(
                status=status(Code.MESSAGE_NOT_FOUND, "no message at this offset")
            )
        for m in found:
            yield service_pb2.PullMessageResponse(message=convert.incoming(m))
        yield service_pb2.PullMessageResponse(next_offset=next_offset)

    async def _update_offset(self, request, context) -> service_pb2.UpdateOffsetResponse:
        mq = request.message_queue
        await self._broker.commit_offset(request.group.name, mq.topic.name, mq.id, request.offset)
        return service_pb2.UpdateOffsetResponse(status=status())

    async def _get_offset(self, request, context) -> service_pb2.GetOffsetResponse:
        group, mq = request.group.name, request.message_queue
        o = await self._broker.committed_offset(group, mq.topic.name, mq.id)
        if o is None:
            raise RocketMQError(
                Code.OFFSET_NOT_FOUND, f"group {group!r} has no offset for {mq.topic.name}/{mq.id}"
            )
        return service_pb2.GetOffsetResponse(status=status(), offset=o)

    async def _query_offset(self, request, context) -> service_pb2.QueryOffsetResponse:
        await self._broker.leader_state()
        topic, qid = self._queue(request.message_queue)
        policy = request.query_offset_policy
        if policy == definition_pb2.BEGINNING:
            offset = self._broker.first_held(topic, qid)  # what retention kept
        elif policy == definition_pb2.END:
            offset = self._broker.sm.next_offset(topic, qid)
        elif policy == definition_pb2.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise bad_request("query_offset_policy TIMESTAMP needs a timestamp")
            offset = self._broker.first_stored_at(topic, qid, request.timestamp.ToMilliseconds())
        else:
            raise bad_request(f"unknown query_offset_policy {policy}")
        return service_pb2.QueryOffsetResponse(status=status(), offset=offset)

    # -- transactions and dead letters --------------------------------------------------------------------
    async def _end_transaction(self, request, context) -> service_pb2.EndTransactionResponse:
        tid = request.transaction_id
        if not tid:
            raise bad_request(
                "an EndTransactionRequest needs the transaction id of the send receipt",
                Code.INVALID_TRANSACTION_ID,
            )
        if request.resolution not in (TransactionResolution.COMMIT, TransactionResolution.ROLLBACK):
            raise bad_request(f"resolution must be COMMIT or ROLLBACK, got {request.resolution}")
        await self._broker.delivery.end_transaction(
            tid,
            request.resolution == TransactionResolution.COMMIT,
            request.topic.name or None,
            request.message_id,
        )
        return service_pb2.EndTransactionResponse(status=status())

    async def _forward_dead(self, request, context) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        group = check_group(request.group.name)
        topic = request.topic.name
        self._broker.queues(topic)
        h = self._receives.handle(request.receipt_handle, group, topic)
        r = await self._broker.pops.forward_dead(group, topic, h.queue_id, h.offset, h.epoch)
        st = handled_status(
            Handled(group, topic, h.queue_id, h.offset, r), "forward to the dead-letter queue"
        )
        return service_pb2.ForwardMessageToDeadLetterQueueResponse(status=st)

    # -- recall --------------------------------------------------------------------------------------------
    async def _recall(self, request, context) -> service_pb2.RecallMessageResponse:
        topic = request.topic.name
        self._broker.queues(topic)
        try:
            h = RecallHandle.decode(request.recall_handle)
        except RecallHandleError as e:
            raise bad_request(f"{e} (use the recall_handle of a delayed message's send receipt)") from None
        if h.topic != topic:
            raise bad_request(f"the recall handle is for topic {h.topic!r}, not {topic!r}")
        if h.group != self._node.group:
            raise bad_request(
                f"the recall handle was issued by broker group {h.group!r}, not {self._node.group!r}: "
                "recall through that group's endpoints"
            )
        await self._broker.delivery.recall(topic, h.offset, h.msg_id, h.due_ms)
        return service_pb2.RecallMessageResponse(status=status(), message_id=h.msg_id)

    # -- not supported -------------------------------------------------------------------------------------

    async def SyncLiteSubscription(self, request, context):
        return service_pb2.SyncLiteSubscriptionResponse(
            status=of(unsupported("lite topics (SyncLiteSubscription)"))
        )


# The calls served on the leader and forwarded there by a follower (``_unary``, ``_stream``): each method of
# the MessagingService, with the servicer attribute that serves it on the leader.
LEADER_UNARY: Final = {
    "SendMessage": "_sends.send",
    "AckMessage": "_receives.ack",
    "ChangeInvisibleDuration": "_receives.change",
    "UpdateOffset": "_update_offset",
    "GetOffset": "_get_offset",
    "QueryOffset": "_query_offset",
    "EndTransaction": "_end_transaction",
    "ForwardMessageToDeadLetterQueue": "_forward_dead",
    "RecallMessage": "_recall",
}
LEADER_STREAMS: Final = {"ReceiveMessage": "_receives.receive", "PullMessage": "_pull"}
# What a follower tries before forwarding such a call (``_unary``'s ``relay``).
RELAYED: Final = {"SendMessage": "_sends.relay"}


def _response_class(method: str) -> type:
    return getattr(service_pb2, SERVICE.methods_by_name[method].output_type.name)


def _leader_unary(method: str, local: str) -> Callable:
    response, serve = _response_class(method), attrgetter(local)
    relayed = RELAYED.get(method)
    relay = attrgetter(relayed) if relayed is not None else None

    async def call(self: MessagingServicer, request: Any, context: Any, raw: bytes | None = None) -> Any:
        return await self._unary(
            method, request, context, serve(self), response, raw, relay(self) if relay is not None else None
        )

    call.__name__ = call.__qualname__ = method
    return call


def _leader_stream(method: str, local: str) -> Callable:
    response, serve = _response_class(method), attrgetter(local)

    async def call(self: MessagingServicer, request: Any, context: Any, raw: bytes | None = None) -> Any:
        async for r in self._stream(method, request, context, serve(self), response, raw):
            yield r

    call.__name__ = call.__qualname__ = method
    return call


for _method, _local in LEADER_UNARY.items():
    setattr(MessagingServicer, _method, _leader_unary(_method, _local))
for _method, _local in LEADER_STREAMS.items():
    setattr(MessagingServicer, _method, _leader_stream(_method, _local))


def _lost_leadership(response: type) -> Callable[[bytes], bool]:
    """Whether a leader's answer (bytes) says it lost leadership under the call, or no leader was found: the
    statuses ``from_dledger`` gives those (docs/rocketmq.md, "Consumption state")."""
    parse = response.FromString

    def lost(answer: bytes) -> bool:
        return parse(answer).status.code in (Code.HA_NOT_AVAILABLE, Code.PROXY_TIMEOUT)

    return lost
