"""A linearizable register service for the KV workload (``state_machine = "dledger.chaos.register:make"``).

The built-in KV state machine (``statemachine.kv``) has no read RPC: its linearizable read is an in-process
call (``node.linearizable_read``). This plugin puts that state machine behind two small gRPC methods so that
clients in another process can write and read registers while the nemesis runs:

    /dledger.chaos.Register/Put   request: JSON {"key", "value"}  -> {"index"}   (after the entry is applied)
    /dledger.chaos.Register/Get   request: JSON {"key"}           -> {"value"}   (read index, then local read)

Errors carry the node's usual status codes and trailers (``dledger.transport.convert``): FAILED_PRECONDITION
with the leader's address, UNAVAILABLE with ``refused``/``outcome-unknown``, so ``RegisterClient`` can tell a
write that was not done from one that may have been.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc

from dledger.errors import (
    DLedgerError,
    InvalidRequestError,
    NotLeaderError,
    OutcomeUnknownError,
    UnavailableError,
)
from dledger.transport import convert
from statemachine.kv import KVStore, encode_put

SERVICE = "dledger.chaos.Register"
PUT = f"/{SERVICE}/Put"
GET = f"/{SERVICE}/Get"


def _request(raw: bytes) -> dict[str, Any]:
    try:
        req = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"request is not JSON: {e}") from None
    if not isinstance(req, dict) or not isinstance(req.get("key"), str) or not req["key"]:
        raise InvalidRequestError('request must be a JSON object with a non-empty string "key"')
    return req


class RegisterPlugin:
    def __init__(self, config: Any):
        self.state_machine = KVStore()
        self._node: Any = None

    def attach(self, node: Any, server: grpc.aio.Server) -> Sequence[str]:
        self._node = node
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Put": grpc.unary_unary_rpc_method_handler(self._put),
                "Get": grpc.unary_unary_rpc_method_handler(self._get),
            },
        )
        server.add_generic_rpc_handlers((handler,))
        return (SERVICE,)

    async def _abort(self, context: grpc.aio.ServicerContext, err: DLedgerError) -> None:
        addr = (
            self._node.address_of(err.leader_hint)
            if isinstance(err, NotLeaderError) and err.leader_hint
            else None
        )
        context.set_trailing_metadata(convert.error_metadata(err, addr))
        await context.abort(convert.status_code(err), str(err))

    async def _put(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            req = _request(raw)
            value = req.get("value")
            if not isinstance(value, str):
                raise InvalidRequestError('a put needs a string "value"')
            outcomes = await self._node.submit([encode_put(req["key"].encode(), value.encode())])
            if isinstance(outcomes[0], BaseException):
                raise InvalidRequestError(f"the state machine rejected the put: {outcomes[0]}")
            return json.dumps({"index": outcomes[0].index}).encode()
        except DLedgerError as e:
            await self._abort(context, e)
            raise AssertionError("unreachable: abort raises") from e

    async def _get(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            key = _request(raw)["key"].encode()
            value = await self._node.linearizable_read(lambda kv: kv.get(key))
            return json.dumps({"value": None if value is None else bytes(value).decode()}).encode()
        except DLedgerError as e:
            await self._abort(context, e)
            raise AssertionError("unreachable: abort raises") from e


def make(config: Any) -> RegisterPlugin:
    return RegisterPlugin(config)


class RegisterClient:
    """A synchronous client of the register service that follows the leader; one call = one attempt set."""

    def __init__(self, servers: Sequence[str], timeout_s: float = 1.0):
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._leader: str | None = None
        self._rr = 0

    def _call(self, method: str, address: str, payload: dict[str, Any]) -> dict[str, Any]:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.insecure_channel(address)
        try:
            raw = ch.unary_unary(method)(json.dumps(payload).encode(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            md = dict(e.trailing_metadata() or ())
            code = e.code()
            details = e.details() or ""
            if code == grpc.StatusCode.UNAVAILABLE and details.startswith("failed to connect"):
                # no connection was ever made: the request was not sent, so nothing was done
                raise UnavailableError(f"{address}: {details}") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                code == grpc.StatusCode.UNAVAILABLE
                and convert.REFUSED_KEY not in md
                and convert.OUTCOME_UNKNOWN_KEY not in md
            ):
                raise OutcomeUnknownError(f"{code.name}: {e.details()}") from None
            raise convert.error_from_status(code, e.details() or "", md) from None
        return json.loads(raw)

    def call(self, method: str, payload: dict[str, Any], redirects: int = 2) -> dict[str, Any]:
        """Send to the known leader (or the next server); follow up to ``redirects`` not-leader hints. Errors
        propagate: NotLeaderError / UnavailableError (not done), OutcomeUnknownError (may have been done)."""
        if self._leader is None:
            self._leader = self.servers[self._rr % len(self.servers)]
            self._rr += 1
        target = self._leader
        for _ in range(redirects + 1):
            try:
                return self._call(method, target, payload)
            except NotLeaderError as e:
                hint = e.leader_hint
                if not hint or ":" not in hint or hint == target:
                    self._leader = None
                    raise
                target = self._leader = hint
            except DLedgerError:
                self._leader = None
                raise
        raise NotLeaderError(None, f"still not the leader after {redirects} redirects")

    def put(self, key: str, value: str) -> int:
        return int(self.call(PUT, {"key": key, "value": value})["index"])

    def get(self, key: str) -> str | None:
        return self.call(GET, {"key": key})["value"]

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
