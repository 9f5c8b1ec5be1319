"""Who may ask a secure name server what: TLS, broker nodes that prove their identity, and signed clients.

A name server has no log, so it cannot know the users a group replicates (docs/decisions/0014-name-server-trust.md).
It trusts what its own configuration gives it, and checks both kinds of caller with dledger/security's code:

- ``RegisterBroker`` / ``UnregisterBroker``: only a broker node proving its identity the way peers do
  (``tls.NodeProofVerifier``: a certificate from the cluster's CA that names the node and its group, and a fresh
  signature with its key), and only for itself: the registration's group and node id must be the certificate's.
  No proof, or a bad one: UNAUTHENTICATED; a valid node speaking for another: PERMISSION_DENIED.
- ``QueryRoute``: a proven node or a signed client (``auth.verify``, RocketMQ's HMAC signature) whose access
  key is the bootstrap admin or in the name server's users file.
- ``ClusterInfo`` (every node, every consumer group's members): a proven node (the registrar reads the cluster)
  or the bootstrap admin (``cluster status``).
- ``dledger.v1.Security/ReloadCertificates`` (``dledger cert reload --addresses NS``): the bootstrap admin.
- ``ConsumerHeartbeat``, ``ListConsumers``, ``UnregisterConsumer``: a signed client, as for ``QueryRoute``, for
  a consumer group its users-file entry lists in ``consumer_groups`` (``"*"``: any), or the bootstrap admin; a
  user may not join, read or leave another group's membership (it would be given queues it cannot read).

Every refusal is logged (logger ``dledger.security``, WARNING) with who asked and why, never a secret, and
answered before the servicer runs, so a refused registration never reaches the registry.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from dledger.errors import ConfigError
from dledger.security import auth, tls
from dledger.security.config import read_credentials

log = logging.getLogger("dledger.security")

SERVICE: Final = "dledger.v1.NameServer"
NODE_ONLY: Final = frozenset({"RegisterBroker", "UnregisterBroker"})
NODE_OR_CLIENT: Final = frozenset({"QueryRoute", "ClusterInfo"})
CLIENT_ONLY: Final = frozenset({"ConsumerHeartbeat", "ListConsumers", "UnregisterConsumer"})
# The certificate reload a node serves too (``dledger cert reload``), same service and method: bootstrap admin only.
RELOAD: Final = ("dledger.v1.Security", "ReloadCertificates")


def _user_tables(path: Path) -> list[dict[str, Any]]:
    """The ``[[user]]`` tables of a users file, each checked: access_key and secret_key (strings), and
    consumer_groups (a list of strings) if given."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"users file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"users file {path} is not valid TOML: {e}") from None
    tables = raw.get("user", [])
    for i, u in enumerate(tables):
        ak, sk = (u.get("access_key"), u.get("secret_key")) if isinstance(u, dict) else (None, None)
        if not isinstance(ak, str) or not ak or not isinstance(sk, str) or not sk:
            raise ConfigError(
                f"users file {path}: [[user]] #{i + 1} needs access_key and secret_key (strings)"
            )
        groups = u.get("consumer_groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise ConfigError(
                f"users file {path}: [[user]] #{i + 1} ({ak}): consumer_groups must be a list of group names "
                '(or ["*"] for any)'
            )
    return tables


def read_users(path: Path) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    """From a users file (``[[user]]`` tables with ``access_key``, ``secret_key`` and ``consumer_groups``), read
    once so both come from the same version of it: access key -> secret key, and access key -> the consumer
    groups that user may join (none when absent)."""
    tables = _user_tables(path)
    secrets = {u["access_key"]: u["secret_key"] for u in tables}
    return secrets, {u["access_key"]: frozenset(u.get("consumer_groups", ())) for u in tables}


@dataclass(frozen=True, slots=True)
class NameServerSecurity:
    """A secure name server's files: its certificate and key, the cluster's CA (brokers' certificates must chain
    to it), the bootstrap admin's keys, and optionally more readers (``users``)."""

    cert: Path
    key: Path
    ca: Path
    admin: Path
    users: Path | None = None
    skew_s: int = auth.DEFAULT_SKEW_S

    def load(self) -> tuple[bytes, bytes, bytes, dict[str, str], str, dict[str, frozenset[str]]]:
        """(cert, key, ca) PEM bytes and ``read_users``'s three; ConfigError naming a missing or bad file."""
        pems = []
        for path, what in ((self.cert, "--cert"), (self.key, "--key"), (self.ca, "--ca")):
            try:
                pems.append(Path(path).read_bytes())
            except OSError as e:
                raise ConfigError(f"name server {what} {path}: {e.strerror or e}") from None
        return pems[0], pems[1], pems[2], *self.read_users()

    def read_users(self) -> tuple[dict[str, str], str, dict[str, frozenset[str]]]:
        """Every access key it accepts with its secret, the admin's access key, and the consumer groups each
        user may join (the admin: every group): from the admin file and the users file, each read once, now
        (at start, and at each reload); ConfigError naming a missing or bad file."""
        ak, sk = read_credentials(Path(self.admin))
        users, groups = read_users(Path(self.users)) if self.users else ({}, {})
        return {**users, ak: sk}, ak, groups


