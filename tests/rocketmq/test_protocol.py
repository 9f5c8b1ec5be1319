"""RocketMQ 5's offset-based calls and the calls we do not support, through the generated stub on a real group.

PullMessage / UpdateOffset / GetOffset / QueryOffset map onto our ConsumeQueues and the replicated committed
offsets (our own Consumer sees the same offsets); SyncLiteSubscription answers the protocol's UNSUPPORTED at once
with a message saying what is not supported, and the node goes on serving; EndTransaction, RecallMessage and
ForwardMessageToDeadLetterQueue refuse ids and handles the broker never issued.
"""

from __future__ import annotations

import time

import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from rocketmq.grpc_protocol import Code, definition_pb2, service_pb2

from broker_adapter.client import BrokerConnection
from broker_adapter.client import Consumer as OurConsumer
from broker_adapter.client import Producer as OurProducer
from tests.rocketmq.conftest import META, create_topic, stub

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "rmq-offsets"


def res(name: str) -> definition_pb2.Resource:
    return definition_pb2.Resource(name=name)


def queue(qid: int, topic: str = TOPIC) -> definition_pb2.MessageQueue:
    return definition_pb2.MessageQueue(topic=res(topic), id=qid)


def pull(s, offset: int, batch: int = 32, group: str = "puller"):
    req = service_pb2.PullMessageRequest(
        group=res(group),
        message_queue=queue(0),
        offset=offset,
        batch_size=batch,
        filter_expression=definition_pb2.FilterExpression(type=definition_pb2.TAG, expression="*"),
        long_polling_timeout=duration_pb2.Duration(seconds=0),
    )
    status, messages, next_offset = None, [], None
    for r in s.PullMessage(req, metadata=META, timeout=10):
        if r.HasField("status"):
            status = r.status
        elif r.HasField("message"):
            messages.append(r.message)
        else:
            next_offset = r.next_offset
    return status, messages, next_offset


def test_offset_calls_map_onto_consume_queues_and_replicated_offsets(broker_group):
    g = broker_group
    create_topic(g, TOPIC, 1)
    t0 = time.time()
    with OurProducer(g.addresses) as p:
        sent = [p.send(TOPIC, f"m{i}".encode()) for i in range(6)]
    assert [r.queue_offset for r in sent] == list(range(6))
    for address in g.addresses:  # the leader answers, and followers forward or redirect alike
        with stub(address) as s:
            status, got, nxt = pull(s, 2, batch=3)
            assert status.code == Code.OK and nxt == 5
            assert [m.body for m in got] == [b"m2", b"m3", b"m4"]
            assert [m.system_properties.queue_offset for m in got] == [2, 3, 4]
            status, got, nxt = pull(s, 6)
            assert status.code == Code.MESSAGE_NOT_FOUND and not got and nxt == 6
            status, _, _ = pull(s, 7)
            assert status.code == Code.ILLEGAL_OFFSET and "outside" in status.message

            def query(policy, **kw):
                req = service_pb2.QueryOffsetRequest(message_queue=queue(0), query_offset_policy=policy, **kw)
                return s.QueryOffset(req, metadata=META, timeout=10)

            assert query(definition_pb2.BEGINNING).offset == 0
            assert query(definition_pb2.END).offset == 6
            before = timestamp_pb2.Timestamp()
            before.FromMilliseconds(int(t0 * 1000) - 60_000)
            assert query(definition_pb2.TIMESTAMP, timestamp=before).offset == 0
            later = timestamp_pb2.Timestamp()
            later.FromMilliseconds(int(time.time() * 1000) + 60_000)
            assert query(definition_pb2.TIMESTAMP, timestamp=later).offset == 6
            assert query(definition_pb2.TIMESTAMP).status.code == Code.BAD_REQUEST

    with stub(g.addresses[0]) as s:
        get = service_pb2.GetOffsetRequest(group=res("offset-group"), message_queue=queue(0))
        assert s.GetOffset(get, metadata=META, timeout=10).status.code == Code.OFFSET_NOT_FOUND
        upd = service_pb2.UpdateOffsetRequest(group=res("offset-group"), message_queue=queue(0), offset=4)
        assert s.UpdateOffset(upd, metadata=META, timeout=10).status.code == Code.OK
        bad = service_pb2.UpdateOffsetRequest(group=res("offset-group"), message_queue=queue(0), offset=99)
        r = s.UpdateOffset(bad, metadata=META, timeout=10)
        assert r.status.code == Code.ILLEGAL_OFFSET and "outside" in r.status.message
    # The committed offset went through the log: every node, and our own consumer group API, see 4.
    for address in g.addresses:
        with stub(address) as s:
            r = s.GetOffset(get, metadata=META, timeout=10)
            assert (r.status.code, r.offset) == (Code.OK, 4)
    ours = OurConsumer(g.addresses, "offset-group")
    try:
        assert ours.committed(TOPIC, 0) == 4
    finally:
        ours.close()


UNSUPPORTED = [
    (
        "SyncLiteSubscription",
        service_pb2.SyncLiteSubscriptionRequest(topic=res(TOPIC), group=res("g")),
        "lite",
    ),
]


