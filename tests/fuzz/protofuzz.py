"""Hypothesis strategies for any protobuf request, derived from its descriptor, and a caller for any gRPC method.

Each field gets values a careless or hostile client might send: edge integers (0, -1, the type's extremes),
undefined enum numbers, empty, long and non-ASCII strings, empty and oversized bytes, nested messages a few
levels deep, repeated and map fields of a few items. ``hints`` bias named string fields (``group``, ``topic``,
...) towards names the server knows, so that the fuzz reaches past the first check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor as _d
from google.protobuf import message_factory
from hypothesis import strategies as st

FD = _d.FieldDescriptor
MAX_DEPTH = 3

_INT64 = st.sampled_from([0, -1, 1, 2**63 - 1, -(2**63), 2**31]) | st.integers(-(2**63), 2**63 - 1)
_INT32 = st.sampled_from([0, -1, 1, 2**31 - 1, -(2**31)]) | st.integers(-(2**31), 2**31 - 1)
_UINT64 = st.sampled_from([0, 1, 2**64 - 1, 2**63]) | st.integers(0, 2**64 - 1)
_UINT32 = st.sampled_from([0, 1, 2**32 - 1]) | st.integers(0, 2**32 - 1)
_TEXT = st.text(max_size=40) | st.sampled_from(
    ["", " ", "x" * 5000, "名字\u0000\ud7ff", "../../etc/passwd", "%|-_"]
)
_SMALL_BYTES = st.binary(max_size=300)
_BYTES = (
    _SMALL_BYTES | _SMALL_BYTES | _SMALL_BYTES | st.sampled_from([b"", b"\xff" * 4096, b"\x00" * (5 << 20)])
)
_SCALARS: dict[int, st.SearchStrategy] = {
    FD.TYPE_INT64: _INT64,
    FD.TYPE_SINT64: _INT64,
    FD.TYPE_SFIXED64: _INT64,
    FD.TYPE_INT32: _INT32,
    FD.TYPE_SINT32: _INT32,
    FD.TYPE_SFIXED32: _INT32,
    FD.TYPE_UINT64: _UINT64,
    FD.TYPE_FIXED64: _UINT64,
    FD.TYPE_UINT32: _UINT32,
    FD.TYPE_FIXED32: _UINT32,
    FD.TYPE_BOOL: st.booleans(),
    FD.TYPE_DOUBLE: st.floats(width=64),
    FD.TYPE_FLOAT: st.floats(width=32),
    FD.TYPE_STRING: _TEXT,
    FD.TYPE_BYTES: _BYTES,
}


def message_class(desc: _d.Descriptor) -> type:
    return message_factory.GetMessageClass(desc)


def requests(desc: _d.Descriptor, hints: dict[str, list[Any]] | None = None) -> st.SearchStrategy:
    """Random instances of the message type ``desc`` (fields left unset at random)."""
    return _message(desc, hints or {}, 0)


def _message(desc: _d.Descriptor, hints: dict[str, list[Any]], depth: int) -> st.SearchStrategy:
    cls = message_class(desc)
    fields = {f.name: st.none() | _field(f, hints, depth) for f in desc.fields}
    return st.fixed_dictionaries(fields).map(lambda values: _build(cls, values))


def _build(cls: type, values: dict[str, Any]) -> Any:
    msg = cls()
    for name, value in values.items():
        if value is None:
            continue
        field = msg.DESCRIPTOR.fields_by_name[name]
        if _is_map(field):
            getattr(msg, name).update(value)
        elif field.is_repeated:
            target = getattr(msg, name)
            if field.type == FD.TYPE_MESSAGE:
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif field.type == FD.TYPE_MESSAGE:
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


def _is_map(field: _d.FieldDescriptor) -> bool:
    return field.type == FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _field(field: _d.FieldDescriptor, hints: dict[str, list[Any]], depth: int) -> st.SearchStrategy:
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(_single(key, hints, depth + 1), _single(value, hints, depth + 1), max_size=4)
    one = _single(field, hints, depth)
    if field.is_repeated:
        return st.lists(one, max_size=4)
    return one


def _single(field: _d.FieldDescriptor, hints: dict[str, list[Any]], depth: int) -> st.SearchStrategy:
    if field.type == FD.TYPE_MESSAGE:
        if depth >= MAX_DEPTH:
            return st.just(message_class(field.message_type)())
        return _message(field.message_type, hints, depth + 1)
    if field.type == FD.TYPE_ENUM:
        defined = [v.number for v in field.enum_type.values]
        return st.sampled_from(defined) | st.integers(-3, 70_000)
    base = _SCALARS[field.type]
    known = hints.get(field.name)
    if known:
        return st.sampled_from(known) | base
    return base


@dataclass(frozen=True, slots=True)
class Method:
    service: str
    name: str
    input: _d.Descriptor
    output: _d.Descriptor
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    def __repr__(self) -> str:  # hypothesis prints this in a failing example
        return f"{self.service}/{self.name}"


def methods(service: _d.ServiceDescriptor, skip: tuple[str, ...] = ()) -> list[Method]:
    return [
        Method(service.full_name, m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
        for m in service.methods
        if m.name not in skip
    ]


@dataclass(frozen=True, slots=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    responses: list[Any]


def call(
    channel: grpc.Channel,
    method: Method,
    requests_: list[Any],
    timeout_s: float,
    metadata: tuple[tuple[str, str], ...] = (),
) -> Outcome:
    """Call ``method`` with the request (or, for a client stream, the requests); collect what comes back."""
    out_cls = message_class(method.output)
    ser, de = (lambda m: m.SerializeToString()), out_cls.FromString
    kw = {"timeout": timeout_s, "metadata": metadata}
    responses: list[Any] = []
    try:
        if method.client_streaming and method.server_streaming:
            fn: Callable = channel.stream_stream(method.path, ser, de)
            responses.extend(_drain(fn(iter(requests_), **kw)))
        elif method.client_streaming:
            responses.append(channel.stream_unary(method.path, ser, de)(iter(requests_), **kw))
        elif method.server_streaming:
            responses.extend(_drain(channel.unary_stream(method.path, ser, de)(requests_[0], **kw)))
        else:
            responses.append(channel.unary_unary(method.path, ser, de)(requests_[0], **kw))
    except grpc.RpcError as e:
        return Outcome(e.code(), e.details() or "", responses)
    return Outcome(grpc.StatusCode.OK, "", responses)


def _drain(stream: Iterator[Any], limit: int = 64) -> list[Any]:
    got = []
    for r in stream:
        got.append(r)
        if len(got) >= limit:
            stream.cancel()
            break
    return got
