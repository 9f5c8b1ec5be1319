"""Clients for a dledger group: ``AsyncDLedgerClient`` (asyncio) and ``DLedgerClient`` (blocking).

Give either any subset of the group's addresses. The client finds the leader (asking nodes for metadata and
following not-leader hints), retries what is safe to retry with bounded exponential backoff inside an overall
deadline, and reports outcomes honestly:

- an append that a node rejected before proposing it (not leader, no leader yet, backpressure, node starting or
  stopping, connection refused) is retried, because it certainly did not happen;
- an append that was handed to a leader which then failed or lost leadership before answering may or may not
  have committed: it raises ``OutcomeUnknownError`` and is *not* retried (appends are not idempotent);
- everything else raises the ``DLedgerError`` the node reported (``InvalidRequestError``, ``NotFoundError``...).

Concurrent appends from one ``AsyncDLedgerClient`` share one bidirectional ``AppendStream`` per node; appends
queued while a message is being written are packed into the next stream message (each caller still gets only
its own results). One gRPC call per entry would cap throughput at a few thousand entries/s on a small machine;
this way many concurrent callers cost about one message per leader round trip.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dledger.errors import (
    DLedgerError,
    NotLeaderError,
    OutcomeUnknownError,
    UnavailableError,
)
from dledger.transport import convert
from dledger.transport.base import AppendedRun, AppendResult, NodeInfo, PeerInfo
from dledger.transport.grpc import open_channel
from dledger.v1 import client_pb2, client_pb2_grpc

__all__ = ["AppendResult", "AsyncDLedgerClient", "DLedgerClient", "GetResult", "NodeInfo"]

_RETRIABLE_CONNECT = (grpc.StatusCode.UNAVAILABLE,)


@dataclass(frozen=True, slots=True)
class GetResult:
    index: int
    term: int
    pos: int
    magic: int
    body: bytes


def _info_from_pb(p: client_pb2.MetadataResponse) -> NodeInfo:
    return NodeInfo(
        group=p.group,
        node_id=p.node_id,
        address=p.address,
        role=p.role,
        term=p.term,
        leader_id=p.leader_id or None,
        leader_address=p.leader_address or None,
        last_index=p.last_index,
        commit_index=p.commit_index,
        applied_index=p.applied_index,
        peers=tuple(PeerInfo(x.id, x.address, x.match_index) for x in p.peers),
        data_dir=p.data_dir,
        pid=p.pid,
        flush=p.flush,
    )


def _error_from_rpc(e: grpc.aio.AioRpcError, address: str) -> DLedgerError:
    md = {k: v for k, v in (e.trailing_metadata() or ()) if isinstance(v, str)}
    err = convert.error_from_status(e.code(), f"{address}: {e.details()}", md)
    return err


def _never_sent(e: grpc.aio.AioRpcError) -> bool:
    """True when gRPC could not even reach the node (so the request cannot have been acted on)."""
    return e.code() is grpc.StatusCode.UNAVAILABLE and _never_sent_details(e.details())


def _never_sent_details(details: str | None) -> bool:
    d = (details or "").lower()
    return "failed to connect" in d or "connection refused" in d or "connect failed" in d


class _AppendStream:
    """One ``AppendStream`` call to one node, shared by concurrent appenders.

    A writer task packs every append waiting in the queue into one stream message; the node answers it as one
    batch, and the reader hands each caller its slice. If the stream breaks, appends already written have an
    unknown outcome; appends not yet written fail as never sent (safe to retry)."""

    def __init__(self, stub: client_pb2_grpc.DLedgerStub, group: str, address: str, max_pack: int):
        self.address = address
        self._group = group
        self._call = stub.AppendStream()
        self._queue: list[tuple[list[bytes], asyncio.Future]] = []
        self._has_work = asyncio.Event()
        self._inflight: dict[int, list[tuple[int, asyncio.Future]]] = {}
        self._ids = itertools.count(1)
        self._max_pack = max_pack
        self.broken: BaseException | None = None
        self._writer = asyncio.create_task(self._write_loop())
        self._reader = asyncio.create_task(self._read_loop())

    async def append(self, bodies: list[bytes]) -> AppendedRun:
        if self.broken is not None:
            raise UnavailableError(f"{self.address}: stream closed") from self.broken
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((bodies, fut))
        self._has_work.set()
        return await fut

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._has_work.wait()
                self._has_work.clear()
                while self._queue:
                    batch, n = [], 0
                    while self._queue and (n == 0 or n + len(self._queue[0][0]) <= self._max_pack):
                        item = self._queue.pop(0)
                        batch.append(item)
                        n += len(item[0])
                    rid = next(self._ids)
                    self._inflight[rid] = [(len(b), f) for b, f in batch]
                    bodies = [x for b, _ in batch for x in b]
                    await self._call.write(
                        client_pb2.AppendRequest(group=self._group, bodies=bodies, request_id=rid)
                    )
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            await self._break_from_call()
        except asyncio.CancelledError:
            self._break(UnavailableError("client closed"))
            raise

    async def _read_loop(self) -> None:
        try:
            async for resp in self._call:
                waiting = self._inflight.pop(resp.request_id, None)
                if waiting is None:
                    continue
                if resp.HasField("error"):
                    err = convert.append_error_from_pb(resp.error)
                    for _, f in waiting:
                        if not f.done():
                            f.set_exception(err)
                    continue
                first, term, pos = resp.first_index, resp.term, resp.pos
                i = 0
                for n, f in waiting:
                    if not f.done():
                        f.set_result(AppendedRun(first + i, term, tuple(pos[i : i + n])))
                    i += n
            await self._break_from_call()
        except grpc.aio.AioRpcError:
            await self._break_from_call()
        except asyncio.CancelledError:
            self._break(UnavailableError("client closed"))
            raise

    async def _break_from_call(self) -> None:
        """The stream ended: learn why from the call's final status, then fail what waits accordingly."""
        code = await self._call.code()
        details = await self._call.details()
        never = code is grpc.StatusCode.UNAVAILABLE and _never_sent_details(details)
        self._break(UnavailableError(f"{self.address}: stream ended with {code.name}: {details}"), never)

    def _break(self, cause: BaseException, never_sent: bool = False) -> None:
        if self.broken is None:
            self.broken = cause
        for waiting in self._inflight.values():
            for _, f in waiting:
                if f.done():
                    continue
                if never_sent:
                    f.set_exception(
                        UnavailableError(f"{self.address} is unreachable; the append was not sent")
                    )
                else:
                    f.set_exception(
                        OutcomeUnknownError(
                            f"connection to {self.address} broke after the append was sent: it may or may not "
                            f"have committed ({cause})"
                        )
                    )
        self._inflight.clear()
        for _, f in self._queue:
            if not f.done():
                f.set_exception(UnavailableError(f"{self.address}: stream broke before the append was sent"))
        self._queue.clear()

    async def close(self) -> None:
        self._writer.cancel()
        self._reader.cancel()
        self._call.cancel()
        await asyncio.gather(self._writer, self._reader, return_exceptions=True)


