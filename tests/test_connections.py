"""The client core every client uses (dledger/connections.py): one channel per node shared by every stub on it,
redirects followed to the leader and remembered, refusals retried, a write broken in flight not retried, against
real gRPC servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from dledger.connections import AsyncChannels, Channels
from dledger.errors import NotLeaderError, OutcomeUnknownError, UnavailableError
from dledger.routing import Router
from dledger.transport import convert

METHOD = "/test.Echo/Echo"


class _Node:
    """A server whose one method answers per a script: "ok", "not-leader:<address>", "refuse" or "break"."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(self._echo)}
                ),
            )
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _echo(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        step = self.script.pop(0) if self.script else "ok"
        if step.startswith("not-leader:"):
            err = NotLeaderError("n9", "not the leader")
            context.set_trailing_metadata(convert.error_metadata(err, step.removeprefix("not-leader:")))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the leader")
        if step == "refuse":
            context.set_trailing_metadata(convert.error_metadata(UnavailableError("starting")))
            context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
        if step == "cancel":  # a node shutting down cancels the calls it serves
            context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        if step == "break":  # as gRPC reports a connection lost mid-call: a bare status
            context.abort(grpc.StatusCode.UNAVAILABLE, "broke after the request")
        return self.address.encode()


@pytest.fixture
def nodes() -> Iterator[tuple[_Node, _Node]]:
    a, b = _Node(), _Node()
    yield a, b
    a.server.stop(None)
    b.server.stop(None)


def _echo(channels: Channels, address: str, timeout_s: float) -> bytes:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channels.channel(address).unary_unary(METHOD)
    return call(b"", timeout=timeout_s)


def test_a_redirect_is_followed_and_remembered_and_a_refusal_retried(nodes):
    a, b = nodes
    a.script = [f"not-leader:{b.address}"]
    b.script = ["refuse"]
    router = Router([a.address], backoff_s=(0.001, 0.002))
    channels = Channels(None)
    try:
        answer = channels.call(
            router.attempts(5.0), lambda addr, t: _echo(channels, addr, t), write=True, rpc_timeout_s=1.0
        )
        assert answer == b.address.encode()
        assert router.leader == b.address and b.address in router.addresses
        assert (a.calls, b.calls) == (1, 2)
        assert router.stats == {"retries": 2, "redirects": 1}
        assert channels.channel(b.address) is channels.channel(b.address)  # one channel per node
    finally:
        channels.close()
    assert not channels._channels  # closed and forgotten


def test_a_write_broken_in_flight_is_not_retried_but_a_read_is(nodes):
    a, _ = nodes
    router = Router([a.address], backoff_s=(0.001, 0.002))
    channels = Channels(None)
    try:
        a.script = ["break"]
        with pytest.raises(OutcomeUnknownError):
            channels.call(
                router.attempts(5.0), lambda addr, t: _echo(channels, addr, t), write=True, rpc_timeout_s=1.0
            )
        a.script, a.calls = ["break", "refuse"], 0  # a read broken in flight: nothing happened, try again
        answer = channels.call(
            router.attempts(5.0), lambda addr, t: _echo(channels, addr, t), write=False, rpc_timeout_s=1.0
        )
        assert answer == a.address.encode() and a.calls == 3
        a.script, a.calls = (
            ["cancel"],
            0,
        )  # cancelled by a stopping node: a read is tried again, a write is unknown
        read = channels.call(
            router.attempts(5.0), lambda addr, t: _echo(channels, addr, t), write=False, rpc_timeout_s=1.0
        )
        assert read == a.address.encode() and a.calls == 2
        a.script = ["cancel"]
        with pytest.raises(OutcomeUnknownError):
            channels.call(
                router.attempts(5.0), lambda addr, t: _echo(channels, addr, t), write=True, rpc_timeout_s=1.0
            )
        a.script = ["refuse"] * 10_000  # a node that never gets ready: give up at the deadline, naming why
        with pytest.raises(UnavailableError, match=r"did not succeed within 0\.3 s; last error: .*starting"):
            channels.call(
                router.attempts(0.3), lambda addr, t: _echo(channels, addr, t), write=False, rpc_timeout_s=0.1
            )
    finally:
        channels.close()


def test_the_asyncio_twin_follows_the_same_rules(nodes):
    a, b = nodes
    a.script = [f"not-leader:{b.address}"]

    async def run() -> bytes:
        channels = AsyncChannels(None)
        router = Router([a.address], backoff_s=(0.001, 0.002))

        async def echo(address: str, timeout_s: float) -> bytes:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channels.channel(address).unary_unary(
                METHOD
            )
            return await call(b"", timeout=timeout_s)

        try:
            answer = await channels.call(router.attempts(5.0), echo, write=True, rpc_timeout_s=1.0)
            assert router.leader == b.address
            return answer
        finally:
            await channels.close()

    assert asyncio.run(run()) == b.address.encode()
