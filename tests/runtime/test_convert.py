"""Round trips between the core's messages and protobuf, and the error <-> status mapping."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.core.membership import Configuration
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    RequestVote,
    RequestVoteResponse,
    SnapshotMeta,
    TimeoutNow,
)
from dledger.errors import (
    ERRORS,
    BackpressureError,
    DirectoryInUseError,
    DLedgerError,
    EntryReplacedError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
)
from dledger.transport import convert
from dledger.v1 import client_pb2, raft_pb2

ids = st.sampled_from(["n0", "n1", "n2", "node-with.long_name"])
i64 = st.integers(min_value=-1, max_value=2**62)
u32 = st.integers(min_value=0, max_value=2**32 - 1)

messages = st.one_of(
    st.builds(RequestVote, i64, ids, ids, i64, i64, st.booleans(), st.booleans()),
    st.builds(RequestVoteResponse, i64, ids, ids, st.booleans(), st.booleans()),
    st.builds(AppendEntries, i64, ids, ids, i64, i64, i64, st.binary(max_size=300), st.none() | u32),
    st.builds(AppendEntriesResponse, i64, ids, ids, st.booleans(), i64, i64, i64, i64),
    st.builds(Heartbeat, i64, ids, ids, i64, i64),
    st.builds(HeartbeatResponse, i64, ids, ids, i64, i64),
    st.builds(TimeoutNow, i64, ids, ids),
)


@given(messages)
def test_every_message_survives_the_envelope(m):
    wire = convert.message_to_pb(m, "g1").SerializeToString()
    back = convert.message_from_pb(raft_pb2.RaftMessage.FromString(wire))
    assert back == m


@given(st.lists(messages, max_size=5))
def test_peer_reply_round_trip(ms):
    wire = convert.reply_to_pb(ms, "g").SerializeToString()
    assert convert.reply_from_pb(raft_pb2.PeerReply.FromString(wire)) == ms


big_frames = st.builds(
    AppendEntries,
    i64,
    ids,
    ids,
    i64,
    i64,
    i64,
    st.binary(min_size=100, max_size=70_000).map(memoryview),
    st.none() | u32,
)


@given(st.lists(st.one_of(messages, big_frames), max_size=6), st.sampled_from(["", "g", "a-group" * 40]))
def test_hand_encoded_deliver_parses_like_protobuf(ms, group):
    """The replication stream writes ``encode_deliver`` bytes; the receiver parses them with protobuf."""
    wire = convert.encode_deliver(ms, group)
    req = raft_pb2.DeliverRequest.FromString(wire)
    expected = raft_pb2.DeliverRequest(group=group, messages=[convert.message_to_pb(m, group) for m in ms])
    assert req == expected
    assert [convert.message_from_pb(p) for p in req.messages] == ms  # a memoryview equals its bytes


def test_requests_carry_the_group():
    ae = AppendEntries(1, "n0", "n1", 4, 1, 3, b"x")
    assert convert.message_to_pb(ae, "orders").append_entries.group == "orders"
    assert convert.vote_to_pb(RequestVote(2, "n0", "n1", 5, 1), "orders").group == "orders"


def test_prev_chain_crc_zero_is_not_confused_with_absent():
    zero = AppendEntries(1, "n0", "n1", 0, 1, 0, b"", prev_chain_crc=0)
    none = AppendEntries(1, "n0", "n1", 0, 1, 0, b"", prev_chain_crc=None)
    assert convert.append_entries_from_pb(convert.append_entries_to_pb(zero, "g")).prev_chain_crc == 0
    assert convert.append_entries_from_pb(convert.append_entries_to_pb(none, "g")).prev_chain_crc is None


def test_install_snapshot_round_trip_and_missing_meta():
    m = InstallSnapshot(3, "n0", "n2", SnapshotMeta(99, 2, 0xDEADBEEF, 123456))
    chunk = convert.install_snapshot_to_pb(m, "g")
    assert chunk.last
    assert convert.install_snapshot_from_pb(chunk) == m
    with pytest.raises(InvalidRequestError):
        convert.install_snapshot_from_pb(raft_pb2.InstallSnapshotChunk(group="g", term=3))


def test_snapshot_meta_carries_the_configuration():
    conf = Configuration(("n0", "n1"), ("n2",), (("n2", "127.0.0.1:9"),))
    m = InstallSnapshot(3, "n0", "n2", SnapshotMeta(99, 2, 7, 4096, conf))
    assert convert.install_snapshot_from_pb(convert.install_snapshot_to_pb(m, "g")).snapshot.conf == conf
    bad = convert.install_snapshot_to_pb(m, "g")
    bad.snapshot.conf = b"not json"
    with pytest.raises(InvalidRequestError, match="snapshot meta at index 99"):
        convert.install_snapshot_from_pb(bad)


def test_empty_envelope_is_invalid():
    with pytest.raises(InvalidRequestError):
        convert.message_from_pb(raft_pb2.RaftMessage())


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (NotLeaderError("n1"), grpc.StatusCode.FAILED_PRECONDITION),
        (InvalidRequestError("empty batch"), grpc.StatusCode.INVALID_ARGUMENT),
        (UnavailableError("no quorum"), grpc.StatusCode.UNAVAILABLE),
        (OutcomeUnknownError("lost leadership"), grpc.StatusCode.UNAVAILABLE),
        (BackpressureError("too many"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (NotFoundError("not committed"), grpc.StatusCode.NOT_FOUND),
    ],
)
def test_errors_map_to_status_codes_and_back(err, code):
    assert convert.status_code(err) is code
    md = dict(convert.error_metadata(err, "127.0.0.1:20912"))
    back = convert.error_from_status(code, str(err), md)
    assert type(back) is type(err)
    assert back.retriable == err.retriable


def test_not_leader_hint_prefers_the_address():
    md = dict(convert.error_metadata(NotLeaderError("n1"), "127.0.0.1:20912"))
    back = convert.error_from_status(grpc.StatusCode.FAILED_PRECONDITION, "not the leader", md)
    assert back.leader_hint == "127.0.0.1:20912"
    in_stream = convert.append_error_from_pb(
        convert.error_to_append_error(NotLeaderError("n1"), "127.0.0.1:20912")
    )
    assert isinstance(in_stream, NotLeaderError) and in_stream.leader_hint == "127.0.0.1:20912"
    unknown = convert.append_error_from_pb(convert.error_to_append_error(OutcomeUnknownError("x")))
    assert isinstance(unknown, OutcomeUnknownError)


def _every_subclass(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _every_subclass(sub)


def _instance(cls):
    if cls is NotLeaderError:
        return NotLeaderError("n1")
    if cls is DirectoryInUseError:
        return DirectoryInUseError("data dir locked", holder="4242")
    return cls(f"a {cls.__name__}")


# What a client may do with each error: retry it (it certainly did not happen, or may be retried by design).
RETRIABLE = {
    "DLedgerError": False,
    "NotLeaderError": True,
    "OutcomeUnknownError": True,
    "UnavailableError": True,
    "DirectoryInUseError": False,
    "BackpressureError": True,
    "StorageFullError": True,
    "EntryReplacedError": True,
    "InvalidRequestError": False,
    "NotFoundError": False,
    "PermissionDeniedError": False,
    "ConfigError": False,
}


def test_the_table_lists_every_error_class():
    import statemachine.apply_loop  # noqa: F401  (raises EntryReplacedError: it must be importable from there)

    wire = {c for c in _every_subclass(DLedgerError) if c.__module__ == "dledger.errors"}
    assert set(ERRORS.values()) == {DLedgerError, *wire}
    assert set(RETRIABLE) == set(ERRORS)


def test_a_subclass_defined_elsewhere_travels_as_its_nearest_listed_ancestor():
    import broker_adapter.core.model  # noqa: F401  (the broker's narrower errors, e.g. UnknownTopicError)

    others = [c for c in _every_subclass(DLedgerError) if c.__module__ != "dledger.errors"]
    assert others, "the broker defines narrower errors; this test must see some"
    for cls in others:
        try:
            err = cls(f"a {cls.__name__}")
        except TypeError:  # UnknownTopicError(topic, message)
            err = cls("t", f"a {cls.__name__}")
        md = dict(convert.error_metadata(err, None))
        back = convert.error_from_status(convert.status_code(err), str(err), md)
        ancestor = next(c for c in cls.__mro__ if ERRORS.get(c.__name__) is c)
        assert type(back) is ancestor, cls
        assert str(back) == str(err)


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_every_error_round_trips_exactly(name):
    err = _instance(ERRORS[name])
    assert err.retriable is RETRIABLE[name]
    md = dict(convert.error_metadata(err, "127.0.0.1:20912"))
    back = convert.error_from_status(convert.status_code(err), str(err), md)
    in_stream = convert.append_error_from_pb(
        client_pb2.AppendError.FromString(
            convert.error_to_append_error(err, "127.0.0.1:20912").SerializeToString()
        )
    )
    for b in (back, in_stream):
        assert type(b) is type(err)
        assert b.retriable is err.retriable
        assert b.grpc_status == err.grpc_status
    if isinstance(err, NotLeaderError):
        assert back.leader_hint == in_stream.leader_hint == "127.0.0.1:20912"
    else:
        assert str(back) == str(in_stream) == str(err)
    if isinstance(err, DirectoryInUseError):
        assert back.holder == "4242"


def test_statuses_without_a_class_map_by_code():
    """What gRPC itself raises (no trailer from a node) still becomes the closest class."""
    assert type(convert.error_from_status(grpc.StatusCode.ABORTED, "x")) is EntryReplacedError
    assert type(convert.error_from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "x")) is BackpressureError
    assert type(convert.error_from_status(grpc.StatusCode.UNAVAILABLE, "x")) is UnavailableError
    dl = convert.error_from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "x")
    assert type(dl) is UnavailableError and "deadline exceeded" in str(dl)
    assert type(convert.error_from_status(grpc.StatusCode.INTERNAL, "x")) is DLedgerError


def test_a_refusal_by_the_guard_is_a_permission_denied_error_naming_its_code():
    """The guard (an interceptor) ends a forbidden call with PERMISSION_DENIED and no class name; the client raises
    ``PermissionDeniedError``, its message the code and the server's reason. UNAUTHENTICATED has no class."""
    why = "user 'bob' may not call /dledger.v1.Broker/CreateTopic: it needs admin"
    denied = convert.error_from_status(grpc.StatusCode.PERMISSION_DENIED, why)
    assert type(denied) is PermissionDeniedError and not denied.retriable
    assert str(denied) == f"PERMISSION_DENIED: {why}"
    unknown = convert.error_from_status(grpc.StatusCode.UNAUTHENTICATED, "unknown access key 'x'")
    assert type(unknown) is DLedgerError and str(unknown) == "UNAUTHENTICATED: unknown access key 'x'"
    md = {convert.ERROR_CLASS_KEY: "NoSuchError"}
    assert type(convert.error_from_status(grpc.StatusCode.NOT_FOUND, "x", md)) is NotFoundError
