"""Transaction ids and recall with the official RocketMQ 5 client against real three-node groups (issue 25).

Every send receipt's transaction id is its message id (RocketMQ sets it from the message's unique key), a
committed transactional message carries it as the user property ``__transactionId__``, and EndTransaction finds
the open half message by it, on any node, again after a retry. A delayed message's receipt carries a recall
handle; RecallMessage cancels the message through the log before it is due, so no consumer ever receives it,
also across a leader kill.
"""

from __future__ import annotations

import time

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer, TransactionChecker
from rocketmq.grpc_protocol import Code, TransactionResolution, definition_pb2, service_pb2
from rocketmq.v5.exception import BadRequestException, NotFoundException

from broker_adapter.core.message import PROPERTY_TRANSACTION_ID
from dledger import group as grp
from tests.rocketmq.conftest import (
    META,
    client_config,
    create_topic,
    new_message,
    running,
    start_group,
    stub,
)
from tests.rocketmq.test_delivery import kill_and_restart_leader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class _Never(TransactionChecker):
    """A checker for producers whose transactions the test ends itself."""

    def check(self, message) -> TransactionResolution:
        return TransactionResolution.UNKNOWN


def res(name: str) -> definition_pb2.Resource:
    return definition_pb2.Resource(name=name)


def end(address: str, topic: str, message_id: str, transaction_id: str, commit: bool = True):
    """EndTransaction through a raw stub on one node (as a producer retrying it would send it)."""
    resolution = TransactionResolution.COMMIT if commit else TransactionResolution.ROLLBACK
    req = service_pb2.EndTransactionRequest(
        topic=res(topic), message_id=message_id, transaction_id=transaction_id, resolution=resolution
    )
    with stub(address) as s:
        return s.EndTransaction(req, metadata=META, timeout=10).status


def receive_until(consumer: SimpleConsumer, done, timeout_s: float = 60.0) -> dict:
    """Receive and ack until ``done(seen)``; every message seen by id (a second delivery of one fails)."""
    seen: dict = {}
    deadline = time.monotonic() + timeout_s
    while not done(seen):
        assert time.monotonic() < deadline, f"seen {sorted(seen)}"
        for m in consumer.receive(32, 20):
            assert m.message_id not in seen, f"{m.message_id} was delivered twice"
            seen[m.message_id] = m
            consumer.ack(m)
    return seen


def test_every_receipt_carries_its_message_id_as_transaction_id(broker_group):
    g = broker_group
    topic = "rmq-txid"
    create_topic(g, topic, 2)
    with running(Producer(client_config(g), (topic,), checker=_Never())) as producer:
        normal = producer.send(new_message(topic, b"normal"))
        fifo = producer.send(new_message(topic, b"fifo", group="mg"))
        delayed_msg = new_message(topic, b"delayed")
        delayed_msg.delivery_timestamp = int(time.time()) + 2  # seconds, as the 5.1.2 client takes it
        delayed = producer.send(delayed_msg)
        tx = producer.begin_transaction()
        half = producer.send(new_message(topic, b"transactional"), tx)
        for receipt in (normal, fifo, delayed, half):
            assert receipt.message_id and receipt.transaction_id == receipt.message_id
        tx.commit()
    with running(
        SimpleConsumer(client_config(g), "rmq-txid-g", {topic: FilterExpression()}, await_duration=1)
    ) as c:
        ids = {normal.message_id, fifo.message_id, delayed.message_id, half.message_id}
        seen = receive_until(c, lambda s: ids <= set(s))
    assert seen[half.message_id].properties[PROPERTY_TRANSACTION_ID] == half.transaction_id
    assert PROPERTY_TRANSACTION_ID not in seen[normal.message_id].properties


def test_end_transaction_finds_the_half_message_by_its_id_on_any_node_and_answers_a_retry(broker_group):
    g = broker_group
    topic = "rmq-txid-end"
    create_topic(g, topic, 1)
    with running(Producer(client_config(g), (topic,), checker=_Never())) as producer:
        committed = producer.send(new_message(topic, b"commit"), producer.begin_transaction())
        rolled = producer.send(new_message(topic, b"rollback"), producer.begin_transaction())
    a, b, c = g.addresses
    assert end(a, topic, committed.message_id, committed.transaction_id).code == Code.OK
    assert end(b, topic, committed.message_id, committed.transaction_id).code == Code.OK  # a retry: the same
    st = end(c, topic, committed.message_id, committed.transaction_id, commit=False)
    assert st.code == Code.INVALID_TRANSACTION_ID and "already ended by commit" in st.message
    st = end(a, topic, committed.message_id, rolled.transaction_id)
    assert st.code == Code.INVALID_TRANSACTION_ID and "not" in st.message  # the id and message disagree
    st = end(a, "rmq-txid", rolled.message_id, rolled.transaction_id)
    assert st.code == Code.BAD_REQUEST and topic in st.message  # another topic's transaction
    assert end(b, topic, rolled.message_id, rolled.transaction_id, commit=False).code == Code.OK
    assert end(c, topic, rolled.message_id, rolled.transaction_id, commit=False).code == Code.OK
    with running(
        SimpleConsumer(client_config(g), "rmq-txid-end-g", {topic: FilterExpression()}, await_duration=1)
    ) as consumer:
        seen = receive_until(consumer, lambda s: committed.message_id in s)
        for _ in range(2):
            for m in consumer.receive(32, 2):
                assert m.message_id not in seen, "a transaction was delivered twice"
                seen[m.message_id] = m
    assert set(seen) == {committed.message_id}


