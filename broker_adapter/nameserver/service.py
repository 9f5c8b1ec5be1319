"""The name server process: ``Registry`` behind the ``NameServer`` gRPC service (proto/broker_adapter/v1/nameserver.proto).

Every request carries all it needs (a registration is the whole node's picture), so a name server that restarts
is correct again after one heartbeat period, and several run side by side without coordination. Input is
checked here, at the edge: an empty group or node id, or an address that is not host:port, is INVALID_ARGUMENT
naming the field, and the registry never holds it. See docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

import grpc

from broker_adapter.nameserver.guard import RELOAD, NameServerGuard, NameServerSecurity
from broker_adapter.nameserver.registry import BrokerNode, Registry
from broker_adapter.v1 import nameserver_pb2 as pb
from broker_adapter.v1 import nameserver_pb2_grpc as pb_grpc
from dledger.errors import ConfigError
from dledger.nodeconfig import parse_address
from dledger.security.rotation import MaterialFiles, Reloadable, check_material
from dledger.transport.grpc import SERVER_OPTIONS

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876  # RocketMQ's name server port


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


async def _invalid(context: grpc.aio.ServicerContext, message: str) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_name(value: str, what: str) -> str | None:
    if not value:
        return f"{what} is empty"
    if len(value) > 255 or any(c.isspace() for c in value):
        return f"{what} {value[:64]!r} is invalid: 1-255 characters, no spaces"
    return None


class NameServerServicer(pb_grpc.NameServerServicer):
    def __init__(self, registry: Registry, clock: Callable[[], int] = _now_ms):
        self.registry = registry
        self.clock = clock

    async def RegisterBroker(self, request: pb.BrokerRegistration, context):
        for value, what in (
            (request.group, "group"),
            (request.node_id, "node_id"),
            (request.cluster, "cluster"),
        ):
            problem = _check_name(value, what)
            if problem:
                await _invalid(context, f"RegisterBroker: {problem}")
        try:
            parse_address(request.address, "RegisterBroker: address")
        except ConfigError as err:
            await _invalid(context, str(err))
        topics = {}
        for t in request.topics:
            if not t.topic or t.queues <= 0:
                await _invalid(
                    context, f"RegisterBroker: topic {t.topic!r} with {t.queues} queues is invalid"
                )
            topics[t.topic] = t.queues
        known = {(n.group, n.node_id) for n in self.registry.live_brokers(self.clock())}
        if (request.group, request.node_id) not in known:
            log.info("broker %s/%s registered at %s", request.group, request.node_id, request.address)
        self.registry.register(
            BrokerNode(
                request.cluster,
                request.group,
                request.node_id,
                request.address,
                request.leader,
                request.term,
                topics,
                self.clock(),
            )
        )
        return pb.RegisterBrokerResponse(expire_after_ms=self.registry.broker_expiry_ms)

    async def UnregisterBroker(self, request, context):
        self.registry.unregister(request.group, request.node_id)
        log.info("broker %s/%s unregistered", request.group, request.node_id)
        return pb.UnregisterBrokerResponse()

    async def QueryRoute(self, request, context):
        routes = self.registry.route(request.topic, self.clock())
        if request.topic and not routes:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no live broker group serves topic {request.topic!r} (create it, or wait for the brokers' "
                "next heartbeat)",
            )
        return pb.QueryRouteResponse(
            topic=request.topic,
            groups=[
                pb.GroupRoute(
                    group=r.group,
                    cluster=r.cluster,
                    leader_address=r.leader_address,
                    addresses=r.addresses,
                    queues=r.queues,
                )
                for r in routes
            ],
        )

    async def ClusterInfo(self, request, context):
        now = self.clock()
        brokers = [
            pb.RegisteredBroker(
                registration=pb.BrokerRegistration(
                    cluster=n.cluster,
                    group=n.group,
                    node_id=n.node_id,
                    address=n.address,
                    leader=n.leader,
                    term=n.term,
                    topics=[pb.TopicQueues(topic=t, queues=q) for t, q in sorted(n.topics.items())],
                ),
                age_ms=now - n.seen_ms,
            )
            for n in self.registry.live_brokers(now)
        ]
        groups = [
            pb.ConsumerGroupMembers(group=g, client_ids=m)
            for g, m in self.registry.consumer_groups(now).items()
        ]
        return pb.ClusterInfoResponse(brokers=brokers, consumer_groups=groups)

    async def ConsumerHeartbeat(self, request, context):
        for value, what in ((request.group, "group"), (request.client_id, "client_id")):
            problem = _check_name(value, what)
            if problem:
                await _invalid(context, f"ConsumerHeartbeat: {problem}")
        self.registry.consumer_heartbeat(request.group, request.client_id, self.clock())
        return pb.ConsumerHeartbeatResponse(expire_after_ms=self.registry.consumer_expiry_ms)

    async def UnregisterConsumer(self, request, context):
        self.registry.unregister_consumer(request.group, request.client_id)
        return pb.UnregisterConsumerResponse()

    async def ListConsumers(self, request, context):
        return pb.ConsumerGroupMembers(
            group=request.group, client_ids=self.registry.consumers(request.group, self.clock())
        )


def _reloader(
    security: NameServerSecurity, material: Reloadable, guard: NameServerGuard
) -> Callable[[], dict[str, Any]]:
    """A reload (SIGHUP, ``dledger cert reload``): the admin and users files read again and checked, then the
    certificate, key and CA bundle; the guard takes the users only once both succeeded, so a bad file of
    either kind changes nothing (ConfigError naming it)."""

    def reload() -> dict[str, Any]:
        secrets, admin, groups = security.read_users()
        summary = material.reload()
        guard.set_users(secrets, admin, groups)
        log.info("name server: users reloaded: %d access keys", len(secrets))
        return {**summary, "users": len(secrets)}

    return reload


def _reload_logged(listen: str, reload: Callable[[], dict[str, Any]]) -> None:
    """SIGHUP: reload certificates and users; files that cannot serve are logged, nothing changes."""
    try:
        reload()
    except ConfigError as e:
        log.error("name server %s: SIGHUP: certificates and users not reloaded: %s", listen, e)


def _reload_handler(reload_all: Callable[[], dict[str, Any]]) -> grpc.GenericRpcHandler:
    """``dledger.v1.Security/ReloadCertificates`` as a node serves it (``dledger cert reload``; the guard lets
    only the bootstrap admin call it): the answer is the reload's summary (JSON)."""

    async def reload(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return json.dumps(reload_all()).encode()
        except ConfigError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"name server: {e}")
            raise  # not reached: abort raises

    service, method = RELOAD
    return grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(reload)}
    )


