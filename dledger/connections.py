"""A client's channels to a group's nodes and the loop every call to them runs: one channel per address, opened
on first use and shared by every stub of every service on it, and the retries of ``dledger/routing.py`` (follow
not-leader hints, back off, give up at the deadline) around a unary call or a ``BatchStream`` submit.

The log's clients (``dledger/client.py``), the KV store's, the broker's (``broker_adapter/client.py``, its
producer sessions in ``broker_adapter/producing.py``) and the user tools use these, blocking (``Channels``) or
asyncio (``AsyncChannels``), so a retry or redirect rule is written here once, and the policy itself once, without
I/O, in ``routing.Attempts``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc

from dledger.batch_stream import BatchStream
from dledger.errors import DLedgerError, OutcomeUnknownError
from dledger.routing import Attempts
from dledger.security.tls import sync_channel
from dledger.transport import convert
from dledger.transport.grpc import CHANNEL_OPTIONS, open_channel

C = TypeVar("C", grpc.Channel, grpc.aio.Channel)
S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

MIN_RPC_TIMEOUT_S = 0.001
# After closing its channels an asyncio client lets its loop run this long: ``grpc.aio``'s ``Channel.close()``
# cancels the calls still open (a producer's session) without waiting for their completions, which reach the
# loop through gRPC's poller thread. If that loop is closed first (``asyncio.run`` returning), the next loop that
# uses gRPC in the process is handed them and prints "Exception in callback PollerCompletionQueue._handle_events
# ... Event loop is closed". 1 ms was enough in every reproduction (tests/broker/test_client_async.py).
CLOSE_SETTLE_S = 0.005


def rpc_timeout(attempts: Attempts, rpc_timeout_s: float) -> float:
    """One try's gRPC deadline: ``rpc_timeout_s``, or what is left of the operation's budget if that is less."""
    return max(MIN_RPC_TIMEOUT_S, min(rpc_timeout_s, attempts.remaining()))


class _ChannelCache(Generic[C]):
    """address -> channel, and (address, stub type) -> stub on it; thread-safe."""

    def __init__(self, open_: Callable[[str], C]):
        self._open: Callable[[str], C] = open_
        self._lock = threading.Lock()
        self._channels: dict[str, C] = {}
        self._stubs: dict[tuple[str, object], Any] = {}

    def channel(self, address: str) -> C:
        ch = self._channels.get(address)
        if ch is None:
            with self._lock:
                ch = self._channels.get(address)
                if ch is None:
                    ch = self._channels[address] = self._open(address)
        return ch

    def stub(self, address: str, stub_type: Callable[[C], S]) -> S:
        """A ``stub_type`` (a generated ``...Stub`` class) on the channel to ``address``, made once."""
        key = (address, stub_type)
        s: S | None = self._stubs.get(key)
        if s is None:
            s = self._stubs[key] = stub_type(self.channel(address))
        return s

    def _take(self) -> list[C]:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        return channels


class Channels(_ChannelCache[grpc.Channel]):
    """Blocking channels (TLS with ``credentials``, else plaintext); safe to share between threads."""

    def __init__(self, credentials: grpc.ChannelCredentials | None):
        super().__init__(lambda address: sync_channel(address, credentials, CHANNEL_OPTIONS))

    def call(
        self,
        attempts: Attempts,
        fn: Callable[[str, float], T],
        *,
        write: bool,
        rpc_timeout_s: float,
        remember_leader: bool = True,
    ) -> T:
        """``fn(address, deadline_s)`` (a call on that node) until it answers or ``attempts`` gives up; a gRPC error
        becomes the ``DLedgerError`` it stands for (a ``write`` that may have reached the node: outcome unknown).
        ``remember_leader``: the node that answered is the leader of the moment (not after a read that any node
        answers)."""
        while True:
            target = attempts.target()
            try:
                result = fn(target, rpc_timeout(attempts, rpc_timeout_s))
            except grpc.RpcError as e:
                time.sleep(attempts.failed(convert.error_from_rpc(e, target, write=write), target))
                continue
            if remember_leader:
                attempts.succeeded(target)
            return result

    def close(self) -> None:
        for ch in self._take():
            ch.close()


class AsyncChannels(_ChannelCache[grpc.aio.Channel]):
    """asyncio channels of one event loop (an ``aio`` channel belongs to the loop that made it)."""

    def __init__(self, credentials: grpc.ChannelCredentials | None):
        super().__init__(lambda address: open_channel(address, credentials=credentials))

    async def call(
        self,
        attempts: Attempts,
        fn: Callable[[str, float], Awaitable[T]],
        *,
        write: bool,
        rpc_timeout_s: float,
        remember_leader: bool = True,
    ) -> T:
        """As ``Channels.call``."""
        while True:
            target = attempts.target()
            try:
                result = await fn(target, rpc_timeout(attempts, rpc_timeout_s))
            except grpc.aio.AioRpcError as e:
                await asyncio.sleep(attempts.failed(convert.error_from_rpc(e, target, write=write), target))
                continue
            if remember_leader:
                attempts.succeeded(target)
            return result

    async def close(self) -> None:
        channels = self._take()
        for ch in channels:
            await ch.close()
        if channels:
            await asyncio.sleep(CLOSE_SETTLE_S)  # the completions of what the close cancelled arrive here


class Streams(Generic[T, R]):
    """One ``BatchStream`` per node, opened on first use and again after it broke, and the retry loop of a
    submit: the log's ``AppendStream`` and a plugin's streams built the same way (a broker's producer session)."""

    def __init__(self, open_stream: Callable[[str], BatchStream[T, R]]):
        self._open = open_stream
        self._streams: dict[str, BatchStream[T, R]] = {}

    async def stream(self, address: str) -> BatchStream[T, R]:
        s = self._streams.get(address)
        if s is None or s.broken is not None:
            if s is not None:
                await s.close()
            s = self._streams[address] = self._open(address)
        return s

    async def submit(self, attempts: Attempts, items: list[T], answer_within_s: float) -> Sequence[R]:
        """``items`` on the stream to the leader, as one batch, until it is answered or ``attempts`` gives up.
        No answer within ``answer_within_s`` (or what is left of the budget) is an unknown outcome: retried only
        if ``attempts`` allows it (the items carry what makes a second copy harmless, as a producer's sequence
        numbers do)."""
        while True:
            address = attempts.target()
            wait_s = rpc_timeout(attempts, answer_within_s)
            try:
                results = await (await self.stream(address)).submit(items, wait_s)
            except TimeoutError:
                why = OutcomeUnknownError(
                    f"no answer from {address} within {wait_s:.3g} s: the request may or may not have been "
                    "carried out"
                )
                await asyncio.sleep(attempts.failed(why, address))
                continue
            except DLedgerError as e:
                await asyncio.sleep(attempts.failed(e, address))
                continue
            attempts.succeeded(address)
            return results

    async def close(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for s in streams:
            await s.close()