def delayed(topic: str, body: bytes, due_s: int):
    m = new_message(topic, body)
    m.delivery_timestamp = due_s  # seconds, as the 5.1.2 client takes it
    return m


def receive_past(consumer: SimpleConsumer, until_s: float, want: set, timeout_s: float = 60.0) -> dict:
    """Receive and ack until every message of ``want`` came and the clock is past ``until_s``."""
    deadline = time.monotonic() + timeout_s
    seen: dict = {}
    while not (want <= set(seen) and time.time() > until_s):
        assert time.monotonic() < deadline, f"seen {sorted(seen)}, want {sorted(want)}"
        for m in consumer.receive(32, 20):
            seen[m.message_id] = m
            consumer.ack(m)
    for m in consumer.receive(32, 20):  # one more look after the time: a late copy would show here
        seen[m.message_id] = m
    return seen


def test_a_recalled_delayed_message_is_never_received_and_its_sibling_is(broker_group):
    g = broker_group
    topic = "rmq-recall"
    create_topic(g, topic, 2)
    due_s = int(time.time()) + 4
    with running(Producer(client_config(g), (topic,))) as producer:
        normal = producer.send(new_message(topic, b"normal"))
        assert normal.recall_handle is None  # RocketMQ gives none for a message that is not delayed
        victim = producer.send(delayed(topic, b"recall me", due_s))
        sibling = producer.send(delayed(topic, b"deliver me", due_s))
        assert victim.recall_handle and victim.recall_handle != sibling.recall_handle
        assert producer.recall_message(topic, victim.recall_handle) == victim.message_id
        assert producer.recall_message(topic, victim.recall_handle) == victim.message_id  # a retry: the same
        with pytest.raises(BadRequestException) as err:
            producer.recall_message(topic, victim.recall_handle[:-3] + "AAA")
        assert "recall handle" in str(err.value)
        with pytest.raises(BadRequestException) as err:
            producer.recall_message("rmq-txid", sibling.recall_handle)
        assert f"for topic {topic!r}" in str(err.value)
        with running(
            SimpleConsumer(client_config(g), "rmq-recall-g", {topic: FilterExpression()}, await_duration=1)
        ) as c:
            seen = receive_past(c, due_s + 2, {normal.message_id, sibling.message_id})
        assert victim.message_id not in seen, "a recalled message was delivered"
        assert bytes(seen[sibling.message_id].body) == b"deliver me"
        with pytest.raises(NotFoundException) as err:
            producer.recall_message(topic, sibling.recall_handle)  # delivered already
        assert "delivered" in str(err.value) and "before the delivery time" in str(err.value)


def test_recall_through_each_node_is_one_answer(broker_group):
    """A follower forwards RecallMessage to the leader; every node answers a retried recall the same."""
    g = broker_group
    topic = "rmq-recall-nodes"
    create_topic(g, topic, 1)
    with running(Producer(client_config(g), (topic,))) as producer:
        r = producer.send(delayed(topic, b"x", int(time.time()) + 60))
    for address in g.addresses:
        with stub(address) as s:
            req = service_pb2.RecallMessageRequest(topic=res(topic), recall_handle=r.recall_handle)
            resp = s.RecallMessage(req, metadata=META, timeout=10)
            assert (resp.status.code, resp.message_id) == (Code.OK, r.message_id)


@pytest.fixture
def own_group(tmp_path):
    g = start_group(tmp_path / "g")
    yield g
    grp.stop_group(g)


def test_a_recall_and_an_ended_transaction_survive_a_leader_kill(own_group):
    g = own_group
    topic = "rmq-recall-kill"
    create_topic(g, topic, 1)
    due_s = int(time.time()) + 8
    with running(Producer(client_config(g), (topic,), checker=_Never())) as producer:
        victim = producer.send(delayed(topic, b"recall me", due_s))
        sibling = producer.send(delayed(topic, b"deliver me", due_s))
        assert producer.recall_message(topic, victim.recall_handle) == victim.message_id
        tx = producer.begin_transaction()
        half = producer.send(new_message(topic, b"transactional"), tx)
        tx.commit()
    kill_and_restart_leader(g)
    grp.wait_for_all(g, 30)  # the restarted node answers too
    for address in g.addresses:  # a retried end and a retried recall after the failover: the same answers
        assert end(address, topic, half.message_id, half.transaction_id).code == Code.OK
        with stub(address) as s:
            req = service_pb2.RecallMessageRequest(topic=res(topic), recall_handle=victim.recall_handle)
            assert s.RecallMessage(req, metadata=META, timeout=10).status.code == Code.OK
    with running(
        SimpleConsumer(client_config(g), "rmq-recall-kill-g", {topic: FilterExpression()}, await_duration=1)
    ) as c:
        seen = receive_past(c, due_s + 2, {sibling.message_id, half.message_id}, timeout_s=90)
    assert victim.message_id not in seen, "a recalled message was delivered after the failover"
    assert seen[half.message_id].properties[PROPERTY_TRANSACTION_ID] == half.message_id
