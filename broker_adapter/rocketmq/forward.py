"""Followers pass RocketMQ calls to the leader, so a client may talk to any node of the group.

RocketMQ 5 has no "not the leader, go there" answer that clients follow: its proxy forwards to the broker that
owns a queue. The official clients keep one channel to the group's address list and stay on one node, so each
node does what RocketMQ's proxy does: a call that changes state (send, receive, ack, offsets) is served by the
leader, and a follower forwards it over gRPC, waiting for an election to finish when no leader is known.

A forwarded call carries ``x-dledger-forwarded`` so it is never forwarded twice (a node that lost leadership
answers HA_NOT_AVAILABLE and the forwarding node tries the new leader), and the client's ``x-mq-client-id``
(the idempotent-producer identity). A forward that fails in transport (the leader died) is retried against the
next leader while the client's deadline allows: sends are idempotent (client id + message id sequence), acks
and invisible-time changes name a delivery epoch, and a retried receive at worst leaves messages invisible until
their invisible time runs out (then they are delivered again: at-least-once).

Nothing is re-encoded on the way: the request goes to the leader as the bytes the client sent (``handlers``
hands them over), and the leader's answer comes back as bytes and is relayed as it is. In a plain group the
calls to one leader share one long-lived stream (``forward_stream``); in a secure group each is a call of its
own, carrying the client's signature for the leader to check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc
from rocketmq.grpc_protocol import Code, service_pb2

from broker_adapter.rocketmq.forward_stream import LeaderStream
from broker_adapter.rocketmq.status import RocketMQError
from dledger.plugins import NodeHandle
from dledger.security.rotation import close_later

log = logging.getLogger(__name__)

FORWARDED: Final = "x-dledger-forwarded"
CLIENT_ID: Final = "x-mq-client-id"
_RETRIABLE: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
_SERVICE: Final = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
_STREAMING: Final = frozenset(m.name for m in _SERVICE.methods if m.server_streaming)


def _encode(request: Any) -> bytes:
    """A request as bytes: the client's own bytes when the servicer was handed them, else serialized."""
    return request if type(request) is bytes else request.SerializeToString()


def client_id(context: grpc.aio.ServicerContext) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == CLIENT_ID:
            return v if isinstance(v, str) else v.decode()
    return ""


def forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(k == FORWARDED for k, _ in context.invocation_metadata() or ())


SIGNED_HEADERS = ("authorization", "x-mq-date-time")  # dledger.security.auth's two headers


