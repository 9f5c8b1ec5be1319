"""Fuzz every gRPC surface of real node processes with hypothesis-generated requests (issue 9, "Bad input").

Two real 3-node groups on 127.0.0.1: one runs the broker (the DLedger client service, the Broker service,
RocketMQ 5's MessagingService, the peer service), one the KV store (client, KV, peer). Requests come from
``protofuzz`` (every field of every request type: edge integers, undefined enums, empty, long and odd strings,
oversized bytes, random raw frames). After every call:

- the status is one a client can act on (never UNKNOWN, INTERNAL or DATA_LOSS), with a message when it is an
  error, and a unary call answers within its deadline (no hang);
- a RocketMQ answer's own status is never an internal error, and says why when it is not OK;
- a call the server refused wrote nothing (no node's last index moved while the term stayed the same; when the
  term moved, a new leader's no-op may have grown the log and the call is not judged: each group counts the
  calls it judged and skipped, prints both, and fails if most refused calls went unjudged);
- peer-service calls from a node id that is not a member are refused with INVALID_ARGUMENT.

Every test runs twice: on plain groups here, and on secure ones (``test_grpc_surfaces_secure.py``) (``group up --secure``, docs/security.md) where the
fuzzed calls are signed by the admin, peer calls carry a member's proof, and each call is sent again without a
signature (refused: UNAUTHENTICATED, or RocketMQ's UNAUTHORIZED) and by a user without permissions (never a
write), neither of which may write anything.

The last test of each module checks the group is whole: every node runs and answers, a write commits, and
every node holds the same committed log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import Code, service_pb2

from broker_adapter.client import BrokerConnection
from broker_adapter.core import commands, message
from broker_adapter.v1 import broker_pb2
from dledger import group as grp
from dledger.client import DLedgerClient
from dledger.security import tls
from dledger.security.client import SecurityClient
from dledger.security.config import ClientSecurity
from dledger.v1 import client_pb2, client_pb2_grpc, kv_pb2, raft_pb2
from tests.fuzz import protofuzz as pf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GROUP = "dledger"
TOPIC = "fz"
MEMBERS = ("n0", "n1", "n2")
NEVER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS}
# Calls that may legitimately wait for more (long polling, open streams): our deadline ending them is not a hang.
MAY_WAIT = {"ReceiveMessage", "PullMessage", "Telemetry", "AppendStream", "Pipe"}
# Of the refused calls, at least this share must be judged by the write check (the rest saw the term move).
MIN_CHECKED = 0.5
ROCKETMQ_INTERNAL = {Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR}
META = (("x-mq-client-id", "fuzz@1@0@hypothesis"),)
HINTS = {
    "group": [GROUP],
    "topic": [TOPIC],
    "name": [TOPIC, "fz-consumers"],
    "target": list(MEMBERS),
    "key": [b"k", b""],
}
EXAMPLES = settings(
    max_examples=int(
        os.environ.get("FUZZ_EXAMPLES", "60")
    ),  # per surface; e.g. FUZZ_EXAMPLES=2000 for a long run
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@dataclass
class WriteChecks:
    """How often the "refused means nothing written" check really compared last indexes, and how often a term
    change made it skip: a check that always skips would pass while checking nothing."""

    checked: int = 0
    skipped: int = 0

    def unchanged(self, before: tuple[int, int], after: tuple[int, int], own=None) -> bool:
        """True if ``after`` shows no write since ``before``, or if the term moved (counted as skipped).
        ``own(lo, hi)``: whether entries lo..hi are all ones the broker wrote by itself (a due delayed message's
        copy, a transaction check: docs/rocketmq.md, Delivery), which a call did not write either."""
        if after[0] != before[0]:  # a new term's leader appends its no-op: not the judged call's doing
            self.skipped += 1
            return True
        self.checked += 1
        return after[1] == before[1] or (own is not None and own(before[1] + 1, after[1]))

    def assert_enough(self, name: str) -> None:
        total = self.checked + self.skipped
        print(
            f"\nfuzz write check on the {name} group: {self.checked} checked, {self.skipped} skipped (term moved)"
        )
        assert self.checked >= 1, f"the write check never ran on the {name} group ({self.skipped} skipped)"
        assert self.checked >= MIN_CHECKED * total, (
            f"the write check ran for only {self.checked} of {total} refused calls on the {name} group"
        )


@dataclass
class Target:
    group: grp.GroupSpec
    channels: dict[str, grpc.Channel]
    writes: WriteChecks = dataclasses.field(default_factory=WriteChecks)
    # secure groups only: per node, a channel with a member's peer proof, one unsigned, one of a user who may
    # do nothing but look
    peers: list[grpc.Channel] = dataclasses.field(default_factory=list)
    unsigned: list[grpc.Channel] = dataclasses.field(default_factory=list)
    powerless: list[grpc.Channel] = dataclasses.field(default_factory=list)
    # per node, a channel that only asks for metadata (``state``), signed on a secure group
    lookouts: list[grpc.Channel] = dataclasses.field(default_factory=list)

    @property
    def secure(self) -> bool:
        return bool(self.group.security)

    def any_channel(self, i: int) -> grpc.Channel:
        return list(self.channels.values())[i % len(self.channels)]

    def peer_channel(self, i: int) -> grpc.Channel:
        return self.peers[i % len(self.peers)] if self.peers else self.any_channel(i)

    def own_writes(self, lo: int, hi: int) -> bool:
        """Entries lo..hi are all the broker's own (copies naming their origin, delivery commands)."""
        stubs = [client_pb2_grpc.DLedgerStub(ch) for ch in self.channels.values()]
        deadline = time.monotonic() + 10
        for i in range(lo, hi + 1):
            body = None
            while body is None and time.monotonic() < deadline:
                for stub in stubs:  # any node that has committed it
                    try:
                        body = stub.Get(client_pb2.GetRequest(group=self.group.name, index=i), timeout=2).body
                        break
                    except grpc.RpcError:
                        continue
                else:
                    time.sleep(0.05)
            if body is None or not _broker_own(body):
                return False
        return True

    def state(self) -> tuple[int, int]:
        """(highest term, highest last index) over the nodes that answer.

        What ``group.status`` reports, asked of every node at once over channels kept for the whole module:
        ``status`` opens three clients and an event loop and collects garbage on every call, which cost more
        than the fuzzed call itself (four times per example on a secure group)."""
        req = client_pb2.MetadataRequest(group=self.group.name)
        pending = [client_pb2_grpc.DLedgerStub(ch).Metadata.future(req, timeout=2.0) for ch in self.lookouts]
        infos = []
        for f in pending:
            try:
                infos.append(f.result())
            except grpc.RpcError:
                continue  # a node that does not answer counts for neither
        return max((i.term for i in infos), default=-1), max((i.last_index for i in infos), default=-1)


