"""Every conversion between protobuf (``dledger.v1``) and the core's dataclasses lives here, and only here.

Keeping the mapping in one module means the wire format can evolve (fields added to the .proto, new message
types) with one place to update and one round-trip test to extend. Nothing here decides anything: a message
converts to exactly one message and back, and an error converts to one gRPC status code plus its class
name, and back to the same class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import grpc

from dledger.core.membership import Configuration, ConfigurationError
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
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
from dledger.v1 import client_pb2, raft_pb2

if TYPE_CHECKING:
    from google.protobuf.message import Message as ProtoMessage

# -- Raft peer messages ------------------------------------------------------------------------------------


def vote_to_pb(m: RequestVote, group: str) -> raft_pb2.VoteRequest:
    return raft_pb2.VoteRequest(
        group=group,
        term=m.term,
        src=m.src,
        dst=m.dst,
        last_log_index=m.last_log_index,
        last_log_term=m.last_log_term,
        pre_vote=m.pre_vote,
        transfer=m.transfer,
    )


def vote_from_pb(p: raft_pb2.VoteRequest) -> RequestVote:
    return RequestVote(
        term=p.term,
        src=p.src,
        dst=p.dst,
        last_log_index=p.last_log_index,
        last_log_term=p.last_log_term,
        pre_vote=p.pre_vote,
        transfer=p.transfer,
    )


def vote_response_to_pb(m: RequestVoteResponse) -> raft_pb2.VoteResponse:
    return raft_pb2.VoteResponse(term=m.term, src=m.src, dst=m.dst, granted=m.granted, pre_vote=m.pre_vote)


def vote_response_from_pb(p: raft_pb2.VoteResponse) -> RequestVoteResponse:
    return RequestVoteResponse(term=p.term, src=p.src, dst=p.dst, granted=p.granted, pre_vote=p.pre_vote)


def append_entries_to_pb(m: AppendEntries, group: str, frames: bool = True) -> raft_pb2.AppendEntriesRequest:
    p = raft_pb2.AppendEntriesRequest(
        group=group,
        term=m.term,
        src=m.src,
        dst=m.dst,
        prev_log_index=m.prev_log_index,
        prev_log_term=m.prev_log_term,
        leader_commit=m.leader_commit,
    )
    if frames:
        p.frames = bytes(m.frames)
    if m.prev_chain_crc is not None:
        p.prev_chain_crc = m.prev_chain_crc
    return p


def append_entries_from_pb(p: raft_pb2.AppendEntriesRequest) -> AppendEntries:
    return AppendEntries(
        term=p.term,
        src=p.src,
        dst=p.dst,
        prev_log_index=p.prev_log_index,
        prev_log_term=p.prev_log_term,
        leader_commit=p.leader_commit,
        frames=p.frames,
        prev_chain_crc=p.prev_chain_crc if p.HasField("prev_chain_crc") else None,
    )


def append_response_to_pb(m: AppendEntriesResponse) -> raft_pb2.AppendEntriesResponse:
    return raft_pb2.AppendEntriesResponse(
        term=m.term,
        src=m.src,
        dst=m.dst,
        success=m.success,
        match_index=m.match_index,
        conflict_index=m.conflict_index,
        conflict_term=m.conflict_term,
        last_log_index=m.last_log_index,
    )


def append_response_from_pb(p: raft_pb2.AppendEntriesResponse) -> AppendEntriesResponse:
    return AppendEntriesResponse(
        term=p.term,
        src=p.src,
        dst=p.dst,
        success=p.success,
        match_index=p.match_index,
        conflict_index=p.conflict_index,
        conflict_term=p.conflict_term,
        last_log_index=p.last_log_index,
    )


def heartbeat_to_pb(m: Heartbeat, group: str) -> raft_pb2.HeartbeatRequest:
    return raft_pb2.HeartbeatRequest(
        group=group, term=m.term, src=m.src, dst=m.dst, commit=m.commit, context=m.context
    )


def heartbeat_from_pb(p: raft_pb2.HeartbeatRequest) -> Heartbeat:
    return Heartbeat(term=p.term, src=p.src, dst=p.dst, commit=p.commit, context=p.context)


def heartbeat_response_to_pb(m: HeartbeatResponse) -> raft_pb2.HeartbeatResponse:
    return raft_pb2.HeartbeatResponse(
        term=m.term, src=m.src, dst=m.dst, context=m.context, last_log_index=m.last_log_index
    )


def heartbeat_response_from_pb(p: raft_pb2.HeartbeatResponse) -> HeartbeatResponse:
    return HeartbeatResponse(
        term=p.term, src=p.src, dst=p.dst, context=p.context, last_log_index=p.last_log_index
    )


def timeout_now_to_pb(m: TimeoutNow, group: str) -> raft_pb2.TimeoutNowRequest:
    return raft_pb2.TimeoutNowRequest(group=group, term=m.term, src=m.src, dst=m.dst)


def timeout_now_from_pb(p: raft_pb2.TimeoutNowRequest) -> TimeoutNow:
    return TimeoutNow(term=p.term, src=p.src, dst=p.dst)


def snapshot_meta_to_pb(m: SnapshotMeta) -> raft_pb2.SnapshotMeta:
    conf = m.conf.encode() if m.conf is not None else b""
    return raft_pb2.SnapshotMeta(
        index=m.index, term=m.term, chain_crc=m.chain_crc, end_pos=m.end_pos, conf=conf
    )


def snapshot_meta_from_pb(p: raft_pb2.SnapshotMeta) -> SnapshotMeta:
    """The snapshot's configuration travels as a config entry body; empty from a sender that does not know it."""
    conf = None
    if p.conf:
        try:
            conf = Configuration.decode(p.conf)
        except ConfigurationError as e:
            raise InvalidRequestError(f"snapshot meta at index {p.index}: {e}") from e
    return SnapshotMeta(index=p.index, term=p.term, chain_crc=p.chain_crc, end_pos=p.end_pos, conf=conf)


