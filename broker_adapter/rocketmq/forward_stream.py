"""A follower's forwarded calls share one long-lived stream to the leader instead of one gRPC call each.

A unary gRPC call costs both nodes a call's setup and teardown (metadata, handler lookup, a task, the status);
on a stream a forwarded call is one message each way. ``Forwarder`` (``forward``) keeps its retry loop and
hands each attempt to ``LeaderStream.caller``, which behaves as the per-call callable it replaces: the request's
bytes go out as the client sent them, the leader's answer bytes come back unchanged, a deadline or a broken
stream fails the attempt with the ``AioRpcError`` a call would have failed with (UNAVAILABLE is retried,
DEADLINE_EXCEEDED and the leader's own failures are not), and a caller that stops waiting cancels its call on
the leader, as cancelling a call does.

Only plain groups use it: in a secure group every forwarded call carries the client's signature through the
leader's interceptor, which checks it per call (``dledger.security.guard``), so there calls stay calls and the
leader refuses this stream.

Frames, bytes both ways (no proto: the method, client id and request bytes are all the leader needs)::

    request   call id u32, timeout ms u32, kind u8 (CALL, CANCEL), method u8+n, client id u16+n, request bytes
    response  call id u32, kind u8 (MORE: a streamed answer, more follow; LAST: the answer; END: the stream
              of answers ended; FAILED: the leader could not serve it, UTF-8 details), answer bytes

On ``PACKED_PATH`` each stream message carries every frame that was waiting when it was written, each as its
length (u32) and bytes: the calls a follower took while its previous write was in progress go out as one
message, and so do the answers of the calls one Raft round committed (a gRPC message costs each side about as
much as the work of a call). ``PATH`` carries one frame a message: a leader of an earlier release serves only
that one, so a follower that finds ``PACKED_PATH`` unimplemented there opens ``PATH`` instead (``unpacked``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import grpc

from dledger.batch_stream import queued_answers

log = logging.getLogger(__name__)

SERVICE_NAME: Final = "dledger.rocketmq.v1.Forwarding"
PATH: Final = f"/{SERVICE_NAME}/Calls"
PACKED_PATH: Final = f"/{SERVICE_NAME}/Packed"
CALL, CANCEL = 0, 1
MORE, LAST, END, FAILED = 0, 1, 2, 3
_REQUEST: Final = struct.Struct(">IIBB")  # call id, timeout ms, kind, method length
_CLIENT: Final = struct.Struct(">H")
_RESPONSE: Final = struct.Struct(">IB")
_LENGTH: Final = struct.Struct(">I")
_NO_METADATA: Final = grpc.aio.Metadata()


def _failure(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, _NO_METADATA, _NO_METADATA, details)


def pack(frames: list[bytes]) -> bytes:
    """One ``PACKED_PATH`` message of ``frames``."""
    parts: list[bytes] = []
    for f in frames:
        parts.append(_LENGTH.pack(len(f)))
        parts.append(f)
    return b"".join(parts)


def unpack(message: bytes) -> list[bytes]:
    """The frames of a ``PACKED_PATH`` message; ValueError when a length runs past its end."""
    frames: list[bytes] = []
    at, n = 0, len(message)
    while at < n:
        if at + _LENGTH.size > n:
            raise ValueError(f"a packed forwarding message ends inside a frame length at byte {at}")
        (k,) = _LENGTH.unpack_from(message, at)
        at += _LENGTH.size
        if at + k > n:
            raise ValueError(
                f"a packed forwarding frame of {k} bytes at byte {at} runs past the message ({n})"
            )
        frames.append(message[at : at + k])
        at += k
    return frames


def _drain(first: bytes, queue: asyncio.Queue[Any]) -> list[bytes]:
    """``first`` and every frame waiting behind it (an end marker, None, found there is left for its reader)."""
    batch = [first]
    while not queue.empty():
        frame = queue.get_nowait()
        if frame is None:
            queue.put_nowait(None)
            break
        batch.append(frame)
    return batch


def request_frame(call_id: int, timeout_ms: int, kind: int, method: str, client: str, body: bytes) -> bytes:
    m, c = method.encode(), client.encode()
    return _REQUEST.pack(call_id, timeout_ms, kind, len(m)) + m + _CLIENT.pack(len(c)) + c + body


def parse_request(frame: bytes) -> tuple[int, int, int, str, str, bytes]:
    call_id, timeout_ms, kind, n = _REQUEST.unpack_from(frame)
    at = _REQUEST.size
    method = frame[at : at + n].decode()
    at += n
    (k,) = _CLIENT.unpack_from(frame, at)
    at += _CLIENT.size
    client = frame[at : at + k].decode()
    return call_id, timeout_ms, kind, method, client, frame[at + k :]


class LeaderStream:
    """One stream to one leader address, opened on first use; its calls are told apart by id. Once broken
    (``broken``) it fails what waits on it, and the forwarder opens a new one for the next attempt. ``packed``:
    on ``PACKED_PATH``; ``unpacked`` is set when the leader does not serve it (an earlier release)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        node_id: str,
        forwarded_header: str,
        client_header: str,
        packed: bool = True,
    ):
        self._client_header = client_header
        self._callers: dict[str, Callable[..., Any]] = {}
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Queue[tuple[int, Any]]] = {}
        self._ids = itertools.count(1)
        self.broken: grpc.aio.AioRpcError | None = None
        self.packed = packed
        self.unpacked = False
        self._call = channel.stream_stream(PACKED_PATH if packed else PATH)(
            self._frames(), metadata=((forwarded_header, node_id),)
        )
        self._reader = asyncio.ensure_future(self._read())

    async def _frames(self) -> AsyncIterator[bytes]:
        while True:
            frame = await self._outbox.get()
            yield pack(_drain(frame, self._outbox)) if self.packed else frame

    async def _read(self) -> None:
        failure = _failure(grpc.StatusCode.UNAVAILABLE, "the forwarding stream to the leader ended")
        try:
            async for message in self._call:
                for frame in unpack(message) if self.packed else (message,):
                    call_id, kind = _RESPONSE.unpack_from(frame)
                    q = self._waiting.get(call_id)
                    if q is not None:
                        q.put_nowait((kind, frame[_RESPONSE.size :]))
        except grpc.aio.AioRpcError as e:
            failure = e
            if self.packed and e.code() is grpc.StatusCode.UNIMPLEMENTED:
                # A leader of an earlier release: retried (UNAVAILABLE) on a stream of one frame a message.
                self.unpacked = True
                failure = _failure(
                    grpc.StatusCode.UNAVAILABLE, "the leader forwards one call a message: reopening"
                )
        except asyncio.CancelledError:
            failure = _failure(grpc.StatusCode.CANCELLED, "the forwarding stream was closed")
            raise
        finally:
            self.broken = failure
            for q in self._waiting.values():
                q.put_nowait((FAILED, failure))

    def _start(self, method: str, body: bytes, timeout: float, metadata: tuple) -> tuple[int, asyncio.Queue]:
        if self.broken is not None:
            raise self.broken
        call_id = next(self._ids)
        q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._waiting[call_id] = q
        client = next((v for k, v in metadata if k == self._client_header), "")
        self._outbox.put_nowait(request_frame(call_id, int(timeout * 1000), CALL, method, client, body))
        return call_id, q

    def _end(self, call_id: int, answered: bool) -> None:
        self._waiting.pop(call_id, None)
        if not answered and self.broken is None:  # the caller stopped waiting: so does the leader
            self._outbox.put_nowait(request_frame(call_id, 0, CANCEL, "", "", b""))

    @staticmethod
    def _answer(kind: int, payload: Any) -> bytes:
        if kind == FAILED:
            raise (
                payload
                if isinstance(payload, grpc.aio.AioRpcError)
                else _failure(grpc.StatusCode.UNKNOWN, payload.decode(errors="replace"))
            )
        return payload

    def caller(self, method: str, streaming: bool, encode: Callable[[Any], bytes]) -> Callable[..., Any]:
        """``method`` as the per-call callable it replaces: ``(request, timeout=, metadata=)`` giving the answer
        bytes (streaming: an async iterator of them); ``encode`` makes the request bytes (one per method)."""
        known = self._callers.get(method)
        if known is None:
            known = self._callers[method] = self._make_caller(method, streaming, encode)
        return known

    def _make_caller(
        self, method: str, streaming: bool, encode: Callable[[Any], bytes]
    ) -> Callable[..., Any]:
        async def unary(request: Any, timeout: float, metadata: tuple) -> bytes:
            call_id, q = self._start(method, encode(request), timeout, metadata)
            answered = False
            try:
                async with asyncio.timeout(timeout):
                    kind, payload = await q.get()
                answered = True
                return self._answer(kind, payload)
            except TimeoutError:
                raise _failure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            finally:
                self._end(call_id, answered)

        async def stream(request: Any, timeout: float, metadata: tuple) -> AsyncIterator[bytes]:
            call_id, q = self._start(method, encode(request), timeout, metadata)
            answered = False
            try:
                async with asyncio.timeout(timeout):
                    while True:
                        kind, payload = await q.get()
                        if kind == END:
                            answered = True
                            return
                        answered = kind != MORE
                        yield self._answer(kind, payload)
                        if answered:
                            return
            except TimeoutError:
                raise _failure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            finally:
                self._end(call_id, answered)

        return stream if streaming else unary

    def cancel(self) -> None:
        self._reader.cancel()
        self._call.cancel()

    async def close(self) -> None:
        self.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class ForwardedContext:
    """What a servicer method reads of its gRPC context, for a call that came on the stream: the forwarding
    node and the client id as metadata (so it is never forwarded again), and the time the follower allows."""

    __slots__ = ("_deadline", "_metadata")

    def __init__(self, metadata: tuple[tuple[str, str], ...], deadline: float):
        self._metadata = metadata
        self._deadline = deadline

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float:
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _failure(code, details)