class Forwarder:
    """One channel per leader address (created on first use), and in a plain group one stream on it; the
    leader is the one the node knows of. Calls go out and answers come back as bytes (``request`` may be the
    client's bytes or a message)."""

    def __init__(self, node: NodeHandle):
        self._node = node
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[tuple[str, str], Any] = {}
        self._streams: dict[str, LeaderStream] = {}
        self._unpacked: set[str] = set()  # leaders that serve only forward_stream.PATH

    def is_leader(self) -> bool:
        return self._node.is_leader()

    async def leader(self, deadline: float) -> str | None:
        """The leader's id ("" for this node), waiting for an election until ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        node = self._node
        while True:
            if node.is_leader():
                return ""
            lead = node.leader_id
            if lead and lead != node.id:
                return lead
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(0.01)

    def channel(self, address: str) -> grpc.aio.Channel:
        """This node's channel to ``address`` (TLS in a secure group), made on first use."""
        channel = self._channels.get(address)
        if channel is None:
            options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            creds = self._credentials()
            channel = self._channels[address] = (
                grpc.aio.secure_channel(address, creds, options=options)
                if creds is not None
                else grpc.aio.insecure_channel(address, options=options)
            )
        return channel

    def _call(self, leader: str, method: str) -> Any:
        """The leader's ``method`` as a bytes-in, bytes-out callable ``(request, timeout=, metadata=)``: on the
        stream to the leader in a plain group, else a call of its own (one callable per address and method)."""
        address = self._node.address_of(leader)
        streaming = method in _STREAMING
        if self._node.config.security is None:
            stream = self._streams.get(address)
            if stream is None or stream.broken is not None:  # a broken one fails at once: open the next
                if stream is not None:
                    stream.cancel()
                    if stream.unpacked:
                        self._unpacked.add(address)  # a leader of an earlier release: one frame a message
                stream = LeaderStream(
                    self.channel(address),
                    self._node.id,
                    FORWARDED,
                    CLIENT_ID,
                    packed=address not in self._unpacked,
                )
                self._streams[address] = stream
            return stream.caller(method, streaming, _encode)
        hit = self._calls.get((address, method))
        if hit is None:
            channel = self.channel(address)
            path = f"/{_SERVICE.full_name}/{method}"
            make = channel.unary_stream if streaming else channel.unary_unary
            hit = self._calls[(address, method)] = make(path, request_serializer=_encode)
        return hit

    def _credentials(self) -> grpc.ChannelCredentials | None:
        """TLS to the leader in a secure group (docs/security.md): the call carries the client's signature."""
        security = self._node.config.security
        return grpc.ssl_channel_credentials(security.ca.read_bytes()) if security is not None else None

    def _metadata(self, context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
        md = ((FORWARDED, self._node.id), (CLIENT_ID, client_id(context)))
        if self._node.config.security is None:
            return md
        # The leader authenticates and authorizes the client again: its signature goes along as received.
        signed = tuple((k, v) for k, v in context.invocation_metadata() or () if k in SIGNED_HEADERS)
        return md + signed

    async def unary(
        self,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        deadline: float,
        local: Callable[[], Any],
        again: Callable[[bytes], bool] | None = None,
    ) -> Any:
        """Serve on the leader (``local()``), or forward to it; RocketMQError when no leader answers in time.
        ``again``: for a call that may be served twice, whether the leader's answer says it lost leadership
        under the call; then it goes to the next leader too, as after a transport failure. The node is
        ``serving`` meanwhile (a follower syncs off its loop while calls wait on it, decision 0029)."""
        with self._node.serving():
            loop = asyncio.get_running_loop()
            last: BaseException | None = None
            while True:
                leader = await self._target(context, deadline, last)
                if leader == "":
                    return await local()
                try:
                    answer = await self._call(leader, method)(
                        request, timeout=max(0.05, deadline - loop.time()), metadata=self._metadata(context)
                    )
                    if again is None or loop.time() >= deadline or not again(answer):
                        return answer
                    last = RocketMQError(Code.HA_NOT_AVAILABLE, f"{leader} lost leadership under {method}")
                    await asyncio.sleep(0.02)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in _RETRIABLE or loop.time() >= deadline:
                        raise _forward_failed(method, leader, err) from None
                    last = err
                    await asyncio.sleep(0.02)

    async def stream(
        self,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        deadline: float,
        local: Callable[[], AsyncIterator[Any]],
    ) -> AsyncIterator[Any]:
        """``unary`` for server-streaming calls; a forward is retried only before its first response."""
        with self._node.serving():
            loop = asyncio.get_running_loop()
            last: BaseException | None = None
            while True:
                leader = await self._target(context, deadline, last)
                if leader == "":
                    async for r in local():
                        yield r
                    return
                got = 0
                try:
                    call = self._call(leader, method)(
                        request, timeout=max(0.05, deadline - loop.time()), metadata=self._metadata(context)
                    )
                    async for r in call:
                        got += 1
                        yield r
                    return
                except grpc.aio.AioRpcError as err:
                    if got or err.code() not in _RETRIABLE or loop.time() >= deadline:
                        raise _forward_failed(method, leader, err) from None
                    last = err
                    await asyncio.sleep(0.02)

    async def _target(
        self, context: grpc.aio.ServicerContext, deadline: float, last: BaseException | None
    ) -> str:
        """Where a call goes: "" to serve it here (this node leads), else the leader's id; RocketMQError when no
        leader answers in time or the call was already forwarded to this node (``last``: the previous attempt's
        failure, named in that error)."""
        leader = await self.leader(deadline)
        if leader is None or (leader and forwarded(context)):
            raise _no_leader(self._node.id, last)
        return leader

    def redial(self) -> None:
        """The node's certificates were reloaded (docs/security.md, "Rotating certificates"): channels to the
        leader are made anew with the CA bundle the file holds now; the old ones close once the calls on them had
        time to end."""
        old = list(self._channels.values())
        self._channels, self._calls = {}, {}

        async def close_old() -> None:
            for channel in old:
                await channel.close()

        close_later(close_old)

    async def close(self) -> None:
        for stream in self._streams.values():
            await stream.close()
        self._streams.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._calls.clear()


def _forward_failed(method: str, leader: str, err: grpc.aio.AioRpcError) -> RocketMQError:
    return RocketMQError(Code.HA_NOT_AVAILABLE, f"forwarding {method} to {leader}: {err.details()}")


def _no_leader(node_id: str, last: BaseException | None) -> RocketMQError:
    why = (
        f" (last attempt: {last.details() if isinstance(last, grpc.aio.AioRpcError) else last})"
        if last
        else ""
    )
    return RocketMQError(
        Code.HA_NOT_AVAILABLE, f"node {node_id} is not the leader and no leader answered in time{why}; retry"
    )
