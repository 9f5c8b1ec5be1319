"""The Security service: add, remove, grant and revoke users through the log, and list them (never a secret).

A small JSON-over-gRPC service (``dledger.v1.Security``, methods below; request and answer are UTF-8 JSON
objects) registered as a generic handler: it needs no generated code and every call goes through the same
interceptor as the rest (``guard``: admin only). Changes are proposed on the leader and answered once applied
there and on every other member that confirms within a bound (``catchup``; the answer's ``unconfirmed`` names
those that did not); a follower answers FAILED_PRECONDITION with the leader's address in the trailing metadata,
as every other service does (docs/runtime.md, "Errors"), and ``SecurityClient`` follows it.

Two methods are for the nodes themselves (``catchup``, signed as the bootstrap admin): ``ReadIndex`` (the
leader's linearizable read point, which a follower waits for before refusing a user) and ``WaitApplied``
(``{"index": i}``: answers once this node has applied ``i``, or ``{"applied": false}`` after the bound).
``ReloadCertificates`` (admin) makes the node it is sent to read its certificate, key and CA bundle again
(``dledger cert reload``, docs/security.md "Rotating certificates"); a node without replicated users serves it
alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from dledger.errors import ConfigError, DLedgerError, InvalidRequestError, NotLeaderError
from dledger.plugins import NodeHandle
from dledger.security import users as u
from dledger.security.identity import node_identity
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
        self._group = group
        self.update(cert_pem, key_pem)

    def update(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Sign with this certificate and key from the next command on (a reload: ``rotation``)."""
        self.cert_der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
        self.prepare = u.signer(self._group, key_pem)


class SecurityServicer:
    def __init__(
        self, node: Any, store: u.UserStore, bootstrap_admin: str, signer: CommandSigner, catch_up: Any
    ):
        self._node = node
        self._store = store
        self._admin = bootstrap_admin
        self._signer = signer
        self._catch_up = catch_up

    async def _propose(self, op: int, payload: dict[str, Any]) -> Any:
        if not self._node.is_leader():
            raise NotLeaderError(self._node.leader_id)
        body = u.encode(op, payload, self._signer.cert_der)
        outcome = (await self._node.submit([body], self._signer.prepare))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome.result, u.UserError):
            raise InvalidRequestError(str(outcome.result))
        # Read-your-writes on every node: answer once the other members applied it too (or the bound passed).
        unconfirmed = await self._catch_up.confirm(outcome.index)
        return {**outcome.result, "unconfirmed": unconfirmed}

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

    async def revoke_certificate(self, req: dict[str, Any]) -> Any:
        """Add a node certificate to the revocation list (through the log): no member accepts its peer proof from
        the moment the entry is in its log. The request names it by ``certificate`` (PEM) or ``fingerprint``."""
        pem, fp, node = req.get("certificate"), req.get("fingerprint"), ""
        if isinstance(pem, str) and pem:
            try:
                cert = x509.load_pem_x509_certificate(pem.encode())
            except ValueError as e:
                raise InvalidRequestError(f"certificate: not a PEM certificate ({e})") from None
            fp, node = u.fingerprint(cert.public_bytes(serialization.Encoding.DER)), node_identity(cert) or ""
        if not isinstance(fp, str) or not fp:
            raise InvalidRequestError("give the certificate to revoke (PEM) or its SHA-256 fingerprint (hex)")
        return await self._propose(u.OP_REVOKE_CERT, {"fingerprint": fp.lower(), "node": node})

    async def read_index(self, req: dict[str, Any]) -> Any:
        return {"index": await self._node.read_index()}  # NotLeaderError on a follower: the caller retries

    async def wait_applied(self, req: dict[str, Any]) -> Any:
        index = req.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InvalidRequestError(f"index must be a non-negative integer, got {index!r}")
        return {"applied": await self._catch_up.wait_applied(index)}

    async def list(self, req: dict[str, Any]) -> u.UserListing:
        if not self._node.is_leader():  # the leader's view includes every acknowledged change
            raise NotLeaderError(self._node.leader_id)
        return {
            "users": [x.public() for _, x in sorted(self._store.users.items())],
            "bootstrap_admin": self._admin,
            "revoked_certificates": [
                {"fingerprint": fp, "node": n} for fp, n in sorted(self._store.revoked_certs.items())
            ],
        }


# A method of the JSON service: the request's JSON object -> the answer's JSON value.
JsonMethod = Callable[[dict[str, Any]], Awaitable[Any]]
# Its gRPC behaviour: the request's bytes -> the answer's bytes (the service has no protobuf messages).
BytesBehavior = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]


def _method(node: NodeHandle, fn: JsonMethod) -> BytesBehavior:
    async def call(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            return json.dumps(await fn(_request(raw))).encode()
        except u.UserError as e:
            await abort_rpc(context, InvalidRequestError(str(e)), node.address_of)
        except DLedgerError as e:
            await abort_rpc(context, e, node.address_of)

    return call


RELOAD: Final = "ReloadCertificates"


def _reload(node: Any) -> JsonMethod:
    async def reload(req: dict[str, Any]) -> Any:
        """This node reads its certificate, key and CA bundle again (never the leader's business: each node
        answers for itself). Files that cannot serve are INVALID_ARGUMENT naming the file; the old stay."""
        try:
            return node.reload_certificates()
        except ConfigError as e:
            raise InvalidRequestError(f"{node.id}: {e}") from None

    return reload


def _serve(node: Any, server: grpc.aio.Server, table: dict[str, JsonMethod]) -> tuple[str, ...]:
    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        name: grpc.unary_unary_rpc_method_handler(_method(node, fn)) for name, fn in table.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    return (SERVICE_NAME,)


def attach_reload(node: Any, server: grpc.aio.Server) -> tuple[str, ...]:
    """The Security service of a node without replicated users: only ``ReloadCertificates`` (admin)."""
    return _serve(node, server, {RELOAD: _reload(node)})


def attach(
    node: Any,
    server: grpc.aio.Server,
    store: u.UserStore,
    bootstrap_admin: str,
    signer: CommandSigner,
    catch_up: Any,
) -> tuple[str, ...]:
    s = SecurityServicer(node, store, bootstrap_admin, signer, catch_up)
    table = {
        "AddUser": s.add,
        "RemoveUser": s.remove,
        "Grant": s.grant,
        "Revoke": s.revoke,
        "RevokeCertificate": s.revoke_certificate,
        "ListUsers": s.list,
        "ReadIndex": s.read_index,
        "WaitApplied": s.wait_applied,
        RELOAD: _reload(node),
    }
    return _serve(node, server, table)
