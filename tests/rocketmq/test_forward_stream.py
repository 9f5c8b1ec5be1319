"""The followers' forwarding stream (``forward_stream``), both ends over a real grpc.aio server on 127.0.0.1:
a forwarded call answers, fails and times out as the call of its own it replaces did (``forward`` retries
UNAVAILABLE and nothing else), a caller that stops waiting cancels its call on the leader, calls arrive as
forwarded with the client's id, and a secure group's leader refuses the stream. Both framings: packed (the
calls waiting share a stream message) and one frame a message, which a leader of an earlier release serves
alone (a packed stream to it fails as UNAVAILABLE, so the call is retried, and says ``unpacked``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from broker_adapter.rocketmq import forward_stream
from broker_adapter.rocketmq.forward import CLIENT_ID, FORWARDED, client_id, forwarded
from tests.broker.test_broker import run


def _same(b: bytes) -> bytes:
    return b


class Leader:
    """A gRPC server with only the stream's leader end, over methods the test defines."""

    def __init__(self, secure: bool = False, earlier_release: bool = False):
        self.seen: list[tuple[str, bool, str, float]] = []
        self.cancelled = asyncio.Event()
        self.secure = secure
        self.earlier_release = earlier_release  # serves forward_stream.PATH only
        self.messages = 0  # stream messages received, both paths

    async def echo(self, request: bytes, context, raw: bytes) -> bytes:
        self.seen.append(("Echo", forwarded(context), client_id(context), context.time_remaining()))
        return b"echo:" + raw

    async def count(self, request: bytes, context, raw: bytes) -> AsyncIterator[bytes]:
        for i in range(int(raw)):
            yield b"%d" % i

    async def hang(self, request: bytes, context, raw: bytes) -> bytes:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def fail(self, request: bytes, context, raw: bytes) -> bytes:
        raise RuntimeError("boom")

    async def __aenter__(self) -> str:
        methods = {
            "Echo": (_same, self.echo, _same, False),
            "Count": (_same, self.count, _same, True),
            "Hang": (_same, self.hang, _same, False),
            "Fail": (_same, self.fail, _same, False),
        }

        def counted(calls):
            async def serve(frames, context):
                async def messages():
                    async for m in frames:
                        self.messages += 1
                        yield m

                async for answer in calls(messages(), context):
                    yield answer

            return grpc.stream_stream_rpc_method_handler(serve)

        handlers = {
            "Calls": counted(forward_stream.serve_calls(methods, FORWARDED, CLIENT_ID, lambda: self.secure))
        }
        if not self.earlier_release:
            handlers["Packed"] = counted(
                forward_stream.serve_calls(methods, FORWARDED, CLIENT_ID, lambda: self.secure, packed=True)
            )
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(forward_stream.SERVICE_NAME, handlers),)
        )
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def __aexit__(self, *exc) -> None:
        await self.server.stop(0)


META = ((FORWARDED, "n2"), (CLIENT_ID, "client-7"))


@pytest.mark.parametrize("packed", [True, False])
@run
async def test_a_forwarded_call_answers_streams_and_arrives_forwarded_with_the_client_id(packed):
    leader = Leader()
    async with leader as address, grpc.aio.insecure_channel(address) as channel:
        stream = forward_stream.LeaderStream(channel, "n2", FORWARDED, CLIENT_ID, packed=packed)
        try:
            echo = stream.caller("Echo", False, _same)
            answers = await asyncio.gather(*(echo(b"%d" % i, timeout=5, metadata=META) for i in range(20)))
            assert answers == [b"echo:%d" % i for i in range(20)]  # concurrent calls told apart
            if packed:  # the 20 calls were waiting together: they shared stream messages
                assert leader.messages < 20, leader.messages
            else:
                assert leader.messages == 20
            count = stream.caller("Count", True, _same)
            assert [a async for a in count(b"3", timeout=5, metadata=META)] == [b"0", b"1", b"2"]
            assert [a async for a in count(b"0", timeout=5, metadata=META)] == []
        finally:
            await stream.close()
    name, was_forwarded, client, left = leader.seen[-1]
    assert (name, was_forwarded, client) == ("Echo", True, "client-7") and 0 < left <= 5


