"""The node's gRPC server: the RaftPeer and DLedger servicers (``grpc.py``), a plugin's services, health
checking and reflection, on one port."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from dledger.transport.base import ClientHandler, PeerHandler
from dledger.transport.grpc import SERVER_OPTIONS, DLedgerServicer, RaftPeerServicer
from dledger.v1 import client_pb2, client_pb2_grpc, raft_pb2, raft_pb2_grpc


class NodeServer:
    """The node's gRPC server: RaftPeer + DLedger services, health checking and reflection."""

    def __init__(
        self,
        peer: PeerHandler,
        client: ClientHandler,
        bind: str,
        attach: Callable[[grpc.aio.Server], Sequence[str]] | None = None,
        credentials: grpc.ServerCredentials | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ):
        """``attach(server)`` registers a plugin's servicers and returns their full names (health, reflection).
        ``credentials`` serve TLS instead of plaintext; ``interceptors`` see every call first (security)."""
        self.server = grpc.aio.server(options=list(SERVER_OPTIONS), interceptors=list(interceptors) or None)
        raft_pb2_grpc.add_RaftPeerServicer_to_server(RaftPeerServicer(peer), self.server)
        client_pb2_grpc.add_DLedgerServicer_to_server(DLedgerServicer(client), self.server)
        extra = tuple(attach(self.server)) if attach is not None else ()
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (
            raft_pb2.DESCRIPTOR.services_by_name["RaftPeer"].full_name,
            client_pb2.DESCRIPTOR.services_by_name["DLedger"].full_name,
            *extra,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        if credentials is not None:
            self.port = self.server.add_secure_port(bind, credentials)
        else:
            self.port = self.server.add_insecure_port(bind)
        if self.port == 0:
            raise OSError(f"cannot bind {bind}: address in use or not allowed")
        self._service_names = names[: 2 + len(extra)]

    async def start(self) -> None:
        await self.server.start()
        for name in ("", *self._service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