async def serve(
    listen: str,
    registry: Registry | None = None,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    security: NameServerSecurity | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set); ``ready(port)`` is called once the port is bound. With
    ``security``: TLS only, and every call checked by ``guard.NameServerGuard`` (docs/cluster.md, "Security")."""
    registry = registry or Registry()
    interceptors = []
    material: Reloadable | None = None
    reload: Callable[[], dict[str, Any]] | None = None
    if security is not None:
        _cert, _key, _ca, secrets, admin, groups = security.load()
        files = MaterialFiles(security.cert, security.key, security.ca, prefix="name server --")
        material = Reloadable(files.read, lambda m: check_material(m, files))
        guard = NameServerGuard(material.material.ca_pem, secrets, admin, security.skew_s, groups)
        material.on_reload(lambda m: guard.set_ca(m.ca_pem))
        interceptors.append(guard)
        reload = _reloader(security, material, guard)
    # SIGTERM/SIGINT are taken from here on, so that one arriving while the server starts stops it cleanly too
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread (tests)
            loop.add_signal_handler(sig, stop.set)
    server = grpc.aio.server(options=list(SERVER_OPTIONS), interceptors=interceptors)
    pb_grpc.add_NameServerServicer_to_server(NameServerServicer(registry), server)
    if material is not None and reload is not None:
        server.add_generic_rpc_handlers((_reload_handler(reload),))
        port = server.add_secure_port(listen, material.server_credentials())
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot bind {listen}: address in use or not allowed")
    await server.start()
    log.info("name server listening on %s%s", listen, " (TLS, authenticated)" if security else "")
    if reload is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, functools.partial(_reload_logged, listen, reload))
    if ready is not None:
        ready(port)
    try:
        await stop.wait()
    finally:
        await server.stop(1.0)
