"""Clients for a dledger group: ``AsyncDLedgerClient`` (asyncio) and ``DLedgerClient`` (blocking).

Give either any subset of the group's addresses. The client finds the leader (asking nodes for metadata and
following not-leader hints), retries what is safe to retry with bounded exponential backoff inside an overall
deadline (``dledger.routing``, shared with the broker and KV clients), and reports outcomes honestly:

- an append that a node rejected before proposing it (not leader, no leader yet, backpressure, node starting or
  stopping, connection refused) is retried, because it certainly did not happen;
- an append that was handed to a leader which then failed or lost leadership before answering may or may not
  have committed: it raises ``OutcomeUnknownError`` and is *not* retried (appends are not idempotent);
- everything else raises the ``DLedgerError`` the node reported (``InvalidRequestError``, ``NotFoundError``...).

Concurrent appends from one ``AsyncDLedgerClient`` share one bidirectional ``AppendStream`` per node; appends
queued while a message is being written are packed into the next stream message (each caller still gets only
its own results). One gRPC call per entry would cap throughput at a few thousand entries/s on a small machine;
this way many concurrent callers cost about one message per leader round trip.

``DLedgerClient`` is thread-safe: use one per process, shared by its threads. It runs on gRPC's blocking stubs
(they wait without holding the GIL), and appends from concurrent threads are packed into shared calls
(``dledger.combiner``), so it scales with threads the way the async client scales with tasks.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dledger.batch_stream import Answer, BatchStream
from dledger.combiner import Combiner
from dledger.connections import AsyncChannels, Channels, Streams
from dledger.errors import DLedgerError, UnavailableError
from dledger.routing import DEFAULT_BACKOFF_S, Router
from dledger.security.config import ClientSecurity
from dledger.security.tls import client_credentials
from dledger.transport import convert
from dledger.transport.base import AppendedRun, AppendResult, NodeInfo, PeerInfo
from dledger.v1 import client_pb2, client_pb2_grpc

__all__ = ["AppendResult", "AsyncDLedgerClient", "DLedgerClient", "GetResult", "NodeInfo"]


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
        peers=tuple(PeerInfo(x.id, x.address, x.match_index, x.member) for x in p.peers),
        data_dir=p.data_dir,
        pid=p.pid,
        flush=p.flush,
        voters=tuple(p.voters),
        learners=tuple(p.learners),
        conf_index=p.conf_index,
    )


def _append_request(group: str) -> Callable[[int, list[bytes]], client_pb2.AppendRequest]:
    return lambda rid, bodies: client_pb2.AppendRequest(group=group, bodies=bodies, request_id=rid)


def _append_answer(resp: client_pb2.AppendResponse) -> Answer[AppendResult]:
    if resp.HasField("error"):
        return resp.request_id, convert.append_error_from_pb(resp.error), ()
    return resp.request_id, None, AppendedRun(resp.first_index, resp.term, tuple(resp.pos)).results()


class AsyncDLedgerClient:
    """asyncio client. ``timeout_s`` bounds each operation including its retries."""

    def __init__(
        self,
        addresses: Sequence[str],
        group: str = "",
        *,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 5.0,
        backoff_s: tuple[float, float] = DEFAULT_BACKOFF_S,
        use_stream: bool = True,
        max_pack: int = 1000,
        rng: random.Random | None = None,
        security: ClientSecurity | None = None,
    ):
        """``security``: CA and access keys of a secure group (default: from the environment, docs/security.md)."""
        self._router = Router(addresses, backoff_s=backoff_s, rng=rng)
        self._credentials = client_credentials(security)
        self.group = group
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._use_stream = use_stream
        self._max_pack = max_pack
        self._channels = AsyncChannels(self._credentials)
        self._streams: Streams[bytes, AppendResult] = Streams(
            lambda address: BatchStream(
                self._stub(address).AppendStream(),
                address,
                self._max_pack,
                _append_request(self.group),
                _append_answer,
            )
        )

    @property
    def addresses(self) -> list[str]:
        return self._router.addresses

    @property
    def leader(self) -> str | None:
        return self._router.leader

    @property
    def stats(self) -> dict[str, int]:
        return self._router.stats

    def _stub(self, address: str) -> client_pb2_grpc.DLedgerStub:
        return self._channels.stub(address, client_pb2_grpc.DLedgerStub)

    async def append(self, body: bytes) -> AppendResult:
        return (await self.append_batch([body]))[0]

    async def append_batch(self, bodies: Sequence[bytes]) -> list[AppendResult]:
        """Appended as one batch; not retried once it may have reached a leader (appends are not idempotent)."""
        bodies = [bytes(b) for b in bodies]
        attempts = self._router.attempts(self.timeout_s, "append")
        if self._use_stream:
            return list(await self._streams.submit(attempts, bodies, self.rpc_timeout_s))
        req = client_pb2.AppendRequest(group=self.group, bodies=bodies)
        resp = await self._channels.call(
            attempts,
            lambda address, t: self._stub(address).Append(req, timeout=t),
            write=True,
            rpc_timeout_s=self.rpc_timeout_s,
        )
        return AppendedRun(resp.first_index, resp.term, tuple(resp.pos)).results()

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
        self._router.leader = None
        return p.leader_id

    async def find_leader(self) -> NodeInfo:
        """Ask nodes until one knows the leader; returns the leader's metadata."""
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while time.monotonic() < deadline:
            for address in list(self.addresses):
                try:
                    info = await self.metadata(address)
                    if info.role != "leader" and info.leader_address:
                        address, info = info.leader_address, await self.metadata(info.leader_address)
                except DLedgerError:
                    continue
                if info.role == "leader":
                    self._router.succeeded(address)
                    return info
            await asyncio.sleep(max(0.0, min(self._router.backoff(attempt), deadline - time.monotonic())))
            attempt += 1
        raise UnavailableError(f"no leader found among {', '.join(self.addresses)} within {self.timeout_s} s")

    def stub(self, address: str, stub_type: type) -> Any:
        """A stub of another service served by the nodes (e.g. ``kv_pb2_grpc.KVStub``), on this client's
        channel to ``address``."""
        return self._channels.stub(address, stub_type)

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
        return await self._channels.call(
            self._router.attempts(self.timeout_s, "the request", address=address),
            lambda target, _: fn(self.stub(target, stub_type or client_pb2_grpc.DLedgerStub)),
            write=write,
            rpc_timeout_s=self.rpc_timeout_s,
            remember_leader=leader_only,
        )

    async def close(self) -> None:
        await self._streams.close()
        await self._channels.close()

    async def __aenter__(self) -> AsyncDLedgerClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class DLedgerClient:
    """Blocking client with the behaviour of ``AsyncDLedgerClient``; thread-safe, meant to be shared by every
    thread of a process. Concurrent appends are packed: up to ``max_inflight`` calls are in flight, and what
    threads submit meanwhile goes out together in the next one (at most ``max_pack`` bodies)."""

    def __init__(
        self,
        addresses: Sequence[str],
        group: str = "",
        *,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 5.0,
        backoff_s: tuple[float, float] = DEFAULT_BACKOFF_S,
        max_pack: int = 1000,
        max_inflight: int = 1,
        rng: random.Random | None = None,
        security: ClientSecurity | None = None,
    ):
        self._router = Router(addresses, backoff_s=backoff_s, rng=rng)
        self._credentials = client_credentials(security)
        self.group = group
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._channels = Channels(self._credentials)
        self._appends: Combiner[bytes, AppendResult] = Combiner(
            self._append_now, max_inflight=max_inflight, max_items=max_pack
        )

    @property
    def addresses(self) -> list[str]:
        return self._router.addresses

    @property
    def leader(self) -> str | None:
        return self._router.leader

    @property
    def stats(self) -> dict[str, int]:
        return self._router.stats

    def _stub(self, address: str) -> client_pb2_grpc.DLedgerStub:
        return self._channels.stub(address, client_pb2_grpc.DLedgerStub)

    def append(self, body: bytes) -> AppendResult:
        return self._appends.submit([body if type(body) is bytes else bytes(body)])[0]

    def append_batch(self, bodies: Sequence[bytes]) -> list[AppendResult]:
        return self._appends.submit([b if type(b) is bytes else bytes(b) for b in bodies])

    def _append_now(self, bodies: list[bytes]) -> list[AppendResult]:
        req = client_pb2.AppendRequest(group=self.group, bodies=bodies)
        resp = self._call(lambda s, t: s.Append(req, timeout=t), None, write=True, leader_only=True)
        return AppendedRun(resp.first_index, resp.term, tuple(resp.pos)).results()

    def get(self, index: int, address: str | None = None) -> GetResult:
        """Read a committed entry (from ``address``, else the leader or any node)."""
        req = client_pb2.GetRequest(group=self.group, index=index)
        p = self._call(lambda s, t: s.Get(req, timeout=t), address)
        return GetResult(p.index, p.term, p.pos, p.magic, p.body)

    def metadata(self, address: str | None = None) -> NodeInfo:
        req = client_pb2.MetadataRequest(group=self.group)
        return _info_from_pb(self._call(lambda s, t: s.Metadata(req, timeout=t), address))

    def change_membership(
        self, kind: str, node_id: str, address: str = ""
    ) -> client_pb2.ChangeMembershipResponse:
        """One membership change on the leader ("add-learner", "add-voter", "promote", "remove"); returns once
        the config entry committed (index, term, voters, learners). Not retried: a change whose answer was lost
        shows in ``metadata().voters``/``learners``."""
        req = client_pb2.ChangeMembershipRequest(
            group=self.group, kind=kind, node_id=node_id, address=address
        )
        return self._call(
            lambda s, t: s.ChangeMembership(req, timeout=self.timeout_s), None, write=True, leader_only=True
        )

    def transfer_leadership(self, target: str) -> str:
        req = client_pb2.TransferLeadershipRequest(group=self.group, target=target)
        p = self._call(lambda s, t: s.TransferLeadership(req, timeout=self.timeout_s), None, leader_only=True)
        self._router.leader = None
        return p.leader_id

    def find_leader(self) -> NodeInfo:
        """Ask nodes until one knows the leader; returns the leader's metadata."""
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while time.monotonic() < deadline:
            for address in list(self.addresses):
                try:
                    info = self.metadata(address)
                    if info.role != "leader" and info.leader_address:
                        address, info = info.leader_address, self.metadata(info.leader_address)
                except DLedgerError:
                    continue
                if info.role == "leader":
                    self._router.succeeded(address)
                    return info
            time.sleep(max(0.0, min(self._router.backoff(attempt), deadline - time.monotonic())))
            attempt += 1
        raise UnavailableError(f"no leader found among {', '.join(self.addresses)} within {self.timeout_s} s")

    def _call(
        self,
        fn: Callable[[client_pb2_grpc.DLedgerStub, float], Any],
        address: str | None,
        *,
        write: bool = False,
        leader_only: bool = False,
    ):
        return self._channels.call(
            self._router.attempts(self.timeout_s, "append" if write else "the request", address=address),
            lambda target, t: fn(self._stub(target), t),
            write=write,
            rpc_timeout_s=self.rpc_timeout_s,
            remember_leader=leader_only,
        )

    def close(self) -> None:
        self._channels.close()

    def __enter__(self) -> DLedgerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