class AsyncDLedgerClient:
    """asyncio client. ``timeout_s`` bounds each operation including its retries."""

    def __init__(
        self,
        addresses: Sequence[str],
        group: str = "",
        *,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 5.0,
        backoff_s: tuple[float, float] = (0.01, 0.2),
        use_stream: bool = True,
        max_pack: int = 1000,
        rng: random.Random | None = None,
    ):
        if not addresses:
            raise ValueError("give at least one node address (host:port)")
        self.addresses = list(dict.fromkeys(addresses))
        self.group = group
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._backoff = backoff_s
        self._use_stream = use_stream
        self._max_pack = max_pack
        self._rng = rng or random.Random()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, client_pb2_grpc.DLedgerStub] = {}
        self._other_stubs: dict[tuple[str, type], Any] = {}
        self._streams: dict[str, _AppendStream] = {}
        self.leader: str | None = None
        self._next = 0
        self.stats = {"retries": 0, "redirects": 0}

    def _stub(self, address: str) -> client_pb2_grpc.DLedgerStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = open_channel(address)
            self._channels[address] = ch
            stub = self._stubs[address] = client_pb2_grpc.DLedgerStub(ch)
        return stub

    def _candidate(self) -> str:
        if self.leader:
            return self.leader
        addr = self.addresses[self._next % len(self.addresses)]
        self._next += 1
        return addr

    def _learn(self, err: DLedgerError, address: str) -> None:
        """Follow a not-leader hint; forget a leader that failed."""
        if isinstance(err, NotLeaderError) and err.leader_hint and ":" in err.leader_hint:
            self.leader = err.leader_hint
            if err.leader_hint not in self.addresses:
                self.addresses.append(err.leader_hint)
            self.stats["redirects"] += 1
        elif self.leader == address:
            self.leader = None

    async def _sleep_backoff(self, attempt: int, deadline: float) -> None:
        lo, hi = self._backoff
        delay = min(hi, lo * (2**attempt)) * (0.5 + self._rng.random())
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))

    async def append(self, body: bytes) -> AppendResult:
        return (await self.append_batch([body]))[0]

    async def append_batch(self, bodies: Sequence[bytes]) -> list[AppendResult]:
        bodies = [bytes(b) for b in bodies]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        attempt = 0
        last: BaseException | None = None
        while loop.time() < deadline:
            address = self._candidate()
            try:
                async with asyncio.timeout(max(0.001, min(self.rpc_timeout_s, deadline - loop.time()))):
                    results = await self._append_once(address, bodies)
                self.leader = address
                return results.results()
            except OutcomeUnknownError:
                self.leader = None if self.leader == address else self.leader
                raise
            except TimeoutError:
                raise OutcomeUnknownError(
                    f"no answer from {address} within {self.rpc_timeout_s} s: the append may or may not commit"
                ) from None
            except DLedgerError as e:
                if not e.retriable:
                    raise
                last = e
                # Follow a hint at once, unless it points back where we just were (a stale hint): then wait.
                redirected = isinstance(e, NotLeaderError) and e.leader_hint and e.leader_hint != address
                self._learn(e, address)
                self.stats["retries"] += 1
                if not redirected:
                    await self._sleep_backoff(attempt, deadline)
                attempt += 1
        raise UnavailableError(f"append did not succeed within {self.timeout_s} s; last error: {last}")

    async def _append_once(self, address: str, bodies: list[bytes]) -> AppendedRun:
        if self._use_stream:
            s = self._streams.get(address)
            if s is None or s.broken is not None:
                if s is not None:
                    await s.close()
                s = self._streams[address] = _AppendStream(
                    self._stub(address), self.group, address, self._max_pack
                )
            return await s.append(bodies)
        try:
            resp = await self._stub(address).Append(
                client_pb2.AppendRequest(group=self.group, bodies=bodies), timeout=self.rpc_timeout_s
            )
        except grpc.aio.AioRpcError as e:
            err = _error_from_rpc(e, address)
            if isinstance(err, UnavailableError) and not _never_sent(e) and not _is_node_refusal(e):
                # The call broke (connection lost, node killed) after the request may have arrived.
                raise OutcomeUnknownError(
                    f"{address} failed while the append was in flight: {e.details()}"
                ) from e
            raise err from e
        return AppendedRun(resp.first_index, resp.term, tuple(resp.pos))

    async def get(self, index: int, address: str | None = None) -> GetResult:
        """Read a committed entry (from ``address``, else the leader or any node)."""
        p = await self._unary(
            lambda stub: stub.Get(
                client_pb2.GetRequest(group=self.group, index=index), timeout=self.rpc_timeout_s
            ),
            address,
        )
        return GetResult(p.index, p.term, p.pos, p.magic, p.body)

    async def metadata(self, address: str | None = None) -> NodeInfo:
        p = await self._unary(
            lambda stub: stub.Metadata(
                client_pb2.MetadataRequest(group=self.group), timeout=self.rpc_timeout_s
            ),
            address,
        )
        return _info_from_pb(p)

    async def transfer_leadership(self, target: str) -> str:
        p = await self._unary(
            lambda stub: stub.TransferLeadership(
                client_pb2.TransferLeadershipRequest(group=self.group, target=target), timeout=self.timeout_s
            ),
            None,
            leader_only=True,
        )
        self.leader = None
        return p.leader_id

    async def find_leader(self) -> NodeInfo:
        """Ask nodes until one knows the leader; returns the leader's metadata."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        attempt = 0
        while loop.time() < deadline:
            for address in list(self.addresses):
                try:
                    info = await self.metadata(address)
                except DLedgerError:
                    continue
                if info.role == "leader":
                    self.leader = address
                    return info
                if info.leader_address:
                    try:
                        leader = await self.metadata(info.leader_address)
                    except DLedgerError:
                        continue
                    if leader.role == "leader":
                        self.leader = info.leader_address
                        return leader
            await self._sleep_backoff(attempt, deadline)
            attempt += 1
        raise UnavailableError(f"no leader found among {', '.join(self.addresses)} within {self.timeout_s} s")

    def stub(self, address: str, stub_type: type) -> Any:
        """A stub of another service served by the nodes (e.g. ``kv_pb2_grpc.KVStub``), on this client's
        channel to ``address``."""
        self._stub(address)
        key = (address, stub_type)
        stub = self._other_stubs.get(key)
        if stub is None:
            stub = self._other_stubs[key] = stub_type(self._channels[address])
        return stub

    async def call(self, fn, *, stub_type: type, write: bool, address: str | None = None):
        """``await fn(stub)`` on the leader (or on ``address``), following not-leader hints and retrying what
        is retriable within ``timeout_s``, for services stacked on the nodes (the KV store, the broker).

        A ``write`` whose call broke after the request may have reached the node raises
        ``OutcomeUnknownError`` instead of being retried: it may have been applied."""
        return await self._unary(fn, address, leader_only=True, stub_type=stub_type, write=write)

    async def _unary(
        self,
        fn,
        address: str | None,
        leader_only: bool = False,
        stub_type: type | None = None,
        write: bool = False,
    ):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        attempt = 0
        last: BaseException | None = None
        while loop.time() < deadline:
            target = address or (self._candidate() if leader_only else (self.leader or self._candidate()))
            try:
                return await fn(self._stub(target) if stub_type is None else self.stub(target, stub_type))
            except grpc.aio.AioRpcError as e:
                err = _error_from_rpc(e, target)
                if (
                    write
                    and isinstance(err, UnavailableError)
                    and not _never_sent(e)
                    and not _is_node_refusal(e)
                ):
                    raise OutcomeUnknownError(
                        f"{target} failed while the write was in flight: {e.details()}"
                    ) from e
                if address is not None or not err.retriable or isinstance(err, OutcomeUnknownError):
                    raise err from e
                last = err
                self._learn(err, target)
                await self._sleep_backoff(attempt, deadline)
                attempt += 1
        raise UnavailableError(f"no node answered within {self.timeout_s} s; last error: {last}")

    async def close(self) -> None:
        for s in self._streams.values():
            await s.close()
        self._streams.clear()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._stubs.clear()
        self._other_stubs.clear()

    async def __aenter__(self) -> AsyncDLedgerClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _is_node_refusal(e: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE raised by a node's own code (no leader, shutting down, starting) rather than by a broken
    connection: the node marks it, and the request was not acted on."""
    md = {k: v for k, v in (e.trailing_metadata() or ()) if isinstance(v, str)}
    return md.get(convert.REFUSED_KEY) == "1"


class DLedgerClient:
    """Blocking client: the same behaviour as ``AsyncDLedgerClient``, run on a private event-loop thread."""

    def __init__(self, addresses: Sequence[str], group: str = "", **kwargs):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dledger-client", daemon=True)
        self._thread.start()
        self._client: AsyncDLedgerClient = self._run(self._make(addresses, group, kwargs))

    async def _make(self, addresses, group, kwargs) -> AsyncDLedgerClient:
        return AsyncDLedgerClient(addresses, group, **kwargs)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def leader(self) -> str | None:
        return self._client.leader

    def append(self, body: bytes) -> AppendResult:
        return self._run(self._client.append(body))

    def append_batch(self, bodies: Sequence[bytes]) -> list[AppendResult]:
        return self._run(self._client.append_batch(bodies))

    def get(self, index: int, address: str | None = None) -> GetResult:
        return self._run(self._client.get(index, address))

    def metadata(self, address: str | None = None) -> NodeInfo:
        return self._run(self._client.metadata(address))

    def find_leader(self) -> NodeInfo:
        return self._run(self._client.find_leader())

    def transfer_leadership(self, target: str) -> str:
        return self._run(self._client.transfer_leadership(target))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> DLedgerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
