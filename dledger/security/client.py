"""The client of the Security service (``dledger user ...``): finds the leader and calls it.

A follower answers FAILED_PRECONDITION with the leader's address in the trailing metadata (``convert``); the
client goes there, and polls the other nodes while an election is running, until ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import grpc

from dledger.errors import DLedgerError, NotLeaderError, UnavailableError
from dledger.security.config import ClientSecurity
from dledger.security.service import SERVICE_NAME
from dledger.security.tls import client_credentials
from dledger.transport import convert
from dledger.transport.grpc import open_channel, run_sync


class SecurityClient:
    def __init__(
        self, addresses: Sequence[str], security: ClientSecurity | None = None, timeout_s: float = 10.0
    ):
        self._addresses = list(addresses)
        self._credentials = client_credentials(security)
        self._timeout = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def call(self, method: str, request: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        body = json.dumps(request).encode()
        order = list(self._addresses)
        last: DLedgerError | None = None
        while loop.time() < deadline:
            address = order[0]
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = open_channel(address, credentials=self._credentials)
            try:
                send: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
                    f"/{SERVICE_NAME}/{method}"
                )
                raw = await send(body, timeout=max(0.1, min(5.0, deadline - loop.time())))
                return json.loads(raw)
            except grpc.aio.AioRpcError as e:
                err = convert.error_from_rpc(e, address, write=False)
                if not getattr(err, "retriable", False):
                    raise err from None
                last = err
                md = {k: v for k, v in (e.trailing_metadata() or ()) if isinstance(v, str)}
                hint = md.get(convert.LEADER_ADDRESS_KEY)
                order.remove(address)
                order.append(address)
                if isinstance(err, NotLeaderError) and hint and hint != address:
                    if hint in order:
                        order.remove(hint)
                    order.insert(0, hint)
                else:
                    await asyncio.sleep(0.05)
        raise UnavailableError(f"no leader answered {SERVICE_NAME}/{method} within {self._timeout} s: {last}")

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


def call_once(
    addresses: Sequence[str], method: str, request: dict[str, Any], security: ClientSecurity | None = None
) -> Any:
    """One Security call from blocking code (the CLI, scripts, tests): a client opened and closed for it."""

    async def run() -> Any:
        client = SecurityClient(addresses, security)
        try:
            return await client.call(method, request)
        finally:
            await client.close()

    return run_sync(run())
