"""The client of the Security service (``dledger user ...``): finds the leader and calls it.

A follower answers FAILED_PRECONDITION with the leader's address in the trailing metadata (``convert``); the
client goes there, and tries the other nodes while an election is running, until ``timeout_s``
(``dledger/connections.py``, ``dledger/routing.py``: the rules of every client).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from typing import Any

import grpc

from dledger.connections import AsyncChannels
from dledger.routing import Router
from dledger.security.config import ClientSecurity
from dledger.security.service import SERVICE_NAME
from dledger.security.tls import client_credentials
from dledger.transport.grpc import run_sync

RPC_TIMEOUT_S = 5.0


class SecurityClient:
    def __init__(
        self, addresses: Sequence[str], security: ClientSecurity | None = None, timeout_s: float = 10.0
    ):
        self._router = Router(addresses)
        self._channels = AsyncChannels(client_credentials(security))
        self._timeout = timeout_s

    async def call(self, method: str, request: dict[str, Any]) -> Any:
        body = json.dumps(request).encode()

        def once(address: str, timeout_s: float) -> Awaitable[bytes]:
            send: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channels.channel(
                address
            ).unary_unary(f"/{SERVICE_NAME}/{method}")
            return send(body, timeout=timeout_s)

        attempts = self._router.attempts(self._timeout, f"{SERVICE_NAME}/{method}")
        return json.loads(await self._channels.call(attempts, once, write=False, rpc_timeout_s=RPC_TIMEOUT_S))

    async def close(self) -> None:
        await self._channels.close()


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
