"""Fixtures for the RocketMQ 5 face: real broker groups (node processes on 127.0.0.1) and the official client.

Every group a test starts is stopped by the pids in its own pid files (``dledger.group.stop_group``), also when
the test fails. Clients are always shut down (their threads and channels belong to the test process).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Message
from rocketmq.grpc_protocol import MessagingServiceStub

from broker_adapter.client import BrokerConnection
from broker_adapter.rocketmq import ensure_event_loop
from dledger import group as grp


@pytest.fixture(scope="session")
def broker_group(tmp_path_factory) -> Iterator[grp.GroupSpec]:
    """One three-node broker group shared by the tests of a worker that do not kill nodes."""
    g = start_group(tmp_path_factory.mktemp("rmq-shared"))
    yield g
    grp.stop_group(g)


def start_group(directory: Path) -> grp.GroupSpec:
    """A group whose every node answers (``up`` returns once two of them elected a leader)."""
    g, _ = grp.up(directory, 3, None, state_machine="broker")
    rows = grp.wait_for_all(g, 30)
    if any(r.role == "down" for r in rows):
        grp.stop_group(g)
        raise RuntimeError(f"a node of the test group did not start: {rows}")
    return g


def create_topic(g: grp.GroupSpec, topic: str, queues: int = 4) -> None:
    with BrokerConnection(g.addresses) as c:
        c.create_topic(topic, queues)


def client_config(g: grp.GroupSpec, timeout_s: int = 3) -> ClientConfiguration:
    """The official client pointed at the group: every node's address, ';'-separated."""
    return ClientConfiguration(";".join(g.addresses), Credentials(), request_timeout=timeout_s)


def new_message(topic: str, body: bytes, tag: str | None = None, keys=(), props=None, group=None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for k in keys:
        m.keys = k  # the client's setter adds one key at a time
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    return m


@contextlib.contextmanager
def running(client):
    ensure_event_loop()
    client.startup()
    try:
        yield client
    finally:
        client.shutdown()


@contextlib.contextmanager
def stub(address: str):
    """A raw MessagingService stub (for what the official client cannot send), with a client id header."""
    channel = grpc.insecure_channel(address)
    try:
        yield MessagingServiceStub(channel)
    finally:
        channel.close()


META = (("x-mq-client-id", "tests@1@0@raw"),)


def poll(cond, timeout_s: float = 20.0, what: str = "condition", interval_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def receive_exactly_once(consumer, acked: dict[str, int], timeout_s: float = 120) -> dict[str, int]:
    """Receive and ack until every acknowledged send came (``acked``: message id -> the i of its body
    ``b"m<i>"``), failing on any message that comes again after its ack; then three more receives, in which
    nothing acked may come back (a send whose outcome was unknown may: once). Message id -> i of all received."""
    received: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while not set(acked) <= set(received):
        assert time.monotonic() < deadline, f"received {len(set(acked) & set(received))} of {len(acked)}"
        for m in consumer.receive(32, 30):
            assert m.message_id not in received, f"{m.message_id} came again after it was acked"
            received[m.message_id] = int(bytes(m.body)[1:])
            consumer.ack(m)
    for _ in range(3):
        again = consumer.receive(32, 30)
        assert all(m.message_id not in received for m in again), "an acked message was delivered again"
        for m in again:
            received[m.message_id] = int(bytes(m.body)[1:])
            consumer.ack(m)
    for msg_id, i in acked.items():
        assert received[msg_id] == i, f"acknowledged send {i} came back with another body"
    return received