@pytest.mark.parametrize(("method", "request_", "what"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_calls_say_so_and_the_node_serves_on(broker_group, method, request_, what):
    for address in broker_group.addresses:
        with stub(address) as s:
            r = getattr(s, method)(request_, metadata=META, timeout=5)
            assert r.status.code == Code.UNSUPPORTED
            assert what in r.status.message.lower() and "not supported" in r.status.message
            route = s.QueryRoute(service_pb2.QueryRouteRequest(topic=res(TOPIC)), metadata=META, timeout=10)
            assert route.status.code in (Code.OK, Code.TOPIC_NOT_FOUND), "the node still answers"


DELIVERY_TOPIC = "rmq-delivery-calls"
BAD_DELIVERY_CALLS = [
    (
        "EndTransaction",
        service_pb2.EndTransactionRequest(
            topic=res(DELIVERY_TOPIC), message_id="x", transaction_id="", resolution=1
        ),
        Code.INVALID_TRANSACTION_ID,
    ),
    (
        "EndTransaction",
        service_pb2.EndTransactionRequest(
            topic=res(DELIVERY_TOPIC), message_id="x", transaction_id="99999", resolution=1
        ),
        Code.INVALID_TRANSACTION_ID,
    ),
    (
        "ForwardMessageToDeadLetterQueue",
        service_pb2.ForwardMessageToDeadLetterQueueRequest(
            group=res("g"),
            topic=res(DELIVERY_TOPIC),
            receipt_handle="r",
            message_id="x",
            max_delivery_attempts=3,
        ),
        Code.INVALID_RECEIPT_HANDLE,
    ),
    (
        "RecallMessage",
        service_pb2.RecallMessageRequest(topic=res(DELIVERY_TOPIC), recall_handle="h"),
        Code.BAD_REQUEST,
    ),
]


@pytest.mark.parametrize(
    ("method", "request_", "code"), BAD_DELIVERY_CALLS, ids=["tx-id", "tx-unknown", "dlq", "recall"]
)
def test_delivery_calls_refuse_what_the_broker_never_issued(broker_group, method, request_, code):
    with BrokerConnection(broker_group.addresses) as c:
        if DELIVERY_TOPIC not in {t.topic for t in c.list_topics()}:
            c.create_topic(DELIVERY_TOPIC, 1)
    for address in broker_group.addresses:
        with stub(address) as s:
            r = getattr(s, method)(request_, metadata=META, timeout=10)
            assert r.status.code == code, r.status
            assert r.status.message


def receive(s, qid: int, topic: str, group: str, batch: int = 32, poll_s: int = 0):
    req = service_pb2.ReceiveMessageRequest(
        group=res(group),
        message_queue=queue(qid, topic),
        filter_expression=definition_pb2.FilterExpression(type=definition_pb2.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=duration_pb2.Duration(seconds=30),
        long_polling_timeout=duration_pb2.Duration(seconds=poll_s),
    )
    status, messages, delivered_at = None, [], None
    for r in s.ReceiveMessage(req, metadata=META, timeout=10):
        if r.HasField("status"):
            status = r.status
        elif r.HasField("delivery_timestamp"):
            delivered_at = r.delivery_timestamp
        else:
            messages.append(r.message)
    return status, messages, delivered_at


def test_a_receive_pops_the_topics_other_queues_when_its_queue_is_drained(broker_group):
    """As RocketMQ's broker pops a whole topic for a receive: a client that picked an empty queue still gets
    the messages waiting in the others (the official client rotates over queues, and would otherwise long-poll
    an empty queue while others are full), each with a receipt for the queue it came from."""
    g = broker_group
    topic = "rmq-any-queue"
    create_topic(g, topic, 4)
    with OurProducer(g.addresses) as p:
        msgs = []
        for i in range(5):
            om = p.outgoing(topic, f"q2-{i}".encode())
            om.queue_id = 2  # everything in queue 2
            msgs.append(om)
        p.send_messages(topic, msgs)
    with stub(g.addresses[0]) as s:
        status, got, delivered_at = receive(s, 0, topic, "any-queue-g")
        assert status.code == Code.OK, status
        assert delivered_at is not None and delivered_at.seconds > 0, (
            "the delivery timestamp clients time from"
        )
        assert sorted(m.body for m in got) == [f"q2-{i}".encode() for i in range(5)]
        assert {m.system_properties.queue_id for m in got} == {2}
        ack = service_pb2.AckMessageRequest(
            group=res("any-queue-g"),
            topic=res(topic),
            entries=[
                service_pb2.AckMessageEntry(
                    message_id=m.system_properties.message_id,
                    receipt_handle=m.system_properties.receipt_handle,
                )
                for m in got
            ],
        )
        r = s.AckMessage(ack, metadata=META, timeout=10)
        assert r.status.code == Code.OK and all(e.status.code == Code.OK for e in r.entries), r
        status, got, _ = receive(s, 1, topic, "any-queue-g")  # acked everywhere: nothing in any queue
        assert status.code == Code.MESSAGE_NOT_FOUND and not got
