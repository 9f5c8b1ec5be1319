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

from broker_adapter.message import PROPERTY_TRANSACTION_ID
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


@pytest.fixture
def own_group(tmp_path):
    g = start_group(tmp_path / "g")
    yield g
    grp.stop_group(g)