# What serves one method on the leader: (parse the request bytes, the servicer method, serialize an answer,
# whether it streams its answers).
Served = tuple[Callable[[bytes], Any], Callable[..., Any], Callable[[Any], bytes], bool]


def serve_calls(
    methods: Mapping[str, Served],
    forwarded_header: str,
    client_header: str,
    secure: Callable[[], bool],
    packed: bool = False,
) -> Callable[..., AsyncIterator[bytes]]:
    """The leader's end of the stream (``PACKED_PATH`` when ``packed``, else ``PATH``): each call served in a
    task of its own, answers framed as they come."""

    async def calls(frames: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if secure():
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "a secure group forwards RocketMQ calls one by one, with the client's signature",
            )
        peer = next((v for k, v in context.invocation_metadata() or () if k == forwarded_header), "")
        outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        running: dict[int, asyncio.Task] = {}
        loop = asyncio.get_running_loop()

        async def serve(call_id: int, method: str, timeout_ms: int, client: str, body: bytes) -> None:
            put = outbox.put_nowait
            try:
                parse, fn, serialize, streaming = methods[method]
                ctx = ForwardedContext(
                    ((forwarded_header, peer), (client_header, client)), loop.time() + timeout_ms / 1000
                )
                async with asyncio.timeout(timeout_ms / 1000):
                    if streaming:
                        async for r in fn(parse(body), ctx, body):
                            put(_RESPONSE.pack(call_id, MORE) + serialize(r))
                        put(_RESPONSE.pack(call_id, END))
                    else:
                        put(_RESPONSE.pack(call_id, LAST) + serialize(await fn(parse(body), ctx, body)))
            except asyncio.CancelledError:
                pass  # the follower stopped waiting (or the stream closed): nobody reads an answer
            except TimeoutError:
                put(_RESPONSE.pack(call_id, FAILED) + b"Deadline Exceeded")
            except grpc.aio.AioRpcError as e:
                put(_RESPONSE.pack(call_id, FAILED) + (e.details() or "").encode())
            except Exception as e:  # as a failed call would answer (UNKNOWN); logged here, where it happened
                log.exception("serving a forwarded %s", method)
                put(_RESPONSE.pack(call_id, FAILED) + f"{type(e).__name__}: {e}".encode())
            finally:
                running.pop(call_id, None)

        async def read() -> None:
            try:
                async for message in frames:
                    for frame in unpack(message) if packed else (message,):
                        call_id, timeout_ms, kind, method, client, body = parse_request(frame)
                        if kind == CANCEL:
                            task = running.get(call_id)
                            if task is not None:
                                task.cancel()
                        else:
                            running[call_id] = asyncio.ensure_future(
                                serve(call_id, method, timeout_ms, client, body)
                            )
            finally:
                outbox.put_nowait(None)

        async with contextlib.aclosing(queued_answers(read(), outbox, running.values())) as answers:
            async for frame in answers:
                yield pack(_drain(frame, outbox)) if packed else frame

    return calls
