"""Conformance of the official Python client (``rocketmq-python-client`` 5.1.2, unchanged): what its live
tests and examples expect of a RocketMQ 5 server, against one plain and one secure three-node group.

Every test uses its own tag or consumer group, so the tests share the module's topics without seeing each
other's messages. "Never received" is checked against a control message sent after (or due with) the one that
must not arrive: once the control is received, the other would have been too.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import grpc
import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import Code, MessagingServiceStub, definition_pb2, service_pb2
from rocketmq.v5.exception import (
    ClientException,
    IllegalArgumentException,
)

from broker_adapter.rocketmq import ensure_event_loop
from tests.conformance.conftest import Plain, Secure, stored
from tests.rocketmq.conftest import META, new_message, running

pytestmark = [pytest.mark.conformance, pytest.mark.integration, pytest.mark.timeout(180)]

AWAIT_S = 1  # the SimpleConsumer's long-polling wait: short, so a test never idles long on an empty topic


def config(p: Plain) -> ClientConfiguration:
    """A plain group needs no credentials."""
    return ClientConfiguration(";".join(p.group.addresses), Credentials(), request_timeout=5)


def secure_config(s: Secure, ak: str | None = None, sk: str | None = None) -> ClientConfiguration:
    creds = Credentials(ak or s.access_key, sk or s.secret_key)
    return ClientConfiguration(";".join(s.group.addresses), creds, request_timeout=5)


def simple(cfg: ClientConfiguration, topic: str, tag: str = "*", group: str | None = None, **kw):
    group = group or f"conf-py-{uuid.uuid4().hex[:12]}"
    return SimpleConsumer(cfg, group, {topic: FilterExpression(tag)}, await_duration=AWAIT_S, **kw)


def receive(consumer: SimpleConsumer, want: int, timeout_s: float = 30.0, batch: int = 32) -> list:
    """Receive and ack until ``want`` messages came, each acked as it comes."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"received {len(got)} of {want} within {timeout_s} s"
        for m in consumer.receive(batch, 20):
            got.append(m)
            consumer.ack(m)
    return got


def tag() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


# --- startup ----------------------------------------------------------------------------------------------


def test_startup_with_credentials_on_a_secure_group(secure):
    s = secure
    cfg = secure_config(s)
    t = tag()
    with running(Producer(cfg, (s.topic,), tls_enable=True)) as p:
        msg_id = p.send(new_message(s.topic, b"signed", tag=t)).message_id
    with running(simple(cfg, s.topic, t, tls_enable=True)) as c:
        (m,) = receive(c, 1)
    assert m.message_id == msg_id and m.body == b"signed"


def startup_refused(client, first_call, codes: tuple[int, ...], caplog) -> str:
    """How a client's startup is refused; the client's log of it. The Python client 5.1.2 does not fail
    ``startup()`` when its route query is refused: it logs the server's code and message ("query topic raise
    exception, <code>, <message>") and starts; its first call then fails with a plain ``Exception`` ("failed
    to fetch topic:<topic> route."), the typed exception lost. (The Node.js client's ``startup()`` rejects.)"""
    with caplog.at_level("ERROR", logger="rocketmq-python-client"):
        try:
            client.startup()
        except ClientException as e:  # a later client version may raise at startup
            client.shutdown()
            assert e.code in codes, e
            return str(e)
        try:
            with pytest.raises(Exception, match="failed to fetch topic"):
                first_call(client)
        finally:
            client.shutdown()
    logged = [r.getMessage() for r in caplog.records if "query topic raise exception" in r.getMessage()]
    assert logged, caplog.text
    assert any(f"exception, {code}," in line for line in logged for code in codes), logged
    return logged[0]


@pytest.mark.parametrize("wrong", ["access key", "secret"])
def test_a_wrong_access_key_or_secret_is_refused_at_startup(secure, wrong, caplog):
    s = secure
    cfg = secure_config(s, ak="wrong") if wrong == "access key" else secure_config(s, sk="wrong")
    # RocketMQ's own ACL answers FORBIDDEN (40300) for both; we answer UNAUTHORIZED (40100).
    codes = (Code.UNAUTHORIZED, Code.FORBIDDEN)
    before = stored(s.group, s.topic, s.admin)
    ensure_event_loop()
    producer = Producer(cfg, (s.topic,), tls_enable=True)
    startup_refused(producer, lambda p: p.send(new_message(s.topic, b"x")), codes, caplog)
    caplog.clear()
    consumer = simple(cfg, s.topic, tls_enable=True)
    startup_refused(consumer, lambda c: c.receive(1, 20), codes, caplog)
    assert stored(s.group, s.topic, s.admin) == before, "a refused client wrote nothing"


