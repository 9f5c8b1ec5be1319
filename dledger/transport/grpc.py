"""The gRPC adapter: peer channels (outbound) and the peer and client servicers (inbound); the server that hosts
them is ``server.py``.

Each node runs one ``grpc.aio`` server with the ``RaftPeer`` and ``DLedger`` services plus standard health
checking and reflection, so ``grpcurl``/``grpc_health_probe`` work against it. Outbound, a node keeps two
channels per peer, each on its own HTTP/2 connection: the data channel carries the ``Pipe`` (one
bidirectional stream: AppendEntries, heartbeats and answers, many messages per write) and snapshots; the
control channel carries votes and TimeoutNow as unary calls, so an election never waits behind replication.
Followers count every message from the leader as proof of life, so heartbeats sharing the pipe with data is
safe (docs/raft.md, "Timing and flow control").

The servicers only convert and map errors; every decision is the node's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from dledger import timeline
from dledger.batch_stream import answer_each, queued_answers
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from dledger.errors import DLedgerError, InvalidRequestError, NotLeaderError
from dledger.transport import convert
from dledger.transport.base import (
    AppendedRun,
    ClientHandler,
    NodeInfo,
    PeerHandler,
    PeerUnreachableError,
    SnapshotChunk,
)
from dledger.transport.credentials import Retiring
from dledger.v1 import client_pb2, client_pb2_grpc, raft_pb2, raft_pb2_grpc

log = logging.getLogger(__name__)

PIPE_METHOD = "/dledger.v1.RaftPeer/Pipe"

MAX_MESSAGE_BYTES = (
    64 << 20
)  # a replication payload is bounded by RaftConfig.max_append_bytes; leave headroom

# Channel settings: reconnect quickly to a restarted peer (the defaults back off up to 120 s), keep the
# connection warm so the first message after an idle period does not pay a handshake.
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
)
SERVER_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
)


def open_channel(
    address: str, *, dedicated: bool = False, credentials: grpc.ChannelCredentials | None = None
) -> grpc.aio.Channel:
    """A channel to ``address``: TLS with ``credentials`` (docs/security.md), else plaintext; ``dedicated``
    gives it its own connection (subchannel pool)."""
    options = list(CHANNEL_OPTIONS)
    if dedicated:
        options.append(("grpc.use_local_subchannel_pool", 1))
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.aio.insecure_channel(address, options=options)


class _Peer:
    def __init__(self, peer_id: str, address: str, credentials: grpc.ChannelCredentials | None = None):
        self.id = peer_id
        self.address = address
        self.data = open_channel(address, dedicated=True, credentials=credentials)
        self.control = open_channel(address, dedicated=True, credentials=credentials)
        self.data_stub = raft_pb2_grpc.RaftPeerStub(self.data)
        self.control_stub = raft_pb2_grpc.RaftPeerStub(self.control)


# The peer protocol's version, sent when a Pipe opens and with every vote: a node refuses a peer that speaks a
# newer one than it knows (docs/formats.md section 7). No header: a node from before versions were sent (1).
PROTOCOL_KEY = "x-dledger-protocol"
PROTOCOL_VERSION = 1
_PROTOCOL_MD = ((PROTOCOL_KEY, str(PROTOCOL_VERSION)),)


def _protocol_refusal(context: grpc.aio.ServicerContext[Any, Any]) -> DLedgerError | None:
    for key, value in context.invocation_metadata() or ():
        if key == PROTOCOL_KEY:
            version = int(value) if isinstance(value, str) and value.isdigit() else None
            if version is None or version > PROTOCOL_VERSION:
                return InvalidRequestError(
                    f"the peer speaks peer protocol {value!r}; this node speaks up to {PROTOCOL_VERSION}: upgrade "
                    "this node before the group's other nodes use the newer protocol"
                )
    return None


class _Pipe:
    """One ``Pipe`` stream to a peer: writes batches of messages, hands answers to the reply handler."""

    def __init__(self, peer: _Peer, group: str, on_replies: Callable[[list[Message]], None]):
        self.peer = peer
        self._group = group
        self._on_replies = on_replies
        # Requests go out as bytes from ``convert.encode_deliver`` (no serializer); answers parse as usual.
        self.call: grpc.aio.StreamStreamCall[bytes, raft_pb2.PeerReply] = peer.data.stream_stream(
            PIPE_METHOD, request_serializer=None, response_deserializer=raft_pb2.PeerReply.FromString
        )(metadata=_PROTOCOL_MD)
        self.broken: str | None = None
        self._reader = asyncio.create_task(self._read(), name=f"pipe-{peer.id}")

    async def write(self, messages: list[Message]) -> None:
        g = self._group
        await self.call.write(convert.encode_deliver(messages, g))

    async def _read(self) -> None:
        try:
            async for reply in self.call:
                if reply.messages:
                    self._on_replies(convert.reply_from_pb(reply))
            self.broken = "the peer closed the stream"
        except grpc.aio.AioRpcError as e:
            self.broken = f"{e.code().name}: {e.details()}"

    async def wait_ended(self) -> None:
        """Until the peer ended the stream (after a half-close: once it answered what it had received)."""
        await asyncio.gather(self._reader, return_exceptions=True)

    async def close(self) -> None:
        self.broken = self.broken or "closed"
        self.call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class GrpcPeerTransport:
    """``PeerTransport`` over gRPC: a pipe (bidirectional stream) per peer for replication and heartbeats,
    unary calls with deadlines for votes, TimeoutNow and snapshots. Pipes and unary calls use different
    connections, so an election's votes never queue behind a large append."""

    def __init__(
        self,
        group: str,
        addresses: dict[str, str],
        *,
        append_timeout_s: float = 2.0,
        control_timeout_s: float = 0.5,
        snapshot_timeout_s: float = 60.0,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        """``credentials``: the node's peer TLS credentials and identity proof (dledger.security.tls)."""
        self.group = group
        self._credentials = credentials  # a member added later is dialled with them too
        self._peers = {pid: _Peer(pid, addr, credentials) for pid, addr in addresses.items()}
        self._append_timeout = append_timeout_s
        self._control_timeout = control_timeout_s
        self._snapshot_timeout = snapshot_timeout_s
        self._pipes: dict[str, _Pipe] = {}
        self._on_replies: Callable[[list[Message]], None] | None = None
        self._retiring = Retiring()  # channels replaced by ``set_credentials``, closing

    def address(self, peer_id: str) -> str:
        return self._peers[peer_id].address

    def add_peer(self, peer_id: str, address: str) -> None:
        """A member joined (a configuration change): dial it from now on. Known peers keep their channels."""
        if peer_id not in self._peers:
            self._peers[peer_id] = _Peer(peer_id, address, self._credentials)

    def set_credentials(self, credentials: grpc.ChannelCredentials) -> None:
        """New TLS material (a certificate reload, dledger/security/rotation.py): every peer is dialled anew with
        it, and the next deliver opens a pipe on the new channel; the old pipes and channels are retired
        (``credentials.Retiring``: the peers answer what they already received first)."""
        self._credentials = credentials
        old_peers, self._peers = (
            self._peers,
            {pid: _Peer(pid, p.address, credentials) for pid, p in self._peers.items()},
        )
        old_pipes, self._pipes = self._pipes, {}
        channels = [c for p in old_peers.values() for c in (p.data, p.control)]
        self._retiring.retire(
            list(old_pipes.values()), channels, self._append_timeout + self._snapshot_timeout
        )

    def set_reply_handler(self, handler: Callable[[list[Message]], None]) -> None:
        self._on_replies = handler

    async def deliver(self, dst: str, messages: list[Message]) -> None:
        peer = self._peers.get(dst)
        if peer is None:
            raise PeerUnreachableError(dst, "?", "not a member of this group")
        if self._on_replies is None:
            raise RuntimeError("set_reply_handler() before deliver()")
        pipe = self._pipes.get(dst)
        if pipe is not None and pipe.broken is not None:
            await pipe.close()
            pipe = None
        if pipe is None:
            pipe = self._pipes[dst] = _Pipe(peer, self.group, self._on_replies)
        try:
            await pipe.write(messages)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            # The stream ended (peer down or restarted): what was in flight is lost, as Raft allows. The next
            # deliver opens a new stream.
            await pipe.close()
            if self._pipes.get(dst) is pipe:  # not replaced meanwhile (``set_credentials``)
                del self._pipes[dst]
            detail = pipe.broken if pipe.broken and pipe.broken != "closed" else f"{type(e).__name__}: {e}"
            raise PeerUnreachableError(peer.id, peer.address, detail) from e

    async def call(self, msg: Message) -> list[Message]:
        peer = self._peers.get(msg.dst)
        if peer is None:
            raise PeerUnreachableError(msg.dst, "?", "not a member of this group")
        g = self.group
        try:
            if isinstance(msg, AppendEntries):
                reply = await peer.data_stub.AppendEntries(
                    convert.append_entries_to_pb(msg, g), timeout=self._append_timeout
                )
            elif isinstance(msg, Heartbeat):
                reply = await peer.control_stub.Heartbeat(
                    convert.heartbeat_to_pb(msg, g), timeout=self._control_timeout
                )
            elif isinstance(msg, RequestVote):
                reply = await peer.control_stub.Vote(
                    convert.vote_to_pb(msg, g), timeout=self._control_timeout, metadata=_PROTOCOL_MD
                )
            elif isinstance(msg, TimeoutNow):
                reply = await peer.control_stub.TimeoutNow(
                    convert.timeout_now_to_pb(msg, g), timeout=self._control_timeout
                )
            elif isinstance(msg, AppendEntriesResponse | HeartbeatResponse | RequestVoteResponse):
                reply = await peer.control_stub.Deliver(
                    raft_pb2.DeliverRequest(group=g, messages=[convert.message_to_pb(msg, g)]),
                    timeout=self._control_timeout,
                )
            else:
                raise TypeError(f"{type(msg).__name__} is not sent with call()")
        except grpc.aio.AioRpcError as e:
            raise PeerUnreachableError(peer.id, peer.address, f"{e.code().name}: {e.details()}") from e
        return convert.reply_from_pb(reply)

    async def install_snapshot(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk] | None = None
    ) -> list[Message]:
        peer = self._peers.get(msg.dst)
        if peer is None:
            raise PeerUnreachableError(msg.dst, "?", "not a member of this group")
        header = convert.install_snapshot_to_pb(msg, self.group)

        async def stream() -> AsyncIterator[raft_pb2.InstallSnapshotChunk]:
            if chunks is None:
                yield header
                return
            header.last = False
            yield header
            async for c in chunks:
                yield raft_pb2.InstallSnapshotChunk(
                    group=self.group, file=c.file, offset=c.offset, data=c.data, last=c.last
                )

        try:
            reply = await peer.data_stub.InstallSnapshot(stream(), timeout=self._snapshot_timeout)
        except grpc.aio.AioRpcError as e:
            raise PeerUnreachableError(peer.id, peer.address, f"{e.code().name}: {e.details()}") from e
        return convert.reply_from_pb(reply)

    async def close(self) -> None:
        await self._retiring.cancel()
        for pipe in self._pipes.values():
            await pipe.close()
        self._pipes.clear()
        for p in self._peers.values():
            await p.data.close()
            await p.control.close()