def _broker_own(body: bytes) -> bool:
    """An entry the broker appends by itself: a copy of a delayed, transactional or dead-letter message (it names
    its origin) or a delivery command (a transaction check, a settle)."""
    if commands.is_command(body):
        return isinstance(commands.decode(body), commands.TxCheck | commands.Settle)
    return commands.is_message(body) and message.peek_property(body, message.PROPERTY_ORIGIN) is not None


POWERLESS = ("looker", "looker-secret-1")


def _secure_channels(g: grp.GroupSpec, opts) -> tuple[dict[str, grpc.Channel], dict[str, list[grpc.Channel]]]:
    admin = ClientSecurity.from_file(Path(g.security))
    ca = admin.ca_file.read_bytes()
    tls_dir = admin.ca_file.parent

    def proof(i: int):  # node i is called by the next member, with that member's certificate
        who = MEMBERS[(i + 1) % 3]
        cert, key = (tls_dir / f"{who}.pem").read_bytes(), (tls_dir / f"{who}.key").read_bytes()
        return tls.peer_channel_credentials(GROUP, who, cert, key, ca)

    looker = ClientSecurity(admin.ca_file, *POWERLESS)
    signed = {
        a: grpc.secure_channel(a, tls.client_channel_credentials(admin), options=opts) for a in g.addresses
    }
    others = {
        "peers": [grpc.secure_channel(a, proof(i), options=opts) for i, a in enumerate(g.addresses)],
        "unsigned": [
            grpc.secure_channel(a, grpc.ssl_channel_credentials(ca), options=opts) for a in g.addresses
        ],
        "powerless": [
            grpc.secure_channel(a, tls.client_channel_credentials(looker), options=opts) for a in g.addresses
        ],
    }
    return signed, others


