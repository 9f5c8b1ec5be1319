"""A secure broker group of real node processes (``group up --secure``): TLS on every port, signed clients,
permissions replicated through the log, peers that prove their node id (docs/security.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, MessagingServiceStub, definition_pb2, service_pb2

from broker_adapter.client import BrokerConnection
from broker_adapter.client import Consumer as OurConsumer
from broker_adapter.client import Producer as OurProducer
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger import group as grp
from dledger.errors import PermissionDeniedError
from dledger.security import auth, certs, tls
from dledger.security.client import call_once
from dledger.security.config import ClientSecurity
from dledger.v1 import raft_pb2, raft_pb2_grpc
from tests.rocketmq.conftest import new_message, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ALICE, ALICE_SK = "alice", "alice-secret-1"
BOB, BOB_SK = "bob", "bob-secret-22"


def _security_call(g: grp.GroupSpec, method: str, request: dict) -> object:
    return call_once(g.addresses, method, request, ClientSecurity.from_file(Path(g.security)))


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[grp.GroupSpec]:
    g, _ = grp.up(tmp_path_factory.mktemp("secure"), 3, None, state_machine="broker", secure=True)
    try:
        rows = grp.wait_for_all(g, 30)
        assert all(r.role != "down" for r in rows), rows
        admin = ClientSecurity.from_file(Path(g.security))
        with BrokerConnection(g.addresses, security=admin) as c:
            c.create_topic("sec-a", 2)
            c.create_topic("sec-b", 2)
        _security_call(
            g,
            "AddUser",
            {
                "access_key": ALICE,
                "secret_key": ALICE_SK,
                "permissions": ["publish:sec-a", "subscribe:sec-a:ga"],
            },
        )
        _security_call(g, "AddUser", {"access_key": BOB, "secret_key": BOB_SK, "permissions": []})
        _security_call(g, "Grant", {"access_key": BOB, "permission": "publish:sec-b"})
        yield g
    finally:
        grp.stop_group(g)


def _as(g: grp.GroupSpec, ak: str, sk: str) -> ClientSecurity:
    return ClientSecurity(Path(g.security).parent / "tls" / "ca.pem", ak, sk)


def _offsets(g: grp.GroupSpec) -> dict[str, tuple[int, ...]]:
    with BrokerConnection(g.addresses, security=ClientSecurity.from_file(Path(g.security))) as c:
        return {t.topic: t.max_offsets for t in c.list_topics()}


def _last_indexes(g: grp.GroupSpec) -> list[int | None]:
    return [r.last_index for r in grp.status(g, 2.0)]


def test_the_official_client_with_credentials_over_tls_produces_and_consumes(secure, monkeypatch):
    g = secure
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(Path(g.security).parent / "tls" / "ca.pem"))
    # Every address: the client checks the sorted list as a host name, which the node certificates name.
    cfg = ClientConfiguration(";".join(g.addresses), Credentials(ALICE, ALICE_SK), request_timeout=5)
    with running(Producer(cfg, ("sec-a",), tls_enable=True)) as p:
        ids = {p.send(new_message("sec-a", f"m{i}".encode(), tag="t")).message_id for i in range(5)}
    assert len(ids) == 5
    got = []
    with running(
        SimpleConsumer(cfg, "ga", {"sec-a": FilterExpression()}, await_duration=1, tls_enable=True)
    ) as c:
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            for m in c.receive(16, 20):
                got.append(m)
                c.ack(m)
    assert {m.message_id for m in got} == ids


def _raw_send(address: str, ca: Path, topic: str, metadata) -> definition_pb2.Status:
    ch = grpc.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes()))
    try:
        req = service_pb2.SendMessageRequest(
            messages=[
                definition_pb2.Message(
                    topic=definition_pb2.Resource(name=topic),
                    body=b"intruder",
                    system_properties=definition_pb2.SystemProperties(
                        message_id="01INTRUDER",
                        body_encoding=definition_pb2.IDENTITY,
                        message_type=definition_pb2.NORMAL,
                    ),
                )
            ]
        )
        return MessagingServiceStub(ch).SendMessage(req, metadata=metadata, timeout=10).status
    finally:
        ch.close()


def test_wrong_secret_missing_header_stale_date_and_another_users_topic_are_refused_writing_nothing(secure):
    g = secure
    ca = Path(g.security).parent / "tls" / "ca.pem"
    client_id = (("x-mq-client-id", "sec@1@0@raw"),)
    stale = auth.headers(ALICE, ALICE_SK, dt.datetime.now(dt.UTC) - dt.timedelta(minutes=20))
    cases = {
        "wrong secret": (auth.headers(ALICE, "not-alices-secret"), "sec-a", Code.UNAUTHORIZED),
        "no authorization": ((auth.headers(ALICE, ALICE_SK)[0],), "sec-a", Code.UNAUTHORIZED),
        "stale date-time": (stale, "sec-a", Code.UNAUTHORIZED),
        "bob's topic": (auth.headers(ALICE, ALICE_SK), "sec-b", Code.FORBIDDEN),
    }
    before, lasts = _offsets(g), _last_indexes(g)
    for what, (headers, topic, code) in cases.items():
        for address in g.addresses:  # the leader and the followers answer alike (nothing is forwarded)
            status = _raw_send(address, ca, topic, client_id + tuple(headers))
            assert status.code == code, f"{what} at {address}: {status}"
            assert status.message, what
            assert "not-alices-secret" not in status.message and ALICE_SK not in status.message
    # Our own face: UNAUTHENTICATED and PERMISSION_DENIED.
    for sec, code in (
        (_as(g, ALICE, "wrong-secret"), "UNAUTHENTICATED"),
        (_as(g, ALICE, ALICE_SK), "PERMISSION_DENIED"),
    ):
        with (
            OurProducer(g.addresses, security=sec, timeout_s=3, retry_for_s=1) as p,
            pytest.raises(Exception, match=code),
        ):
            p.send("sec-b", b"intruder")
    bob = _as(g, BOB, BOB_SK)
    with (
        BrokerConnection(g.addresses, security=bob, timeout_s=3, retry_for_s=1) as c,
        pytest.raises(PermissionDeniedError, match=r"^PERMISSION_DENIED: .*admin"),
    ):
        c.create_topic("bobs-own", 1)
    assert _offsets(g) == before
    assert _last_indexes(g) == lasts, "a refused call wrote to the log"
    # The same call by the right user succeeds on every node (a follower forwards it to the leader over TLS with
    # the client's signature, and the leader checks it again): the check refuses what it should, not everything.
    for address in g.addresses:
        assert _raw_send(address, ca, "sec-b", client_id + auth.headers(BOB, BOB_SK)).code == Code.OK, address
    assert sum(_offsets(g)["sec-b"]) == sum(before["sec-b"]) + len(g.addresses)


def test_a_call_the_guard_refuses_raises_permission_denied_error_with_the_nodes_message(secure):
    """The guard (an interceptor) ends a forbidden call with PERMISSION_DENIED and no error class; our client maps
    the code to ``PermissionDeniedError`` (dledger/transport/convert.py), its message the code, the node's address
    and what the node said."""
    g = secure
    address = g.addresses[0]
    ca = Path(g.security).parent / "tls" / "ca.pem"
    request = broker_pb2.CreateTopicRequest(topic="bobs-own", queues=1)
    with (
        grpc.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes())) as ch,
        pytest.raises(grpc.RpcError) as raw,
    ):
        broker_pb2_grpc.BrokerStub(ch).CreateTopic(request, metadata=auth.headers(BOB, BOB_SK), timeout=10)
    assert raw.value.code() == grpc.StatusCode.PERMISSION_DENIED, raw.value
    said = raw.value.details()
    assert said == "user 'bob' may not call /dledger.v1.Broker/CreateTopic: it needs admin", said
    with (
        BrokerConnection([address], security=_as(g, BOB, BOB_SK), timeout_s=3, retry_for_s=1) as c,
        pytest.raises(PermissionDeniedError) as denied,
    ):
        c.create_topic("bobs-own", 1)
    assert str(denied.value) == f"PERMISSION_DENIED: {address}: {said}"
    assert not denied.value.retriable


def test_a_producer_session_checks_each_batch_against_its_users_topics(secure):
    """A session is opened by any signed user; each batch is checked for its own topics (guard.stream_refusal):
    a batch to a topic the user may not publish to is refused, writes nothing, and the session goes on."""
    g = secure
    with OurProducer(g.addresses, security=_as(g, BOB, BOB_SK), timeout_s=3, retry_for_s=2) as p:
        first = p.send("sec-b", b"bob's own")
        before = _offsets(g)
        with pytest.raises(PermissionDeniedError, match=r"PERMISSION_DENIED.*publish:sec-a"):
            p.send("sec-a", b"not bob's")
        assert _offsets(g) == before, "the refused batch wrote nothing"
        again = p.send("sec-b", b"bob's again")
    assert (again.queue_id, again.queue_offset) != (first.queue_id, first.queue_offset)
    assert sum(_offsets(g)["sec-b"]) == sum(before["sec-b"]) + 1


def _vote(address: str, credentials, src: str) -> grpc.RpcError | raft_pb2.PeerReply:
    ch = (
        grpc.secure_channel(address, credentials)
        if credentials is not None
        else grpc.insecure_channel(address)
    )
    try:
        req = raft_pb2.VoteRequest(
            group="dledger", term=0, src=src, dst="n0", last_log_index=-1, last_log_term=0
        )
        return raft_pb2_grpc.RaftPeerStub(ch).Vote(req, timeout=5)
    except grpc.RpcError as e:
        return e
    finally:
        ch.close()


def test_peer_impersonation_another_ca_and_plaintext_are_refused_and_logged(secure, tmp_path):
    g = secure
    tls_dir = Path(g.security).parent / "tls"
    n0 = g.node("n0")
    ca = (tls_dir / "ca.pem").read_bytes()

    def creds(d: Path, cert_of: str, declared: str):
        cert, key = (d / f"{cert_of}.pem").read_bytes(), (d / f"{cert_of}.key").read_bytes()
        return tls.peer_channel_credentials("dledger", declared, cert, key, ca)

    certs.write_group(tmp_path / "other", ["n1"])
    impostor = _vote(n0.address, creds(tls_dir, "n1", "n2"), "n2")
    assert impostor.code() == grpc.StatusCode.UNAUTHENTICATED, impostor
    foreign = _vote(n0.address, creds(tmp_path / "other", "n1", "n1"), "n1")
    assert foreign.code() == grpc.StatusCode.UNAUTHENTICATED, foreign
    # A member's valid proof cannot carry messages from another member.
    spoof = _vote(n0.address, creds(tls_dir, "n1", "n1"), "n2")
    assert spoof.code() == grpc.StatusCode.PERMISSION_DENIED, spoof
    plain = _vote(n0.address, None, "n1")
    assert plain.code() == grpc.StatusCode.UNAVAILABLE, plain
    # A signed client is no peer either.
    client = _vote(
        n0.address, tls.client_channel_credentials(ClientSecurity.from_file(Path(g.security))), "n1"
    )
    assert client.code() == grpc.StatusCode.UNAUTHENTICATED, client
    log = (Path(n0.data_dir) / "node.log").read_text()
    assert "peer claiming to be 'n2' presented the certificate of node 'n1'" in log
    assert "not issued by this group's CA" in log
    assert "peer 'n1' sent messages claiming to come from ['n2']" in log
    ok = _vote(n0.address, creds(tls_dir, "n1", "n1"), "n1")
    assert isinstance(ok, raft_pb2.PeerReply), ok  # the real member is heard


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dledger", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_user_commands_and_secrets_stay_out_of_logs_and_status(secure):
    g = secure
    d = str(Path(g.security).parent)
    add = _cli(
        "user", "add", "carol", "--secret-key", "carol-secret-333", "-p", "subscribe:sec-a:*", "--dir", d
    )
    assert add.returncode == 0, add.stderr
    listed = _cli("user", "list", "--dir", d)
    assert listed.returncode == 0, listed.stderr
    assert "carol" in listed.stdout and "subscribe:sec-a:*" in listed.stdout and "alice" in listed.stdout
    bad = _cli("user", "grant", "carol", "superuser", "--dir", d)
    assert bad.returncode != 0 and "admin, publish:<topic>" in bad.stderr
    env = {**os.environ, "DLEDGER_SECURITY": "", "DLEDGER_CA_FILE": str(Path(d) / "tls" / "ca.pem")}
    env.update(DLEDGER_ACCESS_KEY="carol", DLEDGER_SECRET_KEY="carol-secret-333")
    denied = _cli("user", "list", "--dir", d, env=env)  # carol is no admin
    assert denied.returncode != 0 and "PERMISSION_DENIED" in denied.stderr
    status = _cli("group", "status", "--dir", d, "--json")
    assert status.returncode == 0, status.stderr
    assert len(json.loads(status.stdout)["nodes"]) == 3
    admin_secret = (Path(d) / "admin.toml").read_text().split('secret_key = "')[1].split('"')[0]
    texts = [status.stdout, listed.stdout] + [(Path(n.data_dir) / "node.log").read_text() for n in g.nodes]
    for secret in (ALICE_SK, BOB_SK, "carol-secret-333", admin_secret):
        assert all(secret not in t for t in texts), "a secret reached a log or the status"
    assert _cli("user", "remove", "carol", "--dir", d).returncode == 0
    assert "carol" not in _cli("user", "list", "--dir", d).stdout


def test_a_leader_kill_with_tls_on_loses_nothing(secure):
    g = secure
    alice = _as(g, ALICE, ALICE_SK)
    sent = []
    with OurProducer(g.addresses, security=alice) as p:
        for i in range(100):
            sent.append(f"before-{i}".encode())
            p.send("sec-a", sent[-1])
        failover = asyncio.run(grp.kill_leader_async(g))
        for i in range(100):
            sent.append(f"after-{i}".encode())
            p.send("sec-a", sent[-1])
    assert failover.new_leader != failover.killed
    got = []
    with OurConsumer(g.addresses, "ga", security=alice) as c:
        for q in range(2):
            offset = 0
            while batch := c.pull("sec-a", q, offset, max_messages=64):
                got += [m.body for m in batch]
                offset = batch[-1].queue_offset + 1
    mine = [b for b in got if b.startswith((b"before-", b"after-"))]
    assert sorted(mine) == sorted(sent) and len(mine) == len(set(mine))
    # The killed node comes back over TLS and catches up with the users it missed nothing of.
    grp.start_node(g.node(failover.killed))
    rows = grp.wait_for_all(g, 30)
    assert all(r.role != "down" for r in rows), rows