T = TypeVar("T")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Context = grpc.aio.ServicerContext  # of any call: ServicerContext[its request, its response]


class _GroupRequest(Protocol):
    """Every request of the RaftPeer and DLedger services names its group."""

    @property
    def group(self) -> str: ...


_GroupRequestT = TypeVar("_GroupRequestT", bound=_GroupRequest)


async def _abort(
    context: grpc.aio.ServicerContext[_Req, _Resp], err: DLedgerError, leader_address: str | None = None
) -> NoReturn:
    context.set_trailing_metadata(convert.error_metadata(err, leader_address))
    await context.abort(convert.status_code(err), str(err))


async def abort_rpc(
    context: grpc.aio.ServicerContext[_Req, _Resp], err: DLedgerError, address_of: Callable[[str], str | None]
) -> NoReturn:
    """End a call of a service stacked on a node (a plugin's) with ``err``'s status, and for a not-leader
    error the leader's address in the trailing metadata, exactly as the client service does."""
    await _abort(context, err, leader_address(err, address_of))


def leader_address(err: DLedgerError, address_of: Callable[[str], str | None]) -> str | None:
    """The address of the node a not-leader error points at (the leader, or a transfer's target), else None."""
    return address_of(err.leader_hint) if isinstance(err, NotLeaderError) and err.leader_hint else None


