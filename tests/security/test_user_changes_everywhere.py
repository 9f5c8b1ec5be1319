"""An acknowledged user change holds on every node of a secure group (real processes, ``group up --secure``):
read-your-writes across nodes (docs/security.md, "Users in the log"; ``dledger.security.catchup``).

Each change is followed at once, with no wait or retry, by calls signed as the user to every node on its own:
a raw RocketMQ 5 stub and our own client pointed at that single address. Nothing here asserts on timing; how long
a follower takes to refuse an unknown key is printed (run with ``-s``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import Code, MessagingServiceStub, definition_pb2, service_pb2

from broker_adapter.client import BrokerConnection
from broker_adapter.client import Consumer as OurConsumer
from broker_adapter.client import Producer as OurProducer
from dledger import group as grp
from dledger.errors import DLedgerError
from dledger.security import auth
from dledger.security.client import SecurityClient
from dledger.security.config import ClientSecurity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "rw"
CLIENT_ID = (("x-mq-client-id", "rw@1@0@raw"),)


class Group:
    def __init__(self, spec: grp.GroupSpec):
        self.spec = spec
        self.ca = Path(spec.security).parent / "tls" / "ca.pem"
        self.admin = ClientSecurity.from_file(Path(spec.security))
        creds = grpc.ssl_channel_credentials(self.ca.read_bytes())
        self.stubs = {a: MessagingServiceStub(grpc.secure_channel(a, creds)) for a in spec.addresses}

    def user(self, ak: str, sk: str) -> ClientSecurity:
        return ClientSecurity(self.ca, ak, sk)

    def security(self, method: str, request: dict) -> dict:
        async def run():
            c = SecurityClient(self.spec.addresses, self.admin)
            try:
                return await c.call(method, request)
            finally:
                await c.close()

        return asyncio.run(run())

    def route(self, address: str, ak: str, sk: str) -> definition_pb2.Status:
        req = service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=TOPIC))
        meta = (*CLIENT_ID, *auth.headers(ak, sk))
        return self.stubs[address].QueryRoute(req, metadata=meta, timeout=10).status

    def send(self, address: str, ak: str, sk: str, body: bytes) -> definition_pb2.Status:
        msg = definition_pb2.Message(
            topic=definition_pb2.Resource(name=TOPIC),
            body=body,
            system_properties=definition_pb2.SystemProperties(
                message_id=f"01RW{time.monotonic_ns():020d}",
                body_encoding=definition_pb2.IDENTITY,
                message_type=definition_pb2.NORMAL,
            ),
        )
        req = service_pb2.SendMessageRequest(messages=[msg])
        meta = (*CLIENT_ID, *auth.headers(ak, sk))
        return self.stubs[address].SendMessage(req, metadata=meta, timeout=10).status

    def pull(self, address: str, ak: str, sk: str) -> None:
        """Our client, at this one address, reading where it stands (a follower serves it itself)."""
        with OurConsumer([address], "g", security=self.user(ak, sk), retry_for_s=0) as c:
            c.pull(TOPIC, 0, 0, 1, allow_follower=True, address=address)

    def produce(self, address: str, ak: str, sk: str) -> None:
        """Our producer, given this one address (a follower redirects it to the leader)."""
        with OurProducer([address], security=self.user(ak, sk), retry_for_s=2) as p:
            p.send(TOPIC, b"ours")

    def roles(self) -> dict[str, str]:
        return {r.address: r.role for r in grp.status(self.spec, 2.0)}


@pytest.fixture(scope="module")
def group(tmp_path_factory) -> Iterator[Group]:
    spec, _ = grp.up(tmp_path_factory.mktemp("rw"), 3, None, state_machine="broker", secure=True)
    try:
        rows = grp.wait_for_all(spec, 30)
        assert all(r.role != "down" for r in rows), rows
        g = Group(spec)
        with BrokerConnection(spec.addresses, security=g.admin) as c:
            c.create_topic(TOPIC, 1)
        yield g
    finally:
        grp.stop_group(spec)


def _refused(fn, *args) -> str:
    """The refusal ``fn`` raised (our clients raise a DLedgerError naming the gRPC code and reason; for
    PERMISSION_DENIED, its subclass PermissionDeniedError)."""
    with pytest.raises(DLedgerError) as e:
        fn(*args)
    return str(e.value)


def test_a_new_user_and_a_grant_are_accepted_on_every_node_at_once(group):
    g = group
    print(f"\nroles: {g.roles()}")
    for i in range(12):
        ak, sk = f"new{i}", f"new-secret-{i:04d}"
        answer = g.security(
            "AddUser", {"access_key": ak, "secret_key": sk, "permissions": [f"subscribe:{TOPIC}:*"]}
        )
        assert answer["access_key"] == ak and "unconfirmed" in answer
        for address in g.spec.addresses:  # at once: no wait, no retry
            status = g.route(address, ak, sk)
            assert status.code == Code.OK, (i, address, status)
            g.pull(address, ak, sk)
        # A grant: a node still holding the old permissions would refuse the send before forwarding it.
        g.security("Grant", {"access_key": ak, "permission": f"publish:{TOPIC}"})
        for address in g.spec.addresses:
            status = g.send(address, ak, sk, f"granted {i}".encode())
            assert status.code == Code.OK, (i, address, status)


def test_a_removed_or_revoked_user_is_refused_a_write_on_every_node_at_once(group):
    g = group
    for i in range(6):
        ak, sk = f"gone{i}", f"gone-secret-{i:04d}"
        perms = [f"publish:{TOPIC}", f"subscribe:{TOPIC}:*"]
        g.security("AddUser", {"access_key": ak, "secret_key": sk, "permissions": perms})
        for address in g.spec.addresses:
            assert g.send(address, ak, sk, b"allowed").code == Code.OK
        revoked = g.security("Revoke", {"access_key": ak, "permission": f"publish:{TOPIC}"})
        assert f"publish:{TOPIC}" not in revoked["permissions"]
        for address in g.spec.addresses:  # at once: every node refuses the write
            status = g.send(address, ak, sk, b"revoked")
            assert status.code == Code.FORBIDDEN, (i, address, status)
            assert f"needs publish:{TOPIC}" in status.message
            assert "PERMISSION_DENIED" in _refused(g.produce, address, ak, sk)
        removed = g.security("RemoveUser", {"access_key": ak})
        print(f"\n{ak}: revoke unconfirmed on {revoked['unconfirmed']}, remove on {removed['unconfirmed']}")
        confirmed = set(g.spec.addresses) - {g.spec.node(n).address for n in removed["unconfirmed"]}
        for address in g.spec.addresses:
            status = g.send(address, ak, sk, b"removed")
            assert status.code == Code.UNAUTHORIZED, (i, address, status)
            assert f"unknown access key {ak!r}" in status.message
            assert "UNAUTHENTICATED" in _refused(g.produce, address, ak, sk)
            if address in confirmed:  # a read a follower serves itself: refused where the removal is applied
                assert "UNAUTHENTICATED" in _refused(g.pull, address, ak, sk)


def test_an_unknown_key_is_refused_on_every_node_and_the_time_it_takes_is_reported(group):
    g = group
    roles = g.roles()
    took: dict[str, list[float]] = {a: [] for a in g.spec.addresses}
    for _ in range(5):
        for address in g.spec.addresses:
            t0 = time.perf_counter()
            status = g.route(address, "nobody", "nobody-secret")
            took[address].append(time.perf_counter() - t0)
            assert status.code == Code.UNAUTHORIZED
            assert "unknown access key 'nobody'" in status.message
            why = _refused(g.pull, address, "nobody", "nobody-secret")
            assert "UNAUTHENTICATED" in why and "unknown access key 'nobody'" in why
    known = {a: [] for a in g.spec.addresses}
    ak, sk = "known", "known-secret-1"
    g.security("AddUser", {"access_key": ak, "secret_key": sk, "permissions": []})
    for _ in range(5):
        for address in g.spec.addresses:
            t0 = time.perf_counter()
            assert g.route(address, ak, sk).code == Code.OK
            known[address].append(time.perf_counter() - t0)
    print()
    for address in g.spec.addresses:
        ms = sorted(1000 * t for t in took[address])
        ok = sorted(1000 * t for t in known[address])
        print(
            f"{address} ({roles.get(address)}): unknown key refused in median {ms[len(ms) // 2]:.1f} ms "
            f"(max {ms[-1]:.1f}); a known user's QueryRoute median {ok[len(ok) // 2]:.1f} ms"
        )


def test_a_member_that_is_down_is_named_in_the_answer_and_catches_up_when_back(group):
    g = group
    roles = g.roles()
    follower = next(n for n in g.spec.nodes if roles.get(n.address) == "follower")
    grp.stop_node(follower)
    try:
        ak, sk = "while-down", "while-down-secret"
        added = g.security(
            "AddUser", {"access_key": ak, "secret_key": sk, "permissions": [f"publish:{TOPIC}"]}
        )
        assert added["unconfirmed"] == [follower.id]  # answered all the same: the bound, then the names
        removed = g.security("RemoveUser", {"access_key": "new0"})
        assert removed["unconfirmed"] == [follower.id]
        for address in set(g.spec.addresses) - {follower.address}:
            assert g.send(address, ak, sk, b"while down").code == Code.OK
    finally:
        grp.start_node(follower)
    rows = grp.wait_for_all(g.spec, 30)
    assert all(r.role != "down" for r in rows), rows
    # Back: it knows the user added while it was down as soon as it answers (it catches up before refusing),
    # and a write of the user removed meanwhile is refused through it.
    status = g.send(follower.address, ak, sk, b"after restart")
    assert status.code == Code.OK, status
    assert g.send(follower.address, "new0", "new-secret-0000", b"removed").code == Code.UNAUTHORIZED