def install_snapshot_to_pb(m: InstallSnapshot, group: str) -> raft_pb2.InstallSnapshotChunk:
    """The header chunk of a snapshot stream (a meta-only snapshot is just this chunk, marked last)."""
    return raft_pb2.InstallSnapshotChunk(
        group=group, term=m.term, src=m.src, dst=m.dst, snapshot=snapshot_meta_to_pb(m.snapshot), last=True
    )


def install_snapshot_from_pb(p: raft_pb2.InstallSnapshotChunk) -> InstallSnapshot:
    if not p.HasField("snapshot"):
        raise InvalidRequestError("the first InstallSnapshot chunk must carry the snapshot meta")
    return InstallSnapshot(term=p.term, src=p.src, dst=p.dst, snapshot=snapshot_meta_from_pb(p.snapshot))


# The envelope: (core type) -> (oneof field, to_pb); (oneof field) -> from_pb. Requests carry the group.
# Each converter takes the message type its key names (hence Any for the argument).
_REQUESTS: dict[type[Message], tuple[str, Callable[[Any, str], ProtoMessage]]] = {
    RequestVote: ("vote", vote_to_pb),
    AppendEntries: ("append_entries", append_entries_to_pb),
    Heartbeat: ("heartbeat", heartbeat_to_pb),
    TimeoutNow: ("timeout_now", timeout_now_to_pb),
}
_RESPONSES: dict[type[Message], tuple[str, Callable[[Any], ProtoMessage]]] = {
    RequestVoteResponse: ("vote_response", vote_response_to_pb),
    AppendEntriesResponse: ("append_entries_response", append_response_to_pb),
    HeartbeatResponse: ("heartbeat_response", heartbeat_response_to_pb),
}
_FROM_PB: dict[str, Callable[[Any], Message]] = {
    "vote": vote_from_pb,
    "vote_response": vote_response_from_pb,
    "append_entries": append_entries_from_pb,
    "append_entries_response": append_response_from_pb,
    "heartbeat": heartbeat_from_pb,
    "heartbeat_response": heartbeat_response_from_pb,
    "timeout_now": timeout_now_from_pb,
}


def message_to_pb(m: Message, group: str) -> raft_pb2.RaftMessage:
    """Wrap any wire message in the ``RaftMessage`` envelope (InstallSnapshot travels on its own stream)."""
    t = type(m)
    # (the oneof field is chosen at run time: the stubs cannot tie it to its message type, hence dict[str, Any])
    if t in _REQUESTS:
        field, to_pb = _REQUESTS[t]
        request: dict[str, Any] = {field: to_pb(m, group)}
        return raft_pb2.RaftMessage(**request)
    if t in _RESPONSES:
        field, response_to_pb = _RESPONSES[t]
        response: dict[str, Any] = {field: response_to_pb(m)}
        return raft_pb2.RaftMessage(**response)
    raise TypeError(f"{t.__name__} does not travel in a RaftMessage envelope")


def message_from_pb(p: raft_pb2.RaftMessage) -> Message:
    kind = p.WhichOneof("kind")
    if kind is None:
        raise InvalidRequestError("empty RaftMessage envelope")
    return _FROM_PB[kind](getattr(p, kind))