def test_a_producer_for_a_topic_that_does_not_exist_fails_at_startup_with_not_found(plain, caplog):
    ensure_event_loop()
    p = Producer(config(plain), ("conf-no-such-topic",))
    send = lambda p: p.send(new_message("conf-no-such-topic", b"x"))  # noqa: E731
    logged = startup_refused(p, send, (Code.TOPIC_NOT_FOUND,), caplog)
    assert "conf-no-such-topic" in logged


# --- sending ----------------------------------------------------------------------------------------------


def test_normal_send_receipt_and_a_tag_subscription_receive_it(plain):
    topic, t = plain.topics["normal"], tag()
    cfg = config(plain)
    with running(Producer(cfg, (topic,))) as p:
        m = new_message(topic, "hello, rocketmq 😄".encode(), tag=t, keys=["k1", "k2"])
        r = p.send(m)
    assert r.message_id and isinstance(r.message_id, str)
    assert r.offset >= 0
    with running(simple(cfg, topic, t)) as c:
        (got,) = receive(c, 1)
    assert (got.message_id, got.body, got.tag, got.keys) == (r.message_id, m.body, t, {"k1", "k2"})
    assert not got.corrupted
    assert r.transaction_id == r.message_id, "the receipt's transaction id is the message id"


def test_delay_message_is_received_no_earlier_than_due(plain):
    topic, t = plain.topics["delay"], tag()
    cfg = config(plain)
    with running(simple(cfg, topic, t)) as c, running(Producer(cfg, (topic,))) as p:
        m = new_message(topic, b"later", tag=t)
        due_s = int(time.time()) + 2  # the 5.1.2 client takes delivery_timestamp in seconds
        m.delivery_timestamp = due_s
        r = p.send(m)
        (got,) = receive(c, 1)
        received_at = time.time()
    assert got.message_id == r.message_id
    assert received_at >= due_s, f"received {due_s - received_at:.3f} s before it was due"
    assert got.delivery_timestamp == due_s * 1000  # reported back in milliseconds


def test_fifo_messages_arrive_in_order_with_their_message_group_and_sharding_key(plain):
    topic, t = plain.topics["fifo"], tag()
    cfg = config(plain)
    with running(Producer(cfg, (topic,))) as p:
        ids = [
            p.send(new_message(topic, f"fifo-{i}".encode(), tag=t, group="order-42")).message_id
            for i in range(5)
        ]
    with running(simple(cfg, topic, t, group=plain.fifo_group)) as c:
        got = receive(c, 5, batch=1)
    assert [m.message_id for m in got] == ids
    assert [m.body for m in got] == [f"fifo-{i}".encode() for i in range(5)]
    for m in got:
        assert m.message_group == "order-42"
        assert m.properties.get("__SHARDINGKEY") == "order-42", m.properties


class _Committer(TransactionChecker):
    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.COMMIT


def test_transaction_commit_is_received_once_with_its_transaction_id(plain):
    topic, t = plain.topics["transaction"], tag()
    cfg = config(plain)
    with running(Producer(cfg, (topic,), checker=_Committer())) as p:
        tx = p.begin_transaction()
        r = p.send(new_message(topic, b"committed", tag=t), tx)
        tx.commit()
    assert r.transaction_id
    with running(simple(cfg, topic, t)) as c:
        (got,) = receive(c, 1)
        assert c.receive(32, 20) == [], "a committed transaction is delivered once"
    assert got.message_id == r.message_id and got.body == b"committed"
    assert got.properties.get("__transactionId__") == r.transaction_id, got.properties


def test_transaction_rollback_is_never_received(plain):
    topic, t = plain.topics["transaction"], tag()
    cfg = config(plain)
    with running(Producer(cfg, (topic,), checker=_Committer())) as p:
        tx = p.begin_transaction()
        rolled_back = p.send(new_message(topic, b"rolled back", tag=t), tx).message_id
        tx.rollback()
        tx2 = p.begin_transaction()
        control = p.send(new_message(topic, b"control", tag=t), tx2).message_id
        tx2.commit()
    with running(simple(cfg, topic, t)) as c:
        got = receive(c, 1)
        got += c.receive(32, 20)
    assert [m.message_id for m in got] == [control]
    assert rolled_back != control


def test_a_recalled_delay_message_is_never_received(plain):
    topic, t = plain.topics["recall"], tag()
    cfg = config(plain)
    with running(simple(cfg, topic, t)) as c, running(Producer(cfg, (topic,))) as p:
        due_s = int(time.time()) + 3
        recalled, control = new_message(topic, b"recalled", tag=t), new_message(topic, b"control", tag=t)
        recalled.delivery_timestamp = due_s
        control.delivery_timestamp = due_s
        r = p.send(recalled)
        rc = p.send(control)
        assert r.recall_handle, "a delay message's receipt carries a recall handle"
        assert p.recall_message(topic, r.recall_handle) == r.message_id
        got = receive(c, 1)
        got += c.receive(32, 20)
    assert [m.message_id for m in got] == [rc.message_id]