def _start(tmp: pytest.TempPathFactory, name: str, state_machine: str, mode: str) -> Iterator[Target]:
    secure = mode == "secure"
    g, _ = grp.up(tmp.mktemp(f"{name}-{mode}"), 3, None, state_machine=state_machine, secure=secure)
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    others: dict[str, list[grpc.Channel]] = {}
    if secure:
        channels, others = _secure_channels(g, opts)
    else:
        channels = {a: grpc.insecure_channel(a, options=opts) for a in g.addresses}
    if secure:
        admin = tls.client_channel_credentials(ClientSecurity.from_file(Path(g.security)))
        others["lookouts"] = [grpc.secure_channel(a, admin) for a in g.addresses]
    else:
        others["lookouts"] = [grpc.insecure_channel(a) for a in g.addresses]
    try:
        security = {"security": ClientSecurity.from_file(Path(g.security))} if secure else {}
        if state_machine == "broker":
            with BrokerConnection(g.addresses, **security) as c:
                c.create_topic(TOPIC, 2)
        if secure:

            async def add_looker() -> None:
                sc = SecurityClient(g.addresses, security["security"])
                try:
                    await sc.call("AddUser", {"access_key": POWERLESS[0], "secret_key": POWERLESS[1]})
                finally:
                    await sc.close()

            asyncio.run(add_looker())
        yield Target(g, channels, **others)
    finally:
        for ch in [*channels.values(), *(c for chs in others.values() for c in chs)]:
            ch.close()
        grp.stop_group(g)


# This module fuzzes plain groups; test_grpc_surfaces_secure.py runs the same tests on secure ones, a module of
# its own so that pytest-xdist (--dist loadfile) gives the two halves to two workers.
MODES = ["plain"]


@pytest.fixture(scope="module", params=MODES)
def broker(tmp_path_factory, request) -> Iterator[Target]:
    yield from _start(tmp_path_factory, "fuzz-broker", "broker", request.param)


@pytest.fixture(scope="module", params=MODES)
def kv(tmp_path_factory, request) -> Iterator[Target]:
    yield from _start(tmp_path_factory, "fuzz-kv", "kv", request.param)


def calls(methods: list[pf.Method], hints=HINTS) -> st.SearchStrategy:
    """(method, requests, node number): one request, or up to three for a client stream."""

    def for_method(m: pf.Method) -> st.SearchStrategy:
        one = pf.requests(m.input, hints)
        reqs = st.lists(one, max_size=3) if m.client_streaming else one.map(lambda r: [r])
        return st.tuples(st.just(m), reqs, st.integers(0, 2))

    return st.sampled_from(methods).flatmap(for_method)


def judge(
    target: Target,
    method: pf.Method,
    reqs: list,
    node: int,
    *,
    check_writes: bool = True,
    channel: grpc.Channel | None = None,
) -> pf.Outcome:
    before = target.state() if check_writes else None
    timeout = 3.0 if method.name in MAY_WAIT else 10.0
    out = pf.call(channel or target.any_channel(node), method, reqs, timeout, META)
    where = _Where(method, node, reqs)
    outcome = _judged(target, out, where, method, timeout, before)
    if target.secure:
        _judge_refusals(target, method, reqs, node, timeout, where)
    return outcome