def encode_deliver(messages: Iterable[Message], group: str) -> bytes:
    """The wire bytes of ``DeliverRequest(group, messages)``, for the replication stream's hot path.

    Building the protobuf object copies an AppendEntries' frames several times (into the request, into the
    envelope, into the outer message: about 0.2 ms per 100 KiB here) and the leader does it once per follower per
    batch. The encoding rules make a cheaper way exact: a message's fields may appear in any order, so an
    AppendEntriesRequest is its other fields, serialized by protobuf, followed by field 8 (frames) written
    here; the envelope and the request are length-delimited fields around it. The frames are copied once, into
    the result. The receiver parses the bytes with the generated ``DeliverRequest`` as usual."""
    g = group.encode()
    parts: list[bytes | memoryview] = [b"\x0a", _varint(len(g)), g]  # field 1 (group), length-delimited
    for m in messages:
        if type(m) is AppendEntries and m.frames:
            head = append_entries_to_pb(m, group, frames=False).SerializeToString()
            size = _varint(len(m.frames))
            body_len = len(head) + 1 + len(size) + len(m.frames)
            inner = _varint(body_len)
            # field 2 (messages) > RaftMessage field 3 (append_entries) > head + field 8 (frames)
            parts += [
                b"\x12",
                _varint(1 + len(inner) + body_len),
                b"\x1a",
                inner,
                head,
                b"\x42",
                size,
                m.frames,
            ]
        else:
            rm = message_to_pb(m, group).SerializeToString()
            parts += [b"\x12", _varint(len(rm)), rm]
    return b"".join(parts)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def reply_to_pb(messages: Iterable[Message], group: str) -> raft_pb2.PeerReply:
    return raft_pb2.PeerReply(messages=[message_to_pb(m, group) for m in messages])


def reply_from_pb(p: raft_pb2.PeerReply) -> list[Message]:
    return [message_from_pb(m) for m in p.messages]


# -- errors ------------------------------------------------------------------------------------------------
#
# One table, both directions. A node ends a call with the error's status code and trailing metadata naming its
# class (and, for a not-leader error, the leader); a client rebuilds exactly that class from them. Classes that
# share a code (StorageFullError and BackpressureError, ConfigError and InvalidRequestError, the UNAVAILABLE
# family) are told apart by the class name. A status without it (raised by gRPC itself: a refused connection,
# a deadline; or by an interceptor: the guard's refusals, dledger/security/guard.py) maps by code alone, through
# ``_BY_CODE``. UNAUTHENTICATED has no class of its own: a ``DLedgerError`` whose message starts with the code.

ERROR_CLASS_KEY = "error-class"
LEADER_ID_KEY = "leader-id"
LEADER_ADDRESS_KEY = "leader-address"
OUTCOME_UNKNOWN_KEY = "outcome-unknown"
REFUSED_KEY = "refused"  # UNAVAILABLE from the node itself: the request was not acted on (safe to retry)
HOLDER_KEY = "holder"

_BY_CODE: dict[str, type[DLedgerError]] = {
    "FAILED_PRECONDITION": NotLeaderError,
    "UNAVAILABLE": UnavailableError,
    "RESOURCE_EXHAUSTED": BackpressureError,
    "ABORTED": EntryReplacedError,
    "INVALID_ARGUMENT": InvalidRequestError,
    "NOT_FOUND": NotFoundError,
    "PERMISSION_DENIED": PermissionDeniedError,
}


def status_code(err: DLedgerError) -> grpc.StatusCode:
    code: grpc.StatusCode = getattr(grpc.StatusCode, err.grpc_status)
    return code


def error_metadata(err: DLedgerError, leader_address: str | None = None) -> tuple[tuple[str, str], ...]:
    """Trailing metadata that lets a client act on an error without parsing the message."""
    md: list[tuple[str, str]] = [(ERROR_CLASS_KEY, _wire_name(err))]
    if isinstance(err, NotLeaderError):
        if err.leader_hint:
            md.append((LEADER_ID_KEY, err.leader_hint))
        if leader_address:
            md.append((LEADER_ADDRESS_KEY, leader_address))
    if isinstance(err, OutcomeUnknownError):
        md.append((OUTCOME_UNKNOWN_KEY, "1"))
    if isinstance(err, UnavailableError):
        md.append((REFUSED_KEY, "1"))
    if isinstance(err, DirectoryInUseError):
        md.append((HOLDER_KEY, err.holder))
    return tuple(md)