# --- consuming --------------------------------------------------------------------------------------------


def test_simple_consumer_receives_and_acks_over_a_hundred_messages_intact(plain):
    topic, t = plain.topics["bulk"], tag()
    cfg = config(plain)
    n = 110
    with running(Producer(cfg, (topic,))) as p:
        futures = [p.send_async(new_message(topic, f'{{"i": {i}}}'.encode(), tag=t)) for i in range(n)]
        sent = {f.result(timeout=30).message_id: f'{{"i": {i}}}'.encode() for i, f in enumerate(futures)}
    assert len(sent) == n
    with running(simple(cfg, topic, t)) as c:
        got = receive(c, n, timeout_s=60)
    assert not [m.message_id for m in got if m.corrupted], "messages flagged corrupted (body digest)"
    assert {m.message_id: m.body for m in got} == sent
    assert {m.tag for m in got} == {t} and {m.topic for m in got} == {topic}
    assert len(got) == n


class _Recorder(MessageListener):
    def __init__(self):
        self.lock = threading.Lock()
        self.calls: Counter = Counter()
        self.bodies: dict = {}
        self.corrupted: list = []

    def consume(self, message) -> ConsumeResult:
        with self.lock:
            self.calls[message.message_id] += 1
            self.bodies[message.message_id] = message.body
            if message.corrupted:
                self.corrupted.append(message.message_id)
        return ConsumeResult.SUCCESS


def test_push_consumer_listener_gets_every_message_once(plain):
    topic, t = plain.topics["push"], tag()
    cfg = config(plain)
    n = 200
    with running(Producer(cfg, (topic,))) as p:
        futures = [p.send_async(new_message(topic, b"push-%d" % i, tag=t)) for i in range(n)]
        sent = {f.result(timeout=30).message_id: b"push-%d" % i for i, f in enumerate(futures)}
    listener = _Recorder()
    consumer = PushConsumer(cfg, f"conf-py-push-{t}", listener, {topic: FilterExpression(t)})
    with running(consumer):
        deadline = time.monotonic() + 60
        while len(listener.calls) < n and time.monotonic() < deadline:
            time.sleep(0.1)
    # A corrupted message (body digest) never reaches the listener: the client discards it.
    assert len(listener.calls) == n, f"the listener got {len(listener.calls)} of {n}"
    assert listener.bodies == sent
    assert listener.corrupted == []
    assert set(listener.calls.values()) == {1}, "a message reached the listener twice"


# --- unsupported message types ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["priority", "lite"])
def test_priority_and_lite_messages_are_refused_naming_the_type(plain, kind):
    topic = plain.topics[kind]
    with running(Producer(config(plain), (topic,))) as p:
        m = new_message(topic, b"not supported")
        if kind == "priority":
            m.priority = 1
        else:
            m.lite_topic = "conf-lite-child"
        with pytest.raises(ClientException) as e:
            p.send(m)
    # The route's accepted message types exclude the type, so the client refuses it before sending.
    assert isinstance(e.value, IllegalArgumentException) or e.value.code == Code.UNSUPPORTED
    assert kind.upper() in str(e.value).upper(), str(e.value)
    assert stored(plain.group, topic) == 0


@pytest.mark.parametrize(
    ("kind", "field", "value", "named"),
    [
        ("priority", "priority", 3, "priority messages"),
        ("lite", "lite_topic", "conf-lite-child", "lite topics"),
    ],
)
def test_a_request_that_gets_through_is_answered_unsupported_and_stores_nothing(
    plain, kind, field, value, named
):
    topic = plain.topics[kind]
    mtype = definition_pb2.PRIORITY if kind == "priority" else definition_pb2.LITE
    sp = definition_pb2.SystemProperties(
        message_id=f"01CONF{uuid.uuid4().hex[:20].upper()}",
        body_encoding=definition_pb2.IDENTITY,
        message_type=mtype,
    )
    setattr(sp, field, value)
    req = service_pb2.SendMessageRequest(
        messages=[
            definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=b"x", system_properties=sp)
        ]
    )
    for address in plain.group.addresses:  # the leader and the followers answer alike
        ch = grpc.insecure_channel(address)
        try:
            resp = MessagingServiceStub(ch).SendMessage(req, metadata=META, timeout=10)
        finally:
            ch.close()
        assert resp.status.code == Code.UNSUPPORTED, resp.status
        assert named in resp.status.message
    assert stored(plain.group, topic) == 0
