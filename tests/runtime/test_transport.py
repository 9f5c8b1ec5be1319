"""The gRPC peer transport on its own: every message type over unary calls and over the pipe, against a
scripted handler (no Raft), plus unreachable peers and group checks."""

from __future__ import annotations

import asyncio

import pytest

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
from dledger.errors import UnavailableError
from dledger.group import free_ports
from dledger.transport.base import PeerUnreachableError
from dledger.transport.grpc import GrpcPeerTransport
from dledger.transport.server import NodeServer

pytestmark = pytest.mark.timeout(30)


def answer(m):
    """What the scripted peer answers to each request."""
    if isinstance(m, RequestVote):
        return [RequestVoteResponse(m.term, m.dst, m.src, True, m.pre_vote)]
    if isinstance(m, AppendEntries):
        return [AppendEntriesResponse(m.term, m.dst, m.src, True, match_index=m.prev_log_index + 1)]
    if isinstance(m, Heartbeat):
        return [HeartbeatResponse(m.term, m.dst, m.src, m.context, 7)]
    if isinstance(m, InstallSnapshot):
        return [AppendEntriesResponse(m.term, m.dst, m.src, True, match_index=m.snapshot.index)]
    return []


class Scripted:
    """A PeerHandler/ClientHandler stand-in that records what it was given."""

    group = "g"

    def __init__(self):
        self.seen = []
        self.refuse = False

    async def handle_message(self, msg):
        if self.refuse:
            raise UnavailableError("refusing")
        self.seen.append(msg)
        return answer(msg)

    async def handle_batch(self, msgs):
        self.seen.extend(msgs)
        return [r for m in msgs for r in answer(m)]

    async def handle_snapshot(self, msg, chunks):
        async for _ in chunks:
            pass
        self.seen.append(msg)
        return answer(msg)

    def address_of(self, node_id):
        return None


async def serve(handler):
    (port,) = free_ports(1)
    server = NodeServer(handler, handler, f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{port}"


REQUESTS = [
    RequestVote(3, "a", "b", 10, 2, pre_vote=True),
    AppendEntries(3, "a", "b", 4, 2, 3, b"", prev_chain_crc=0),
    Heartbeat(3, "a", "b", 4, context=9),
    TimeoutNow(3, "a", "b"),
]


def test_unary_calls_and_pipe_carry_every_message():
    async def run():
        h = Scripted()
        server, addr = await serve(h)
        t = GrpcPeerTransport("g", {"b": addr})
        replies = []
        t.set_reply_handler(replies.extend)
        try:
            for m in REQUESTS:
                assert await t.call(m) == answer(m)
            snap = InstallSnapshot(3, "a", "b", SnapshotMeta(99, 2, 1234, 5000))
            assert await t.install_snapshot(snap) == answer(snap)
            assert h.seen == [*REQUESTS, snap]
            # The pipe: one write, answers arrive through the reply handler.
            h.seen.clear()
            await t.deliver("b", REQUESTS)
            want = [r for m in REQUESTS for r in answer(m)]
            deadline = asyncio.get_running_loop().time() + 10
            while len(replies) < len(want) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.005)
            assert replies == want and h.seen == REQUESTS
            # A one-way answer travels with Deliver and gets nothing back.
            assert await t.call(AppendEntriesResponse(3, "a", "b", True, match_index=4)) == []
        finally:
            await t.close()
            await server.stop(0)

    asyncio.run(run())


def test_unreachable_peer_and_refusals_are_reported():
    async def run():
        h = Scripted()
        server, addr = await serve(h)
        (dead,) = free_ports(1)
        t = GrpcPeerTransport("g", {"b": addr, "c": f"127.0.0.1:{dead}"}, control_timeout_s=0.5)
        t.set_reply_handler(lambda _: None)
        try:
            with pytest.raises(PeerUnreachableError, match="peer c"):
                await t.call(Heartbeat(1, "a", "c", 0))
            with pytest.raises(PeerUnreachableError):
                for _ in range(3):  # the first write may be buffered before the stream fails
                    await t.deliver("c", [Heartbeat(1, "a", "c", 0)])
                    await asyncio.sleep(0.2)
            with pytest.raises(PeerUnreachableError, match="not a member"):
                await t.call(Heartbeat(1, "a", "zz", 0))
            h.refuse = True
            with pytest.raises(PeerUnreachableError, match="UNAVAILABLE: refusing"):
                await t.call(Heartbeat(1, "a", "b", 0))
            other = GrpcPeerTransport("other-group", {"b": addr})
            try:
                with pytest.raises(PeerUnreachableError, match="unknown group 'other-group'"):
                    await other.call(Heartbeat(1, "a", "b", 0))
            finally:
                await other.close()
        finally:
            await t.close()
            await server.stop(0)

    asyncio.run(run())
