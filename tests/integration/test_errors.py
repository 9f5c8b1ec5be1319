"""Bad requests against real node processes get the right gRPC status codes and messages a person can act on;
standard tools (health checking, reflection) work against a node."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dledger import group as grp
from dledger.client import DLedgerClient
from dledger.core.messages import AppendEntries, Heartbeat, RequestVote
from dledger.errors import InvalidRequestError
from dledger.transport import convert
from dledger.v1 import client_pb2, client_pb2_grpc, raft_pb2, raft_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def group3(tmp_path_factory):
    g, _ = grp.up(tmp_path_factory.mktemp("errors"), 3, None, name="orders")
    yield g
    grp.stop_group(g)


@pytest.fixture(scope="module")
def roles(group3):
    """Poll (with a deadline) until one leader and a follower that knows the leader's term are reported."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        rows = grp.status(group3)
        leaders = [r for r in rows if r.role == "leader"]
        followers = [r for r in rows if r.role == "follower" and leaders and r.term == leaders[0].term]
        if len(leaders) == 1 and followers:
            return leaders[0], followers[0]
        time.sleep(0.02)
    raise AssertionError(f"no leader with a follower in its term within 15 s: {rows}")


def stub(address: str):
    ch = grpc.insecure_channel(address)
    return ch, client_pb2_grpc.DLedgerStub(ch)


def code_of(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn()
    return ei.value


def test_invalid_arguments(group3, roles):
    lead, _ = roles
    ch, s = stub(lead.address)
    with ch:
        e = code_of(lambda: s.Append(client_pb2.AppendRequest(group="orders"), timeout=5))
        assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "empty batch" in e.details()
        big = b"x" * (4 << 20) + b"x"
        e = code_of(lambda: s.Append(client_pb2.AppendRequest(group="orders", bodies=[big]), timeout=5))
        assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "max_body_bytes" in e.details()
        e = code_of(lambda: s.Append(client_pb2.AppendRequest(group="payments", bodies=[b"x"]), timeout=5))
        assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "unknown group 'payments'" in e.details()
        e = code_of(lambda: s.Get(client_pb2.GetRequest(group="orders", index=-3), timeout=5))
        assert e.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_not_leader_names_the_leader(group3, roles):
    lead, follower = roles
    ch, s = stub(follower.address)
    with ch:
        e = code_of(lambda: s.Append(client_pb2.AppendRequest(group="orders", bodies=[b"x"]), timeout=5))
        assert e.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert lead.address in e.details() and lead.id in e.details()
        md = dict(e.trailing_metadata())
        assert md["leader-address"] == lead.address and md["leader-id"] == lead.id
    # The client follows the hint on its own.
    with DLedgerClient([follower.address], "orders") as c:
        r = c.append(b"redirected")
        assert c.leader == lead.address
        assert c.get(r.index).body == b"redirected"


def test_uncommitted_index_is_not_found(group3, roles):
    lead, _ = roles
    ch, s = stub(lead.address)
    with ch:
        e = code_of(lambda: s.Get(client_pb2.GetRequest(group="orders", index=10**9), timeout=5))
        assert e.code() is grpc.StatusCode.NOT_FOUND and "not committed" in e.details()


def test_a_batch_beyond_the_pending_limit_is_invalid(group3, roles):
    lead, _ = roles
    ch, s = stub(lead.address)
    with ch:
        many = [b"."] * 20_001  # more than max_pending_entries can ever hold
        e = code_of(lambda: s.Append(client_pb2.AppendRequest(group="orders", bodies=many), timeout=10))
        assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "max_pending_entries" in e.details()


def test_stream_errors_arrive_in_band(group3, roles):
    _, follower = roles
    ch, s = stub(follower.address)
    with ch:
        reqs = [
            client_pb2.AppendRequest(group="orders", bodies=[b"x"], request_id=1),
            client_pb2.AppendRequest(group="orders", bodies=[], request_id=2),
        ]
        answers = {r.request_id: r for r in s.AppendStream(iter(reqs), timeout=10)}
        assert answers[1].error.code == "FAILED_PRECONDITION" and answers[1].error.leader_address
        assert answers[2].error.code == "INVALID_ARGUMENT"


def test_peer_service_rejects_another_group(group3, roles):
    lead, _ = roles
    with grpc.insecure_channel(lead.address) as ch:
        peer = raft_pb2_grpc.RaftPeerStub(ch)
        e = code_of(
            lambda: peer.Heartbeat(raft_pb2.HeartbeatRequest(group="other", term=1, src="x", dst=lead.id))
        )
        assert e.code() is grpc.StatusCode.INVALID_ARGUMENT and "unknown group" in e.details()


def test_peer_service_rejects_a_non_member(group3, roles):
    """A process that is not in the group (here "intruder", with a huge term) is refused on every peer call,
    and nothing it sent reached the core."""
    _, follower = roles
    huge = 10**9
    vote = RequestVote(huge, "intruder", follower.id, last_log_index=10**6, last_log_term=huge)
    append = AppendEntries(huge, "intruder", follower.id, -1, 0, leader_commit=-1)
    with grpc.insecure_channel(follower.address) as ch:
        peer = raft_pb2_grpc.RaftPeerStub(ch)
        calls = [
            lambda: peer.Vote(convert.vote_to_pb(vote, group3.name)),
            lambda: peer.AppendEntries(convert.append_entries_to_pb(append, group3.name)),
            lambda: peer.Heartbeat(
                convert.heartbeat_to_pb(Heartbeat(huge, "intruder", follower.id, commit=-1), group3.name)
            ),
            lambda: peer.Deliver(
                raft_pb2.DeliverRequest(
                    group=group3.name, messages=[convert.message_to_pb(append, group3.name)]
                )
            ),
            lambda: list(
                peer.Pipe(
                    iter(
                        [
                            raft_pb2.DeliverRequest(
                                group=group3.name, messages=[convert.message_to_pb(append, group3.name)]
                            )
                        ]
                    )
                )
            ),
        ]
        for call in calls:
            e = code_of(call)
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT, e
            assert "'intruder', which is not a member of group orders" in e.details()
    # Had any of it been stepped, the follower would have jumped to the intruder's term.
    deadline = time.monotonic() + 15
    while True:  # every node answers (a loaded machine may miss one status round)
        after = {r.id: r.term for r in grp.status(group3, 2.0)}
        if None not in after.values() or time.monotonic() > deadline:
            break
    assert all(t is not None and t < huge for t in after.values()), after


def test_health_and_reflection(group3, roles):
    lead, _ = roles
    with grpc.insecure_channel(lead.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "dledger.v1.DLedger", "dledger.v1.RaftPeer"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        resp = next(iter(refl.ServerReflectionInfo(iter([req]), timeout=5)))
        names = {s.name for s in resp.list_services_response.service}
        assert {"dledger.v1.DLedger", "dledger.v1.RaftPeer", "grpc.health.v1.Health"} <= names


def test_transfer_on_a_follower_is_refused_with_the_leader(group3, roles):
    lead, follower = roles
    ch, s = stub(follower.address)
    with ch:
        req = client_pb2.TransferLeadershipRequest(group="orders", target=follower.id)
        e = code_of(lambda: s.TransferLeadership(req, timeout=5))
        assert e.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert dict(e.trailing_metadata())["leader-address"] == lead.address
    with (
        DLedgerClient([follower.address], "orders") as c,
        pytest.raises(InvalidRequestError, match="unknown node"),
    ):
        c.transfer_leadership("n42")