class _Where:
    """Names a call in a failure message; rendered only then (the text of a request with oversized fields took
    longer to render than the call took to answer)."""

    def __init__(self, method: pf.Method, node: int, reqs: list):
        self.method, self.node, self.reqs = method, node, reqs

    def __str__(self) -> str:
        return f"{self.method!r} on node {self.node} with {[str(r)[:300] for r in self.reqs]}"


UNAUTHORIZED_STATUS = 40100  # RocketMQ's Code.UNAUTHORIZED


def _judge_refusals(
    target: Target, method: pf.Method, reqs: list, node: int, timeout: float, where: _Where
) -> None:
    """The same call unsigned is refused; by a user without permissions it writes nothing."""
    before = target.state()
    out = pf.call(target.unsigned[node % 3], method, reqs, timeout, META)
    statuses = [r.status.code for r in out.responses if getattr(r, "status", None) is not None]
    assert out.code is grpc.StatusCode.UNAUTHENTICATED or (
        out.code is grpc.StatusCode.OK and statuses and set(statuses) == {UNAUTHORIZED_STATUS}
    ), f"unsigned {where}: {out.code.name} {out.details!r} {statuses}"
    looked = pf.call(target.powerless[node % 3], method, reqs, timeout, META)
    assert looked.code not in NEVER, f"powerless {where}: {looked.code.name} {looked.details!r}"
    after = target.state()
    assert target.writes.unchanged(before, after, target.own_writes), (
        f"unsigned or powerless {where} wrote: {before} -> {after}"
    )


def _judged(target, out, where, method, timeout, before) -> pf.Outcome:
    assert out.code not in NEVER, f"{where}: {out.code.name} {out.details!r}"
    if out.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        assert method.name in MAY_WAIT, f"{where}: no answer within {timeout} s"
    elif out.code is not grpc.StatusCode.OK:
        assert out.details.strip(), f"{where}: {out.code.name} without a message"
    refused = out.code is not grpc.StatusCode.OK
    for r in out.responses:
        status = getattr(r, "status", None)
        if status is not None and hasattr(status, "code") and status.code:
            assert status.code not in ROCKETMQ_INTERNAL, f"{where}: {status}"
            if status.code != Code.OK:
                assert status.message.strip(), f"{where}: status {status.code} without a message"
                refused = True
    if before is not None and refused:
        after = target.state()
        assert target.writes.unchanged(before, after, target.own_writes), (
            f"{where}: refused ({out.code.name}) yet the log grew {before} -> {after}"
        )
    return out


# -- the client service (raw log) and the Broker service, on the broker group ---------------------------------

CLIENT = pf.methods(client_pb2.DESCRIPTOR.services_by_name["DLedger"])
BROKER = pf.methods(broker_pb2.DESCRIPTOR.services_by_name["Broker"])


@EXAMPLES
@given(calls(CLIENT))
def test_client_service(broker, c):
    method, reqs, node = c
    # A leadership transfer is a legitimate write of its own (a new term), so it is judged without the write check.
    judge(broker, method, reqs, node, check_writes=method.name not in ("TransferLeadership", "AppendStream"))


@EXAMPLES
@given(calls(BROKER))
def test_broker_service(broker, c):
    judge(broker, *c)


# -- RocketMQ 5's MessagingService ----------------------------------------------------------------------------

ROCKETMQ = pf.methods(service_pb2.DESCRIPTOR.services_by_name["MessagingService"])


@EXAMPLES
@given(calls(ROCKETMQ))
def test_rocketmq_messaging_service(broker, c):
    judge(broker, *c)


# -- the peer service -----------------------------------------------------------------------------------------

PEER = pf.methods(raft_pb2.DESCRIPTOR.services_by_name["RaftPeer"])


