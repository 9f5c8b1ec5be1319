"""A broker node's side of the name server: register with every name server, then again as the heartbeat.

Each node of a group registers itself (not only the leader), saying whether it leads and in which term, so a
name server knows every node a client may dial and which one to try first. A registration is sent at once when
the node's role or term changes, and otherwise every ``nameserver_heartbeat_ms``. A name server that is down is
retried at the next beat; registering never blocks the node. On a clean stop the node unregisters, so routes
drop it at once rather than after the name server's expiry. See docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc

from broker_adapter.nameserver.registry import BrokerNode, GroupRoute, Registry
from broker_adapter.v1 import nameserver_pb2 as pb
from broker_adapter.v1 import nameserver_pb2_grpc as pb_grpc
from dledger.security.rotation import close_later
from dledger.transport.grpc import open_channel

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 1.0
RETRY_DOWN_S = 1.0  # how soon a registration a name server refused is tried again


def node_credentials(group: str, node_id: str, security: Any | None) -> grpc.ChannelCredentials | None:
    """A node's channel credentials towards the name servers, from its ``[security]`` settings
    (``dledger.security.config.SecurityConfig``); None for a node without security (plaintext). The same
    certificate and per-call proof the node shows its peers (``tls.peer_channel_credentials``)."""
    if security is None:
        return None
    from dledger.security import tls

    cert, key, ca, _admin = security.load()
    return tls.peer_channel_credentials(group, node_id, cert, key, ca)


def picture(brokers: list[pb.RegisteredBroker]) -> Registry:
    """The name server's ``ClusterInfo`` loaded into a ``Registry`` as at time 0, so the node routes the other
    groups exactly as the name server routes them. Ages become negative ``seen_ms`` (the latest heard last);
    nothing expires here: the name server left out the nodes it expired."""
    reg = Registry(broker_expiry_ms=1 << 62)
    for b in brokers:
        r = b.registration
        topics = {t.topic: t.queues for t in r.topics}
        reg.register(
            BrokerNode(r.cluster, r.group, r.node_id, r.address, r.leader, r.term, topics, -b.age_ms)
        )
    return reg


class Registrar:
    def __init__(
        self,
        nameservers: tuple[str, ...],
        registration: Callable[[], pb.BrokerRegistration],
        period_s: float,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        """``credentials``: a secure node's (``node_credentials``): TLS to the name servers and a proof of the
        node's identity on every call, as to its peers (docs/cluster.md, "Security")."""
        self._registration = registration
        self._period_s = period_s
        self._nameservers = nameservers
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.NameServerStub] = {}
        self.set_credentials(credentials)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._down: set[str] = set()  # name servers whose last registration failed (logged once)
        # The cluster as the name servers last described it (every live node of every group, with its topics),
        # refreshed at every beat: what the RocketMQ face adds to a route for the topic's other groups.
        self.cluster: list[pb.RegisteredBroker] = []

    def set_credentials(self, credentials: grpc.ChannelCredentials | None) -> None:
        """Dial the name servers with these credentials from now on (a secure node's certificates were reloaded:
        docs/security.md, "Rotating certificates"); the old channels close once the calls on them had time to
        end."""
        old = list(self._channels.values())
        self._channels = {a: open_channel(a, credentials=credentials) for a in self._nameservers}
        self._stubs = {a: pb_grpc.NameServerStub(c) for a, c in self._channels.items()}
        if old:

            async def close_old() -> None:
                await asyncio.gather(*(c.close() for c in old))

            close_later(close_old)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nameserver-registrar")

    def changed(self, *_: object) -> None:
        """Register now (a role listener: leadership and term are in the registration)."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self.register_once()
            # A name server that refused or was not up yet is asked again within a second, not a whole beat
            # later: a node must not stay unroutable for a heartbeat period because it started first.
            wait_s = min(self._period_s, RETRY_DOWN_S) if self._down else self._period_s
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
            self._wake.clear()

    async def register_once(self) -> None:
        reg = self._registration()
        await asyncio.gather(*(self._register(a, reg) for a in self._stubs))
        await self._refresh_cluster()

    async def _refresh_cluster(self) -> None:
        for address, stub in self._stubs.items():
            if address in self._down:
                continue
            try:
                info = await stub.ClusterInfo(pb.ClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                continue
            self.cluster = list(info.brokers)
            return

    def other_groups(self, topic: str, own_group: str) -> list[GroupRoute]:
        """The topic's route in the cluster's other groups, from the last picture (sorted by group), by the
        name servers' own rules (``Registry.route``: the leader of the highest term, the largest queue count)."""
        if not topic:
            return []
        return [r for r in picture(self.cluster).route(topic, 0) if r.group != own_group]

    async def _register(self, address: str, reg: pb.BrokerRegistration) -> None:
        try:
            await self._stubs[address].RegisterBroker(reg, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            if address not in self._down:
                log.warning(
                    "%s/%s: cannot register with name server %s (%s: %s); retrying every second",
                    reg.group,
                    reg.node_id,
                    address,
                    err.code().name,
                    err.details(),
                )
                self._down.add(address)
            return
        if address in self._down:
            log.info("%s/%s: registered with name server %s again", reg.group, reg.node_id, address)
            self._down.discard(address)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        reg = self._registration()
        request = pb.UnregisterBrokerRequest(cluster=reg.cluster, group=reg.group, node_id=reg.node_id)
        for _address, stub in self._stubs.items():
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.UnregisterBroker(request, timeout=RPC_TIMEOUT_S)
        await asyncio.gather(*(c.close() for c in self._channels.values()))