def error_to_append_error(err: DLedgerError, leader_address: str | None = None) -> client_pb2.AppendError:
    """The in-stream form of an error (AppendStream cannot end the stream for one failed request). The class
    name travels as a prefix of the message ("StorageFullError: ..."), as the message has no field for it."""
    return client_pb2.AppendError(
        code=err.grpc_status,
        message=f"{_wire_name(err)}: {err}",
        leader_id=(err.leader_hint or "") if isinstance(err, NotLeaderError) else "",
        leader_address=leader_address or "",
        outcome_unknown=isinstance(err, OutcomeUnknownError),
    )


def error_from_status(
    code: grpc.StatusCode | str, message: str, metadata: dict[str, str] | None = None
) -> DLedgerError:
    """Rebuild the error a node raised from a status code (unary trailers or an in-stream ``AppendError``)."""
    md = metadata or {}
    name = code if isinstance(code, str) else code.name
    cls = ERRORS.get(md.get(ERROR_CLASS_KEY, ""))
    if cls is None:
        if name == "UNAVAILABLE" and md.get(OUTCOME_UNKNOWN_KEY) == "1":
            cls = OutcomeUnknownError
        elif name == "DEADLINE_EXCEEDED":
            return UnavailableError(f"deadline exceeded: {message}")
        else:
            cls = _BY_CODE.get(name)
            if cls is None:
                return DLedgerError(f"{name}: {message}")
            if cls is PermissionDeniedError:
                # A refusal keeps its code in front, as UNAUTHENTICATED's does and as the broker writes the one it
                # sends in a stream (broker_adapter/service.py): "PERMISSION_DENIED: ... it needs admin".
                return cls(f"{name}: {message}")
    if cls is NotLeaderError:
        # The hint a client can dial: the leader's address when the node knew it, else its id.
        return NotLeaderError(md.get(LEADER_ADDRESS_KEY) or md.get(LEADER_ID_KEY) or None, message)
    if cls is DirectoryInUseError:
        return DirectoryInUseError(message, md.get(HOLDER_KEY, ""))
    return cls(message)


def error_from_rpc(e: grpc.RpcError, address: str = "", *, write: bool = False) -> DLedgerError:
    """The error a failed call (blocking or asyncio) stands for. A ``write`` whose call broke after the request
    may have reached the node (the connection dropped, the deadline passed) is ``OutcomeUnknownError``: it
    may have been applied. A refused connection, or an error the node itself raised, says what it says."""
    # (key, value) pairs, as every gRPC call gives them; types-grpcio types RpcError's as objects (_Metadatum)
    trailing = cast("tuple[tuple[str, str | bytes], ...]", e.trailing_metadata() or ())
    md = {k: v for k, v in trailing if isinstance(v, str)}
    code, details = e.code(), e.details() or ""
    from_node = ERROR_CLASS_KEY in md or REFUSED_KEY in md or OUTCOME_UNKNOWN_KEY in md
    if write and not from_node:
        broke = code is grpc.StatusCode.UNAVAILABLE and not never_sent(details)
        if broke or code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return OutcomeUnknownError(f"{address} failed while the write was in flight: {details}")
    if code is grpc.StatusCode.CANCELLED and not from_node:
        # The server cancelled the call (a node shutting down cancels what it serves; a caller's own cancel is
        # asyncio's CancelledError, not this): a read is simply tried again elsewhere.
        return UnavailableError(f"{address}: the node cancelled the call ({details}); it may be stopping")
    return error_from_status(code, f"{address}: {details}" if address else details, md)


def never_sent(details: str | None) -> bool:
    """True when gRPC could not even reach the node (so the request cannot have been acted on)."""
    d = (details or "").lower()
    return "failed to connect" in d or "connection refused" in d or "connect failed" in d


def append_error_from_pb(p: client_pb2.AppendError) -> DLedgerError:
    md = {LEADER_ID_KEY: p.leader_id, LEADER_ADDRESS_KEY: p.leader_address}
    if p.outcome_unknown:
        md[OUTCOME_UNKNOWN_KEY] = "1"
    message = p.message
    prefix, sep, rest = message.partition(": ")
    if sep and prefix in ERRORS:
        md[ERROR_CLASS_KEY] = prefix
        message = rest
    return error_from_status(p.code, message, md)


def _wire_name(err: DLedgerError) -> str:
    """The name ``err`` travels under: its class, or the nearest listed base of a class defined elsewhere."""
    for c in type(err).__mro__:
        if ERRORS.get(c.__name__) is c:
            return c.__name__
    return DLedgerError.__name__
