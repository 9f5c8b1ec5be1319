"""Registers the MessagingService on a gRPC server, refusing bytes that are not the request message.

The generated ``add_MessagingServiceServicer_to_server`` (from the official client's ``rocketmq.grpc_protocol``)
deserializes with ``FromString``: a request that does not parse then fails inside gRPC with an opaque INTERNAL
error. This registration is the same one, built from the same generated service descriptor and message classes,
except that a request which does not parse is answered INVALID_ARGUMENT naming the method and the parse error
(the protocol's own statuses cannot be used: there is no request to answer). Nothing reaches the servicer.

Bytes pass through unchanged both ways, so a follower forwards without re-encoding (``forward``): a servicer
method with a ``raw`` parameter also gets the request's bytes as received, and an answer that is already
``bytes`` (a leader's answer relayed, a cached route) is sent as it is. Those methods are also served to the
followers' forwarding streams (``forward_stream``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import service_pb2

from broker_adapter.rocketmq import forward_stream
from broker_adapter.rocketmq.forward import CLIENT_ID, FORWARDED

SERVICE: Final = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
SERVICE_NAME: Final = SERVICE.full_name


class Malformed:
    """Stands in for a request that did not parse."""

    __slots__ = ("error",)

    def __init__(self, error: str):
        self.error = error


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return cls.FromString(raw)
        except (DecodeError, ValueError) as err:
            return Malformed(f"{type(err).__name__}: {err}")

    return parse


def _serializer(cls: Any) -> Callable[[Any], bytes]:
    serialize = cls.SerializeToString

    def encode(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)

    return encode


def _identity(raw: bytes) -> bytes:
    return raw


async def _refuse(context: grpc.aio.ServicerContext, method: str, bad: Malformed) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{SERVICE_NAME}/{method}: the request is not a valid message ({bad.error})",
    )


def _unary_unary(name: str, fn: Callable, parse: Callable[[bytes], Any] | None) -> Callable:
    if parse is None:

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Malformed):
                await _refuse(context, name, request)
            return await fn(request, context)

        return call

    async def call_raw(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        request = parse(raw)
        if isinstance(request, Malformed):
            await _refuse(context, name, request)
        return await fn(request, context, raw)

    return call_raw


def _unary_stream(name: str, fn: Callable, parse: Callable[[bytes], Any] | None) -> Callable:
    async def call(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        request = raw if parse is None else parse(raw)
        if isinstance(request, Malformed):
            await _refuse(context, name, request)
        it = fn(request, context) if parse is None else fn(request, context, raw)
        async for r in it:
            yield r

    return call


def _stream_stream(name: str, fn: Callable) -> Callable:
    async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for r in requests:
                if isinstance(r, Malformed):
                    await _refuse(context, name, r)
                yield r

        async for r in fn(checked(), context):
            yield r

    return call


def add_to_server(servicer: Any, server: grpc.aio.Server) -> None:
    """Serve every method of the MessagingService from ``servicer`` (a ``MessagingServiceServicer``), and its
    forwarded methods to the followers' streams when it says whether its group is secure (``secure()``)."""
    handlers = {}
    forwarded: dict[str, forward_stream.Served] = {}
    for m in SERVICE.methods:
        request_cls = getattr(service_pb2, m.input_type.name)
        response_cls = getattr(service_pb2, m.output_type.name)
        fn = getattr(servicer, m.name)
        # A method that takes ``raw`` is parsed here (to forward its bytes as received); others by gRPC.
        wants_raw = not m.client_streaming and "raw" in inspect.signature(fn).parameters
        parse = _parser(request_cls)
        kwargs = {
            "request_deserializer": _identity if wants_raw else parse,
            "response_serializer": _serializer(response_cls),
        }
        own = parse if wants_raw else None
        if wants_raw:
            forwarded[m.name] = (
                request_cls.FromString,
                fn,
                kwargs["response_serializer"],
                m.server_streaming,
            )
        if m.client_streaming and m.server_streaming:
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(_stream_stream(m.name, fn), **kwargs)
        elif m.server_streaming:
            handlers[m.name] = grpc.unary_stream_rpc_method_handler(_unary_stream(m.name, fn, own), **kwargs)
        elif m.client_streaming:
            raise TypeError(f"{SERVICE_NAME}/{m.name}: client-streaming methods are not expected")
        else:
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(_unary_unary(m.name, fn, own), **kwargs)
    generic = [grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)]
    secure = getattr(servicer, "secure", None)
    if secure is not None:
        streams = {  # bytes both ways: one frame a message (followers of an earlier release), or packed
            path.rsplit("/", 1)[1]: grpc.stream_stream_rpc_method_handler(
                forward_stream.serve_calls(forwarded, FORWARDED, CLIENT_ID, secure, packed=packed)
            )
            for path, packed in ((forward_stream.PATH, False), (forward_stream.PACKED_PATH, True))
        }
        generic.append(grpc.method_handlers_generic_handler(forward_stream.SERVICE_NAME, streams))
    server.add_generic_rpc_handlers(tuple(generic))
