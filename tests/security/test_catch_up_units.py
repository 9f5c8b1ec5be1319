"""The guard's catch-up before a refusal, and the coalescing of catch-ups (``dledger.security.catchup``), without
processes: an acknowledged user change reaches a lagging node while the call waits."""

from __future__ import annotations

import asyncio
import datetime as dt
from types import SimpleNamespace

import grpc
import pytest

from broker_adapter import security_rules
from broker_adapter.v1 import broker_pb2
from dledger.security import auth, certs, guard
from dledger.security.catchup import CatchUp
from dledger.security.users import User


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code, why):
        raise Aborted(code, why)


class World:
    """A node's users, and a catch-up that applies ``pending`` (what the leader already acknowledged)."""

    def __init__(self, users: dict[str, User], pending=None):
        self.users = users
        self.pending = pending
        self.catch_ups = 0

    async def catch_up(self) -> bool:
        self.catch_ups += 1
        await asyncio.sleep(0)
        if self.pending is not None:
            self.pending(self.users)
        return True

    def interceptor(self) -> guard.SecurityInterceptor:
        return guard.SecurityInterceptor(
            "n1", self.users.get, None, catch_up=self.catch_up, services=security_rules.rules()
        )


async def _call(world: World, method: str, request, headers) -> object:
    async def servicer(request, context):
        return "served"

    async def continuation(details):
        return grpc.unary_unary_rpc_method_handler(servicer)

    details = SimpleNamespace(method=method, invocation_metadata=tuple(headers))
    handler = await world.interceptor().intercept_service(continuation, details)
    return await handler.unary_unary(request, Context())


LIST = "/dledger.v1.Broker/ListTopics"
SEND = "/dledger.v1.Broker/Send"


def test_a_known_user_with_a_valid_signature_waits_for_nothing():
    w = World({"alice": User("alice", "alice-secret-1", {"publish:t"})})
    req = broker_pb2.SendRequest(topic="t")
    assert asyncio.run(_call(w, SEND, req, auth.headers("alice", "alice-secret-1"))) == "served"
    assert w.catch_ups == 0


def test_a_user_added_on_the_leader_is_accepted_after_the_catch_up():
    w = World({}, pending=lambda u: u.update(carol=User("carol", "carol-secret-1", set())))
    got = asyncio.run(_call(w, LIST, broker_pb2.ListTopicsRequest(), auth.headers("carol", "carol-secret-1")))
    assert got == "served" and w.catch_ups == 1


def test_a_changed_secret_and_a_grant_are_accepted_after_the_catch_up():
    def change(u):
        u["dave"] = User("dave", "dave-secret-2", {"publish:t"})

    w = World({"dave": User("dave", "dave-secret-1", set())}, pending=change)
    got = asyncio.run(
        _call(w, SEND, broker_pb2.SendRequest(topic="t"), auth.headers("dave", "dave-secret-2"))
    )
    assert got == "served" and w.catch_ups == 1
    w = World(
        {"erin": User("erin", "erin-secret-1", set())},
        pending=lambda u: u["erin"].permissions.add("publish:t"),
    )
    got = asyncio.run(
        _call(w, SEND, broker_pb2.SendRequest(topic="t"), auth.headers("erin", "erin-secret-1"))
    )
    assert got == "served" and w.catch_ups == 1


def test_still_unknown_or_forbidden_after_the_catch_up_is_refused_with_its_reason():
    w = World({})
    with pytest.raises(Aborted) as e:
        asyncio.run(_call(w, LIST, broker_pb2.ListTopicsRequest(), auth.headers("nobody", "nobody-secret")))
    assert (
        e.value.args[0] == grpc.StatusCode.UNAUTHENTICATED
        and "unknown access key 'nobody'" in e.value.args[1]
    )
    assert w.catch_ups == 1
    w = World({"frank": User("frank", "frank-secret-1", set())})
    with pytest.raises(Aborted) as e:
        asyncio.run(
            _call(w, SEND, broker_pb2.SendRequest(topic="t"), auth.headers("frank", "frank-secret-1"))
        )
    assert e.value.args[0] == grpc.StatusCode.PERMISSION_DENIED and "needs publish:t" in e.value.args[1]
    # Removed while the call caught up: refused as unknown, not as forbidden.
    w = World({"gina": User("gina", "gina-secret-1", set())}, pending=lambda u: u.pop("gina"))
    with pytest.raises(Aborted) as e:
        asyncio.run(_call(w, SEND, broker_pb2.SendRequest(topic="t"), auth.headers("gina", "gina-secret-1")))
    assert (
        e.value.args[0] == grpc.StatusCode.UNAUTHENTICATED and "unknown access key 'gina'" in e.value.args[1]
    )


def test_a_refusal_no_user_change_alters_does_not_catch_up():
    w = World({"alice": User("alice", "alice-secret-1", {"admin"})})
    stale = auth.headers("alice", "alice-secret-1", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    with pytest.raises(Aborted):
        asyncio.run(_call(w, LIST, broker_pb2.ListTopicsRequest(), stale))
    with pytest.raises(Aborted):
        asyncio.run(_call(w, LIST, broker_pb2.ListTopicsRequest(), auth.headers("alice", "x")[:1]))
    assert w.catch_ups == 0


class LeaderNode:
    """What ``CatchUp`` uses of a leading node: each read index takes a round trip."""

    id = "n1"
    config = SimpleNamespace(raft=SimpleNamespace(tick_ms=10))
    leader_id = "n1"

    def __init__(self):
        self.reads = 0
        self.commit = 0
        self.waited: list[int] = []

    def is_leader(self) -> bool:
        return True

    async def read_index(self, timeout_s=None) -> int:
        self.reads += 1
        at = self.commit
        await asyncio.sleep(0.02)
        return at

    async def wait_applied(self, index: int) -> None:
        self.waited.append(index)


def test_concurrent_catch_ups_share_one_question_asked_after_they_arrived(tmp_path):
    ca = certs.write_issued(tmp_path, "ca", certs.make_ca())

    async def run():
        node = LeaderNode()
        c = CatchUp(node, ca, "admin", "admin-secret", 1.0)
        first = await asyncio.gather(*(c.refresh() for _ in range(50)))
        node.commit = 7  # a change acknowledged now: later callers must get a question asked after it
        later = await asyncio.gather(*(c.refresh() for _ in range(50)))
        await c.aclose()
        return node, first, later

    node, first, later = asyncio.run(run())
    assert all(first) and all(later)
    assert node.reads == 2  # one question for each crowd, not one per call
    assert node.waited == [0] * 50 + [7] * 50  # the later crowd waited for what was committed when it came