def _rewrite(msg, **values) -> None:
    """Set the named fields everywhere in ``msg`` (nested and repeated messages included)."""
    for field, value in msg.ListFields():
        if field.type == field.TYPE_MESSAGE:
            items = value if field.is_repeated else [value]
            for item in items:
                if not field.message_type.GetOptions().map_entry:
                    _rewrite(item, **values)
    for name, value in values.items():
        if name in msg.DESCRIPTOR.fields_by_name:
            f = msg.DESCRIPTOR.fields_by_name[name]
            if not f.is_repeated and f.type != f.TYPE_MESSAGE:
                setattr(msg, name, value)


def _senders(msg) -> int:
    """How many messages in ``msg`` (itself included) name a sender."""
    n = int("src" in msg.DESCRIPTOR.fields_by_name)
    for field, value in msg.ListFields():
        if field.type == field.TYPE_MESSAGE and not field.message_type.GetOptions().map_entry:
            n += sum(_senders(v) for v in (value if field.is_repeated else [value]))
    return n


@EXAMPLES
@given(calls(PEER), st.sampled_from(["intruder", "", "n9", "N0", "n0 "]))
def test_peer_service_refuses_non_members(broker, c, intruder):
    method, reqs, node = c
    for r in reqs:
        _rewrite(r, src=intruder, group=GROUP)
    out = judge(broker, method, reqs, node, channel=broker.peer_channel(node))
    if sum(_senders(r) for r in reqs):  # (an empty stream or batch names no sender: nothing to refuse)
        # A secure group refuses a member whose messages name another sender before the node sees them.
        codes = {grpc.StatusCode.INVALID_ARGUMENT} | (
            {grpc.StatusCode.PERMISSION_DENIED} if broker.secure else set()
        )
        assert out.code in codes, f"{method!r} from {intruder!r}: {out.code.name}"


@EXAMPLES
@given(calls([m for m in PEER if m.name in ("AppendEntries", "Heartbeat", "Deliver", "Pipe")]))
def test_peer_service_from_a_member_with_a_stale_term_writes_nothing(broker, c):
    """A member's old message with random frames: answered (or refused), never written."""
    method, reqs, node = c
    for r in reqs:
        _rewrite(r, src=MEMBERS[(node + 1) % 3], dst=MEMBERS[node], term=0, group=GROUP)
    before = broker.state()
    judge(broker, method, reqs, node, channel=broker.peer_channel(node))
    after = broker.state()
    assert broker.writes.unchanged(before, after, broker.own_writes), (
        f"a stale {method!r} wrote entries: {before} -> {after}"
    )


# -- the KV service -------------------------------------------------------------------------------------------

KV = pf.methods(kv_pb2.DESCRIPTOR.services_by_name["KV"])


@EXAMPLES
@given(calls(KV + [m for m in CLIENT if m.name in ("Get", "Metadata", "Append")]))
def test_kv_service(kv, c):
    judge(kv, *c)


# -- after the fuzz: the groups are whole ---------------------------------------------------------------------


def _whole(target: Target) -> None:
    g = target.group
    rows = grp.wait_for_all(g, 30)
    assert all(r.role != "down" for r in rows), f"a node stopped under fuzzing: {rows}"
    security = {"security": ClientSecurity.from_file(Path(g.security))} if target.secure else {}
    with DLedgerClient(g.addresses, GROUP, **security) as c:
        last = c.append(b"after the fuzz").index
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [c.metadata(a) for a in g.addresses]
            if all(i.commit_index >= last for i in infos):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"not every node committed {last}: {infos}")
        views = {(e.term, bytes(e.body)) for e in (c.get(last, a) for a in g.addresses)}
        assert len(views) == 1, f"the nodes disagree at index {last}: {views}"


def test_zz_broker_group_is_whole(broker, capsys):
    _whole(broker)
    with capsys.disabled():
        broker.writes.assert_enough("broker")


def test_zz_kv_group_is_whole(kv, capsys):
    _whole(kv)
    with capsys.disabled():
        kv.writes.assert_enough("kv")
