"""The Security service: add, remove, grant and revoke users through the log, and list them (never a secret).

A small JSON-over-gRPC service (``dledger.v1.Security``, methods below; request and answer are UTF-8 JSON
objects) registered as a generic handler: it needs no generated code and every call goes through the same
interceptor as the rest (``guard``: admin only). Changes are proposed on the leader and answered once applied;
a follower answers FAILED_PRECONDITION with the leader's address in the trailing metadata, as every other
service does (docs/runtime.md, "Errors"), and ``SecurityClient`` follows it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from dledger.errors import DLedgerError, InvalidRequestError, NotLeaderError
from dledger.security import users as u
from dledger.transport.grpc import abort_rpc

SERVICE_NAME: Final = "dledger.v1.Security"
_SECRET_RE: Final = re.compile(r"^[\x21-\x7e]{8,256}$")


def _request(raw: bytes) -> dict[str, Any]:
    try:
        req = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"{SERVICE_NAME}: the request is not a JSON object ({e})") from None
    if not isinstance(req, dict):
        raise InvalidRequestError(f"{SERVICE_NAME}: the request is not a JSON object")
    ak = req.get("access_key")
    if "access_key" in req and (not isinstance(ak, str) or not u.ACCESS_KEY_RE.match(ak)):
        raise InvalidRequestError(f"access_key {ak!r} is invalid: 1-64 letters, digits, '_', '.', '@', '-'")
    return req


class CommandSigner:
    """This node's certificate and the prepare that signs its user commands at their index (``users``)."""

    def __init__(self, group: str, cert_pem: bytes, key_pem: bytes):
        self.cert_der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
        self.prepare = u.signer(group, key_pem)


class SecurityServicer:
    def __init__(self, node: Any, store: u.UserStore, bootstrap_admin: str, signer: CommandSigner):
        self._node = node
        self._store = store
        self._admin = bootstrap_admin
        self._signer = signer

    async def _propose(self, op: int, payload: dict[str, Any]) -> Any:
        if not self._node.is_leader():
            raise NotLeaderError(self._node.leader_id)
        body = u.encode(op, payload, self._signer.cert_der)
        outcome = (await self._node.submit([body], self._signer.prepare))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome.result, u.UserError):
            raise InvalidRequestError(str(outcome.result))
        return outcome.result

    async def add(self, req: dict[str, Any]) -> Any:
        sk = req.get("secret_key")
        if not isinstance(sk, str) or not _SECRET_RE.match(sk):
            raise InvalidRequestError("secret_key must be 8-256 printable characters without spaces")
        if req["access_key"] == self._admin:
            raise InvalidRequestError(f"{self._admin!r} is the bootstrap admin from the nodes' config")
        perms = [u.parse_permission(p) for p in req.get("permissions", [])]
        return await self._propose(
            u.OP_ADD, {"access_key": req["access_key"], "secret_key": sk, "permissions": perms}
        )

    async def remove(self, req: dict[str, Any]) -> Any:
        return await self._propose(u.OP_REMOVE, {"access_key": req.get("access_key", "")})

    async def grant(self, req: dict[str, Any]) -> Any:
        perm = u.parse_permission(str(req.get("permission", "")))
        return await self._propose(u.OP_GRANT, {"access_key": req.get("access_key", ""), "permission": perm})

    async def revoke(self, req: dict[str, Any]) -> Any:
        perm = u.parse_permission(str(req.get("permission", "")))
        return await self._propose(u.OP_REVOKE, {"access_key": req.get("access_key", ""), "permission": perm})

    async def list(self, req: dict[str, Any]) -> Any:
        if not self._node.is_leader():  # the leader's view includes every acknowledged change
            raise NotLeaderError(self._node.leader_id)
        return {
            "users": [x.public() for _, x in sorted(self._store.users.items())],
            "bootstrap_admin": self._admin,
        }


def _method(node: Any, fn: Callable) -> Callable:
    async def call(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return json.dumps(await fn(_request(raw))).encode()
        except u.UserError as e:
            await abort_rpc(context, InvalidRequestError(str(e)), node.address_of)
        except DLedgerError as e:
            await abort_rpc(context, e, node.address_of)

    return call


def attach(
    node: Any, server: grpc.aio.Server, store: u.UserStore, bootstrap_admin: str, signer: CommandSigner
) -> tuple[str, ...]:
    s = SecurityServicer(node, store, bootstrap_admin, signer)
    table = {
        "AddUser": s.add,
        "RemoveUser": s.remove,
        "Grant": s.grant,
        "Revoke": s.revoke,
        "ListUsers": s.list,
    }
    handlers = {name: grpc.unary_unary_rpc_method_handler(_method(node, fn)) for name, fn in table.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    return (SERVICE_NAME,)