@pytest.mark.parametrize("packed", [True, False])
@run
async def test_the_leaders_failure_a_deadline_and_a_broken_stream_fail_as_a_call_would(packed):
    leader = Leader()
    async with leader as address, grpc.aio.insecure_channel(address) as channel:
        stream = forward_stream.LeaderStream(channel, "n2", FORWARDED, CLIENT_ID, packed=packed)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stream.caller("Fail", False, _same)(b"", timeout=5, metadata=META)
        assert failed.value.code() == grpc.StatusCode.UNKNOWN and "boom" in failed.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await stream.caller("Hang", False, _same)(b"", timeout=0.2, metadata=META)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(leader.cancelled.wait(), 5)  # the leader stopped serving it too
        assert await stream.caller("Echo", False, _same)(b"x", timeout=5, metadata=META) == b"echo:x"
        hanging = asyncio.ensure_future(stream.caller("Hang", False, _same)(b"", timeout=30, metadata=META))
        await asyncio.sleep(0.2)
        await leader.server.stop(0)  # the leader goes away under a call
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await asyncio.wait_for(hanging, 5)
        assert gone.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)  # retried
        assert stream.broken is not None
        await stream.close()


async def _first_echo_fails(channel: grpc.aio.Channel, code: grpc.StatusCode) -> forward_stream.LeaderStream:
    """A packed stream whose first call fails with ``code`` (closed before it is returned)."""
    stream = forward_stream.LeaderStream(channel, "n2", FORWARDED, CLIENT_ID)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stream.caller("Echo", False, _same)(b"x", timeout=5, metadata=META)
    assert failed.value.code() == code
    await stream.close()
    return stream


@run
async def test_a_secure_groups_leader_refuses_the_stream():
    async with Leader(secure=True) as address, grpc.aio.insecure_channel(address) as channel:
        await _first_echo_fails(channel, grpc.StatusCode.FAILED_PRECONDITION)


@run
async def test_a_packed_stream_to_a_leader_of_the_earlier_release_is_retried_unpacked():
    async with Leader(earlier_release=True) as address, grpc.aio.insecure_channel(address) as channel:
        stream = await _first_echo_fails(channel, grpc.StatusCode.UNAVAILABLE)  # what ``forward`` retries
        assert stream.unpacked and stream.broken is not None
        again = forward_stream.LeaderStream(channel, "n2", FORWARDED, CLIENT_ID, packed=False)
        try:
            assert await again.caller("Echo", False, _same)(b"x", timeout=5, metadata=META) == b"echo:x"
            assert not again.unpacked
        finally:
            await again.close()


def test_pack_and_unpack_keep_frames_and_refuse_a_cut_message():
    frames = [b"", b"a", b"\x00" * 70_000, b"last"]
    assert forward_stream.unpack(forward_stream.pack(frames)) == frames
    assert forward_stream.unpack(b"") == []
    message = forward_stream.pack([b"abc", b"defg"])
    with pytest.raises(ValueError, match="runs past the message"):
        forward_stream.unpack(message[:-1])
    with pytest.raises(ValueError, match="inside a frame length"):
        forward_stream.unpack(message + b"\x00\x00")


class _Follower:
    """What ``Forwarder`` reads of its node: a plain group's follower whose leader is "n1" at ``address``."""

    def __init__(self, address: str):
        self.id, self.leader_id, self._address = "n2", "n1", address
        self.config = type("Config", (), {"security": None})()

    def is_leader(self) -> bool:
        return False

    def address_of(self, node_id: str) -> str | None:
        return self._address if node_id == "n1" else None

    def serving(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _Context:
    def invocation_metadata(self):
        return ((CLIENT_ID, "client-7"),)


@run
async def test_a_forwarder_keeps_forwarding_to_a_leader_of_the_earlier_release_on_one_frame_a_message():
    """The rolling-upgrade case end to end: the first forward finds ``Packed`` unimplemented, is retried and
    answered on ``Calls``, and so are the next ones, on the same stream."""
    from broker_adapter.rocketmq.forward import Forwarder

    leader = Leader(earlier_release=True)
    async with leader as address:
        fwd = Forwarder(_Follower(address))
        try:
            loop = asyncio.get_running_loop()
            for i in range(3):
                answer = await fwd.unary("Echo", b"%d" % i, _Context(), loop.time() + 5, local=None)
                assert answer == b"echo:%d" % i
            assert leader.seen[-1][:3] == ("Echo", True, "client-7")
            assert leader.messages == 3  # one frame a message once it knew
        finally:
            await fwd.close()
