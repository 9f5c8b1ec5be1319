"""Asking the name servers: routes of a topic, the cluster's members, and a consumer group's live members.

Name servers hold the same picture (every broker node registers with all of them), so a question goes to one
and, if it does not answer, to the next; the client starts where the last answer came from. Consumer
heartbeats are the exception: they go to every name server, since each one decides membership on its own.
Blocking and thread-safe, on grpc's sync stubs. See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence

import grpc

from broker_adapter.nameserver.registry import GroupRoute
from broker_adapter.v1 import nameserver_pb2 as pb
from broker_adapter.v1 import nameserver_pb2_grpc as pb_grpc
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError, UnavailableError
from dledger.security.config import ClientSecurity
from dledger.security.tls import client_credentials, sync_channel
from dledger.transport.grpc import CHANNEL_OPTIONS

RPC_TIMEOUT_S = 2.0


class NoRouteError(NotFoundError):
    """No live broker group serves the topic (yet)."""


class NameServerRefusedError(DLedgerError):
    """A secure name server refused the call: missing or bad credentials (UNAUTHENTICATED) or an action this
    caller may not take (PERMISSION_DENIED). Not retriable: every name server of a cluster would say the same."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.PERMISSION_DENIED):
        super().__init__(message)
        self.code = code


_REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class NameServerClient:
    def __init__(
        self,
        nameservers: Sequence[str],
        timeout_s: float = RPC_TIMEOUT_S,
        security: ClientSecurity | None = None,
    ):
        """``security``: the cluster's CA and an access key (default: from the environment, as every client of
        ours; docs/security.md): TLS to the name servers and every call signed (docs/cluster.md, "Security")."""
        if not nameservers:
            raise ValueError("at least one name server address is needed")
        self.nameservers = list(nameservers)
        self.timeout_s = timeout_s
        credentials = client_credentials(security)
        self._plaintext = credentials is None
        self._channels = [sync_channel(a, credentials, CHANNEL_OPTIONS) for a in self.nameservers]
        self._stubs = [pb_grpc.NameServerStub(c) for c in self._channels]
        self._first = 0
        self._lock = threading.Lock()

    def _ask(self, method: str, request):
        errors = []
        start = self._first
        for k in range(len(self._stubs)):
            i = (start + k) % len(self._stubs)
            try:
                response = getattr(self._stubs[i], method)(request, timeout=self.timeout_s)
            except grpc.RpcError as err:
                code = err.code()
                if code == grpc.StatusCode.NOT_FOUND:
                    raise NoRouteError(err.details()) from None
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidRequestError(err.details()) from None
                if code in _REFUSALS:
                    raise NameServerRefusedError(
                        f"{code.name}: {self.nameservers[i]}: {err.details()}", code
                    ) from None
                errors.append(f"{self.nameservers[i]}: {code.name} {err.details()}")
                continue
            with self._lock:
                self._first = i
            return response
        raise UnavailableError("no name server answered: " + "; ".join(errors) + self._hint())

    def _hint(self) -> str:
        """A plaintext caller of a TLS name server sees the handshake fail ("Socket closed"): say what to do."""
        if not self._plaintext:
            return ""
        return (
            " (if the cluster is secure, give its client settings: `dledger --security DIR/client.toml ...`, "
            "DLEDGER_SECURITY, or security=ClientSecurity(...); docs/cluster.md, Security)"
        )

    def route(self, topic: str) -> list[GroupRoute]:
        """The groups serving ``topic`` (every live group for ""), sorted by group name."""
        response = self._ask("QueryRoute", pb.QueryRouteRequest(topic=topic))
        return [
            GroupRoute(g.group, g.cluster, g.leader_address, tuple(g.addresses), g.queues)
            for g in response.groups
        ]

    def cluster_info(self) -> pb.ClusterInfoResponse:
        return self._ask("ClusterInfo", pb.ClusterInfoRequest())

    def consumers(self, group: str) -> list[str]:
        return list(self._ask("ListConsumers", pb.ListConsumersRequest(group=group)).client_ids)

    def consumer_heartbeat(self, group: str, client_id: str) -> int:
        """Heartbeat to every name server; how many answered (0 raises: the member would expire everywhere)."""
        request = pb.ConsumerHeartbeatRequest(group=group, client_id=client_id)
        answered, errors = 0, []
        for address, stub in zip(self.nameservers, self._stubs, strict=False):
            try:
                stub.ConsumerHeartbeat(request, timeout=self.timeout_s)
                answered += 1
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidRequestError(err.details()) from None
                if err.code() in _REFUSALS:
                    raise NameServerRefusedError(
                        f"{err.code().name}: {address}: {err.details()}", err.code()
                    ) from None
                errors.append(f"{address}: {err.code().name}")
        if not answered:
            raise UnavailableError(
                "no name server took the consumer heartbeat: " + "; ".join(errors) + self._hint()
            )
        return answered

    def unregister_consumer(self, group: str, client_id: str) -> None:
        request = pb.UnregisterConsumerRequest(group=group, client_id=client_id)
        for stub in self._stubs:
            with contextlib.suppress(grpc.RpcError):  # it expires there instead
                stub.UnregisterConsumer(request, timeout=self.timeout_s)

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> NameServerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_routable(
        self, topic: str, groups: Sequence[str], queues: int | None = None, timeout_s: float = 15.0
    ) -> None:
        """Until every name server routes ``topic`` to each of ``groups`` (with ``queues`` queues, when given)
        and to a leader; ``UnavailableError`` naming what is missing after ``timeout_s``. A topic's creation
        registers it at once (the leader re-registers as it applies it), so this takes a round trip or two."""
        deadline = time.monotonic() + timeout_s
        request = pb.QueryRouteRequest(topic=topic)
        while True:
            missing = []
            for address, stub in zip(self.nameservers, self._stubs, strict=True):
                try:
                    routes = stub.QueryRoute(request, timeout=self.timeout_s).groups
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        missing.append(f"{address}: {err.code().name}")
                        continue
                    routes = []
                have = {
                    g.group for g in routes if g.leader_address and (queues is None or g.queues >= queues)
                }
                missing += [f"{address}: {g}" for g in groups if g not in have]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"topic {topic!r} is not routable after {timeout_s:g} s: missing {', '.join(missing)}"
                )
            time.sleep(0.05)