async def check_group(context: grpc.aio.ServicerContext[_Req, _Resp], got: str, mine: str) -> None:
    """An empty group means "whatever this node serves"; another group is INVALID_ARGUMENT."""
    if got and got != mine:
        await _abort(context, _unknown_group(got, mine))


class RaftPeerServicer(raft_pb2_grpc.RaftPeerServicer):
    """Inbound Raft traffic: check the group, convert, hand to the node, convert the answers back."""

    def __init__(self, handler: PeerHandler):
        self._handler = handler
        self._group = handler.group

    async def _one(
        self,
        request: _GroupRequestT,
        from_pb: Callable[[_GroupRequestT], Message],
        context: grpc.aio.ServicerContext[_GroupRequestT, raft_pb2.PeerReply],
    ) -> raft_pb2.PeerReply:
        if request.group != self._group:
            await _abort(context, _unknown_group(request.group, self._group))
        try:
            replies = await self._handler.handle_message(from_pb(request))
        except DLedgerError as e:
            await _abort(context, e)
        return convert.reply_to_pb(replies, self._group)

    async def Vote(
        self, request: raft_pb2.VoteRequest, context: _Context[raft_pb2.VoteRequest, raft_pb2.PeerReply]
    ) -> raft_pb2.PeerReply:
        refusal = _protocol_refusal(context)
        if refusal is not None:
            await _abort(context, refusal)
        return await self._one(request, convert.vote_from_pb, context)

    async def AppendEntries(
        self,
        request: raft_pb2.AppendEntriesRequest,
        context: _Context[raft_pb2.AppendEntriesRequest, raft_pb2.PeerReply],
    ) -> raft_pb2.PeerReply:
        return await self._one(request, convert.append_entries_from_pb, context)

    async def Heartbeat(
        self,
        request: raft_pb2.HeartbeatRequest,
        context: _Context[raft_pb2.HeartbeatRequest, raft_pb2.PeerReply],
    ) -> raft_pb2.PeerReply:
        return await self._one(request, convert.heartbeat_from_pb, context)

    async def TimeoutNow(
        self,
        request: raft_pb2.TimeoutNowRequest,
        context: _Context[raft_pb2.TimeoutNowRequest, raft_pb2.PeerReply],
    ) -> raft_pb2.PeerReply:
        return await self._one(request, convert.timeout_now_from_pb, context)

    async def Pipe(
        self,
        request_iterator: AsyncIterator[raft_pb2.DeliverRequest],
        context: _Context[raft_pb2.DeliverRequest, raft_pb2.PeerReply],
    ) -> AsyncIterator[raft_pb2.PeerReply]:
        """Step each batch as it arrives; answer each batch once its answers are persisted (batches are
        stepped in arrival order, answers may overtake each other). The reader steps a batch itself and the
        answer goes out from its future's done callback: no task per batch on the replication round trip."""
        refusal = _protocol_refusal(context)
        if refusal is not None:
            await _abort(context, refusal)
        out: asyncio.Queue[raft_pb2.PeerReply | None] = asyncio.Queue()
        pending: set[asyncio.Future[list[Message]]] = set()
        drained = asyncio.Event()
        group = self._group
        refused: list[InvalidRequestError] = []

        def answered(fut: asyncio.Future[list[Message]], *, n: int) -> None:
            pending.discard(fut)
            if not pending:
                drained.set()
            if fut.cancelled():
                return
            err = fut.exception()
            if isinstance(err, InvalidRequestError):  # e.g. a sender that is not a member: end the stream
                refused.append(err)
                out.put_nowait(None)
            elif isinstance(err, DLedgerError):
                # The node refused the batch (e.g. it is shutting down): the sender's core times out and
                # retries, as for any lost message.
                log.info("pipe: dropped %d messages: %s", n, err)
            elif err is not None:
                log.error("pipe: answering %d messages failed", n, exc_info=err)
            else:
                replies = fut.result()
                if replies:
                    out.put_nowait(convert.reply_to_pb(replies, group))

        async def reader() -> None:
            try:
                async for req in request_iterator:
                    timeline.mark("pipe.request")
                    if req.group != group:
                        raise _unknown_group(req.group, group)
                    messages = [convert.message_from_pb(m) for m in req.messages]
                    try:
                        fut = asyncio.ensure_future(self._handler.handle_batch(messages))
                    except InvalidRequestError as e:
                        refused.append(e)
                        out.put_nowait(None)
                        return
                    except DLedgerError as e:
                        log.info("pipe: dropped %d messages: %s", len(messages), e)
                        continue
                    pending.add(fut)
                    drained.clear()
                    fut.add_done_callback(functools.partial(answered, n=len(messages)))
                if pending:  # the sender half-closed: answer what it sent, then end the stream
                    await drained.wait()
            finally:
                out.put_nowait(None)

        async def end(reader_task: asyncio.Task[None]) -> None:
            if refused:
                await _abort(context, refused[0])
            try:
                await reader_task
            except DLedgerError as e:
                await _abort(context, e)

        async with contextlib.aclosing(queued_answers(reader(), out, pending, end)) as answers:
            async for answer in answers:
                yield answer

    async def Deliver(
        self, request: raft_pb2.DeliverRequest, context: _Context[raft_pb2.DeliverRequest, raft_pb2.PeerReply]
    ) -> raft_pb2.PeerReply:
        if request.group != self._group:
            await _abort(context, _unknown_group(request.group, self._group))
        out: list[Message] = []
        try:
            for m in request.messages:
                out.extend(await self._handler.handle_message(convert.message_from_pb(m)))
        except DLedgerError as e:
            await _abort(context, e)
        return convert.reply_to_pb(out, self._group)

    async def InstallSnapshot(
        self,
        request_iterator: AsyncIterator[raft_pb2.InstallSnapshotChunk],
        context: _Context[raft_pb2.InstallSnapshotChunk, raft_pb2.PeerReply],
    ) -> raft_pb2.PeerReply:
        it = request_iterator.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            await _abort(context, InvalidRequestError("empty InstallSnapshot stream"))
        if first.group != self._group:
            await _abort(context, _unknown_group(first.group, self._group))
        try:
            msg = convert.install_snapshot_from_pb(first)
        except DLedgerError as e:
            await _abort(context, e)

        async def chunks() -> AsyncIterator[SnapshotChunk]:
            if first.data or first.file:
                yield SnapshotChunk(first.file, first.offset, first.data, first.last)
            if first.last:
                return
            async for c in it:
                yield SnapshotChunk(c.file, c.offset, c.data, c.last)
                if c.last:
                    return

        try:
            replies = await self._handler.handle_snapshot(msg, chunks())
        except DLedgerError as e:
            await _abort(context, e)
        return convert.reply_to_pb(replies, self._group)