def _method(full: str) -> tuple[str, str]:
    service, _, method = full.lstrip("/").partition("/")
    return service, method


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, why: str) -> grpc.RpcMethodHandler:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, why)

    return grpc.unary_unary_rpc_method_handler(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _checked(handler: grpc.RpcMethodHandler, refusal: Callable[[Any], str | None]) -> grpc.RpcMethodHandler:
    """The servicer runs only for a request ``refusal`` has no objection to (else PERMISSION_DENIED, logged)."""
    inner = handler.unary_unary

    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        why = refusal(request)
        if why is not None:
            log.warning("name server: refused %s", why)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(
        checked,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _only_itself(handler: grpc.RpcMethodHandler, method: str, group: str, node: str) -> grpc.RpcMethodHandler:
    """The servicer runs only when the request's group and node id are those the caller proved."""

    def refusal(request: Any) -> str | None:
        if (request.group, request.node_id) == (group, node):
            return None
        return (
            f"node {group}/{node} may not {method} {request.group}/{request.node_id}: a node registers "
            "only itself (its certificate names its group and node id)"
        )

    return _checked(handler, refusal)


def _in_group(
    handler: grpc.RpcMethodHandler, method: str, access_key: str, groups: frozenset[str]
) -> grpc.RpcMethodHandler:
    """The servicer runs only for a consumer group the user may join."""

    def refusal(request: Any) -> str | None:
        if request.group in groups or "*" in groups:
            return None
        return (
            f"user {access_key!r} may not {method} for consumer group {request.group!r}: add the group to "
            "the user's consumer_groups in the name server's users file"
        )

    return _checked(handler, refusal)


def _who(md: tuple) -> str:
    """The caller as its headers name it, for a refusal's log line: a client's access key, or "a caller"."""
    value = next((v for k, v in md if k == auth.AUTHORIZATION and isinstance(v, str)), None)
    if value is None:
        return "a caller with no credentials"
    try:
        return f"client {auth.parse_authorization(value)[0]!r}"
    except auth.AuthenticationError:
        return "a client with a malformed authorization header"


class NameServerGuard(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        ca_pem: bytes,
        secrets: Mapping[str, str],
        admin: str,
        skew_s: int = auth.DEFAULT_SKEW_S,
        consumer_groups: Mapping[str, frozenset[str]] | None = None,
    ):
        """``secrets``: every access key it accepts, with its secret; ``admin``: the one that may read the
        whole cluster (``ClusterInfo``) and join any consumer group; ``consumer_groups``: the groups each other
        access key may join."""
        self._nodes = tls.NodeProofVerifier(ca_pem, skew_s)
        self.set_ca = (
            self._nodes.set_ca
        )  # a reload of the CA bundle (docs/security.md, "Rotating certificates")
        self._skew = skew_s
        self.set_users(secrets, admin, consumer_groups or {})

    def set_users(
        self, secrets: Mapping[str, str], admin: str, consumer_groups: Mapping[str, frozenset[str]]
    ) -> None:
        """The users from the next call on (a reload read the files again: ``NameServerSecurity.read_users``)."""
        self._secrets, self._admin, self._groups = dict(secrets), admin, dict(consumer_groups)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        service, method = _method(details.method)
        md = tuple(details.invocation_metadata or ())
        if handler is None:
            return handler  # unknown methods: gRPC's UNIMPLEMENTED
        reload = (service, method) == RELOAD
        if not reload:
            if service != SERVICE:
                return handler  # the name server serves nothing else
            if method in NODE_ONLY or (method in NODE_OR_CLIENT and any(k == tls.NODE for k, _ in md)):
                try:
                    group, node = self._nodes.verify(md)
                except tls.PeerIdentityError as e:
                    who = _who(md)
                    log.warning("name server: refused %s from %s: %s", method, who, e)
                    return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, f"unauthenticated: {e}")
                if method in NODE_ONLY:
                    return _only_itself(handler, method, group, node)
                return handler
            if method not in NODE_OR_CLIENT and method not in CLIENT_ONLY:
                why = f"{method} is not open to clients"
                log.warning("name server: refused %s", why)
                return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED, why)
        try:
            access_key = auth.verify(md, self._secrets.get, skew_s=self._skew)
        except auth.AuthenticationError as e:
            log.warning("name server: refused %s: %s", method, e)
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, f"unauthenticated: {e}")
        if (reload or method == "ClusterInfo") and access_key != self._admin:
            why = f"user {access_key!r} may not call {method}: it needs admin (the bootstrap admin)"
            log.warning("name server: refused %s", why)
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED, why)
        if method in CLIENT_ONLY and access_key != self._admin:
            return _in_group(handler, method, access_key, self._groups.get(access_key, frozenset()))
        return handler
