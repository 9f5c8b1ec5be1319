"""Broker groups for the conformance suites: the official RocketMQ 5 clients (Python and Node.js), unchanged,
against real three-node groups, checking what the clients' own live tests expect of a RocketMQ server.

Each module gets one plain group and one secure group (``dledger group up --secure``, docs/security.md) with
the topics, consumer groups and user below, so the suites share a few node processes instead of one group per
test. Every group is stopped by the pids in its own pid files, also when a test fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_adapter.client import BrokerConnection
from dledger import group as grp
from dledger.security.client import call_once
from dledger.security.config import ClientSecurity
from tests.rocketmq.conftest import start_group

# Topics of the plain group, by what they hold (each test uses its own tags and consumer groups within them).
TOPICS = {
    "normal": "conf-normal",
    "delay": "conf-delay",
    "fifo": "conf-fifo",
    "transaction": "conf-tx",
    "recall": "conf-recall",
    "bulk": "conf-bulk",
    "push": "conf-push",
    "priority": "conf-priority",  # stays empty: its messages must be refused
    "lite": "conf-lite",  # stays empty too
}
FIFO_GROUP = "conf-fifo-g"  # a consumer group whose settings say FIFO
SECURE_TOPIC = "conf-sec"
USER, USER_SECRET = "conformance", "conformance-secret-1"


@dataclass(frozen=True)
class Plain:
    group: grp.GroupSpec
    topics: dict[str, str]
    fifo_group: str


@dataclass(frozen=True)
class Secure:
    group: grp.GroupSpec
    ca: Path
    topic: str
    access_key: str
    secret_key: str

    @property
    def admin(self) -> ClientSecurity:
        """The group's bootstrap admin (for the test's own checks)."""
        return ClientSecurity.from_file(Path(self.group.security))


def start_plain(directory: Path) -> Plain:
    g = start_group(directory)
    try:
        with BrokerConnection(g.addresses) as c:
            for topic in TOPICS.values():
                c.create_topic(topic, 4)
            c.set_group_settings(FIFO_GROUP, fifo=True)
    except BaseException:
        grp.stop_group(g)
        raise
    return Plain(g, dict(TOPICS), FIFO_GROUP)


def _security_call(g: grp.GroupSpec, method: str, request: dict) -> object:
    return call_once(g.addresses, method, request, ClientSecurity.from_file(Path(g.security)))


def start_secure(directory: Path) -> Secure:
    """A secure group with one topic and one user who may publish to it and subscribe to it in any group."""
    g, _ = grp.up(directory, 3, None, state_machine="broker", secure=True)
    try:
        rows = grp.wait_for_all(g, 30)
        if any(r.role == "down" for r in rows):
            raise RuntimeError(f"a node of the secure group did not start: {rows}")
        with BrokerConnection(g.addresses, security=ClientSecurity.from_file(Path(g.security))) as c:
            c.create_topic(SECURE_TOPIC, 2)
        perms = [f"publish:{SECURE_TOPIC}", f"subscribe:{SECURE_TOPIC}:*"]
        # Once AddUser answers, every node knows the user (docs/security.md): no waiting here.
        answer = _security_call(
            g, "AddUser", {"access_key": USER, "secret_key": USER_SECRET, "permissions": perms}
        )
        assert isinstance(answer, dict) and not answer.get("unconfirmed"), answer
    except BaseException:
        grp.stop_group(g)
        raise
    return Secure(g, Path(g.security).parent / "tls" / "ca.pem", SECURE_TOPIC, USER, USER_SECRET)


def stored(g: grp.GroupSpec, topic: str, security: ClientSecurity | None = None) -> int:
    """How many messages ``topic`` holds (the sum of its queues' end offsets)."""
    with BrokerConnection(g.addresses, security=security) as c:
        return sum({t.topic: t for t in c.list_topics()}[topic].max_offsets)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Iterator[Plain]:
    p = start_plain(tmp_path_factory.mktemp("conf-plain"))
    yield p
    grp.stop_group(p.group)


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[Secure]:
    s = start_secure(tmp_path_factory.mktemp("conf-secure"))
    # The official clients trust the roots in this file (grpc reads it at its first TLS channel).
    before = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(s.ca)
    yield s
    if before is None:
        os.environ.pop("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", None)
    else:
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = before
    grp.stop_group(s.group)