def _unknown_group(got: str, mine: str) -> InvalidRequestError:
    return InvalidRequestError(f"unknown group {got!r}: this node serves group {mine!r}")


def _appended(run: AppendedRun, request_id: int = 0) -> client_pb2.AppendResponse:
    return client_pb2.AppendResponse(
        request_id=request_id, first_index=run.first_index, term=run.term, pos=run.positions
    )


def node_info_to_pb(info: NodeInfo) -> client_pb2.MetadataResponse:
    return client_pb2.MetadataResponse(
        group=info.group,
        node_id=info.node_id,
        address=info.address,
        role=info.role,
        term=info.term,
        leader_id=info.leader_id or "",
        leader_address=info.leader_address or "",
        last_index=info.last_index,
        commit_index=info.commit_index,
        applied_index=info.applied_index,
        peers=[
            client_pb2.PeerInfo(id=p.id, address=p.address, match_index=p.match_index, member=p.member)
            for p in info.peers
        ],
        data_dir=info.data_dir,
        pid=info.pid,
        flush=info.flush,
        voters=info.voters,
        learners=info.learners,
        conf_index=info.conf_index,
    )


class DLedgerServicer(client_pb2_grpc.DLedgerServicer):
    """The client service: appends, committed reads, metadata, leadership transfer."""

    def __init__(self, handler: ClientHandler):
        self._handler = handler
        self._group = handler.group

    def _hint_address(self, err: DLedgerError) -> str | None:
        return leader_address(err, self._handler.address_of)

    async def _check_group(self, group: str, context: grpc.aio.ServicerContext[_Req, _Resp]) -> None:
        # An empty group means "whatever this node serves" so that ad-hoc tools need not know it.
        if group and group != self._group:
            await _abort(context, _unknown_group(group, self._group))

    async def Append(
        self,
        request: client_pb2.AppendRequest,
        context: _Context[client_pb2.AppendRequest, client_pb2.AppendResponse],
    ) -> client_pb2.AppendResponse:
        await self._check_group(request.group, context)
        try:
            results = await self._handler.append(list(request.bodies))
        except DLedgerError as e:
            await _abort(context, e, self._hint_address(e))
        return _appended(results, request.request_id)

    async def AppendStream(
        self,
        request_iterator: AsyncIterator[client_pb2.AppendRequest],
        context: _Context[client_pb2.AppendRequest, client_pb2.AppendResponse],
    ) -> AsyncIterator[client_pb2.AppendResponse]:
        """Many appends over one stream: each request is handled as it arrives, answered as it commits."""

        async def one(req: client_pb2.AppendRequest) -> client_pb2.AppendResponse:
            try:
                if req.group and req.group != self._group:
                    raise _unknown_group(req.group, self._group)
                return _appended(await self._handler.append(list(req.bodies)), req.request_id)
            except DLedgerError as e:
                return client_pb2.AppendResponse(
                    request_id=req.request_id, error=convert.error_to_append_error(e, self._hint_address(e))
                )

        async with contextlib.aclosing(answer_each(request_iterator, one)) as answers:
            async for answer in answers:
                yield answer

    async def Get(
        self, request: client_pb2.GetRequest, context: _Context[client_pb2.GetRequest, client_pb2.GetResponse]
    ) -> client_pb2.GetResponse:
        await self._check_group(request.group, context)
        try:
            e = self._handler.get(request.index)
        except DLedgerError as err:
            await _abort(context, err)
        return client_pb2.GetResponse(
            index=e.index, term=e.term, pos=e.pos, magic=e.magic, body=bytes(e.body)
        )

    async def Metadata(
        self,
        request: client_pb2.MetadataRequest,
        context: _Context[client_pb2.MetadataRequest, client_pb2.MetadataResponse],
    ) -> client_pb2.MetadataResponse:
        await self._check_group(request.group, context)
        return node_info_to_pb(self._handler.metadata())

    async def TransferLeadership(
        self,
        request: client_pb2.TransferLeadershipRequest,
        context: _Context[client_pb2.TransferLeadershipRequest, client_pb2.TransferLeadershipResponse],
    ) -> client_pb2.TransferLeadershipResponse:
        await self._check_group(request.group, context)
        try:
            leader = await self._handler.transfer_leadership(request.target)
        except DLedgerError as e:
            await _abort(context, e, self._hint_address(e))
        return client_pb2.TransferLeadershipResponse(leader_id=leader)

    async def ChangeMembership(
        self,
        request: client_pb2.ChangeMembershipRequest,
        context: _Context[client_pb2.ChangeMembershipRequest, client_pb2.ChangeMembershipResponse],
    ) -> client_pb2.ChangeMembershipResponse:
        await self._check_group(request.group, context)
        try:
            index, term, voters, learners = await self._handler.change_membership(
                request.kind, request.node_id, request.address
            )
        except DLedgerError as e:
            await _abort(context, e, self._hint_address(e))
        return client_pb2.ChangeMembershipResponse(index=index, term=term, voters=voters, learners=learners)

    async def TakeSnapshot(
        self,
        request: client_pb2.TakeSnapshotRequest,
        context: _Context[client_pb2.TakeSnapshotRequest, client_pb2.TakeSnapshotResponse],
    ) -> client_pb2.TakeSnapshotResponse:
        await self._check_group(request.group, context)
        try:
            taken, info, first_index = await self._handler.snapshot_now()
        except DLedgerError as e:
            await _abort(context, e)
        return client_pb2.TakeSnapshotResponse(
            taken=taken,
            index=info.index if info is not None else -1,
            term=info.term if info is not None else 0,
            size=info.size if info is not None else 0,
            first_index=first_index,
        )

    async def Backup(
        self,
        request: client_pb2.BackupRequest,
        context: _Context[client_pb2.BackupRequest, client_pb2.BackupChunk],
    ) -> AsyncIterator[client_pb2.BackupChunk]:
        await self._check_group(request.group, context)
        try:
            async for file, offset, data in self._handler.backup():
                yield client_pb2.BackupChunk(file=file, offset=offset, data=data)
        except DLedgerError as e:
            await _abort(context, e)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` for a blocking caller, then collect garbage.

    grpc.aio binds its completion-queue poller to the event loop of the channels alive at the time. A client
    closed inside ``coro`` can still sit in a reference cycle after the loop closes; until the collector frees it,
    the next ``asyncio.run`` in this process finds grpc delivering events to the closed loop ("Event loop is
    closed" tracebacks on stderr, seen in ``make demo``). Collecting here releases them while nothing else runs.
    """
    try:
        return asyncio.run(coro)
    finally:
        gc.collect()
