"""The broker as a node plugin (``state_machine = "broker"``): the dispatcher state machine plus the Broker service.

``make(config)`` builds the dispatcher over ``<data_dir>/consumequeue``; ``attach(node, server)`` (called by the
node once its storage is open) repairs the ConsumeQueues against the log (units past the log's end are dropped;
missing ones are re-dispatched by the apply loop's replay), wires the allocator to the node's log, builds the
protocol-neutral ``Broker`` over them and registers its gRPC faces: our own Broker service and RocketMQ 5's
MessagingService (``broker_adapter.rocketmq``), both on the node's one gRPC port. With ``[broker] nameservers``
set, the node also registers with those name servers and heartbeats (``broker_adapter.nameserver.registrar``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from broker_adapter import admin_service, metrics, security_rules, service
from broker_adapter.core import runtime_settings
from broker_adapter.core.allocator import QueueOffsetAllocator
from broker_adapter.core.broker import Broker
from broker_adapter.core.commands import is_message
from broker_adapter.core.retention import Retention, RetentionPolicy
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.members import MEMBER_TTL_S, PullingMembers
from broker_adapter.nameserver.registrar import Registrar, node_credentials
from broker_adapter.rocketmq import protocol_without_client
from broker_adapter.settings import SECTION, BrokerSettings
from broker_adapter.v1 import admin_pb2_grpc, broker_pb2_grpc, nameserver_pb2
from dledger.plugins import NodeHandle
from storage.codec import HEADER_SIZE, MAGIC_NORMAL

if TYPE_CHECKING:
    from dledger.security.guard import ServiceRules

log = logging.getLogger(__name__)

PRODUCER = 1  # apache.rocketmq.v2.ClientType.PRODUCER

_SCAN_BYTES = 4 << 20


class BrokerPlugin:
    config_sections = (SECTION,)  # [broker]: broker_adapter/settings.py

    def __init__(self, config: Any):
        self.config = config
        self.settings = BrokerSettings.of(config)  # a bad [broker] value stops the node here, named
        self.broker: Broker | None = None
        self.rocketmq: Any = None  # broker_adapter.rocketmq.servicer.MessagingServicer once attached
        self.pulling = PullingMembers()  # our consumers, by the pulls they make for their groups
        self.allocator: QueueOffsetAllocator | None = None
        self.registrar: Registrar | None = (
            None  # with [broker] nameservers: this node's name-server heartbeat
        )
        self.state_machine = BrokerStateMachine(
            config.data_dir / "consumequeue",
            on_dispatch=self._dispatched,
            index_dir=config.data_dir / "keyindex" if self.settings.key_index else None,
        )
        self._node: NodeHandle | None = None
        self.state_machine.on_config = self._config_changed
        self.state_machine.on_topics = self._topics_changed

    def _dispatched(self, topic: str, queue_id: int, next_offset: int) -> None:
        if self.broker is not None:
            self.broker.dispatched(topic, queue_id, next_offset)

    def _config_changed(self, values: dict[str, Any]) -> None:
        """Run-time settings were applied (or restored from a snapshot): retention and the longest delay follow
        them on this node at once (docs/broker.md, Administration)."""
        try:
            now = runtime_settings.effective(self.settings, values)
        except Exception as e:  # checked before it was proposed: a value no node accepts is ignored alike
            log.warning("run-time broker settings %s not applied: %s", values, e)
            return
        if self.broker is not None:
            self.broker.delivery.max_delay_ms = now.max_delay_ms
        if self._node is not None:
            self._apply_retention(self._node, now)

    def _apply_retention(self, node: NodeHandle, settings: BrokerSettings) -> None:
        sm = self.state_machine
        policy = RetentionPolicy.of(settings)
        if not policy.active:
            sm.retention = None
        elif sm.retention is not None:
            sm.retention.set_policy(policy)
        else:
            sm.retention = Retention(
                policy,
                node.log_store,
                lambda: sm.applied_index,
                sm.queues_to_trim,
                node.config.data_dir,
                prune=sm.keyindex.prune_below if sm.keyindex is not None else None,
            )

    def _members(self, group: str) -> list[str]:
        """The group's members as this node sees them (their client ids): our consumers that pulled for it and
        RocketMQ 5 consumers that heartbeat (every 10 s), both within ``MEMBER_TTL_S``."""
        found = set(self.pulling.of(group))
        if self.rocketmq is not None:
            now = time.monotonic()
            found.update(
                cid
                for cid, c in self.rocketmq.clients.items()
                if c.group == group and c.client_type != PRODUCER and now - c.last_seen < MEMBER_TTL_S
            )
        return sorted(found)

    def _topics_changed(self) -> None:
        """A topic was created or deleted: tell the name servers now, not at the next heartbeat."""
        if self.registrar is not None:
            self.registrar.changed()

    def attach(self, node: NodeHandle, server: Any) -> Sequence[str]:
        store = node.log_store
        self._node = node
        self.state_machine.truncate_beyond(store.tail().end_pos)
        if self.state_machine.applied_index < 0:
            self.state_machine.applied_index = node.metadata().applied_index
        if self.state_machine.keyindex is not None:
            self._catch_up_index(store)

        def read_entries(lo: int, hi: int) -> Iterator[tuple[int, memoryview]]:
            return ((e.index, e.body) for e in _scan(store, lo, min(hi, store.last_index)))

        if self.state_machine.short_queues:
            # The snapshot covers units this node's ConsumeQueues lack: rebuild them from the log where it can.
            self.state_machine.repair(
                (e.index, e.pos, e.body) for e in _scan(store, store.first_index, store.last_index)
            )
        self._apply_retention(node, runtime_settings.effective(self.settings, self.state_machine.config))
        self.allocator = QueueOffsetAllocator(
            self.state_machine, read_entries, lambda: self.state_machine.applied_index
        )
        self.broker = Broker(node, self.state_machine, self.allocator, self.settings)
        node.add_role_listener(self.broker.role_changed)
        settings = self.settings
        if settings.nameservers:
            self.registrar = Registrar(
                settings.nameservers,
                lambda: registration(node, self.state_machine, settings.cluster),
                settings.nameserver_heartbeat_ms / 1000,
                node_credentials(node.group, node.id, node.config.security),
            )
            node.add_role_listener(self.registrar.changed)
            self.registrar.start()
        self.broker.delivery.max_delay_ms = runtime_settings.effective(
            self.settings, self.state_machine.config
        ).max_delay_ms
        broker_pb2_grpc.add_BrokerServicer_to_server(
            service.BrokerServicer(self.broker, self.pulling), server
        )
        admin_pb2_grpc.add_BrokerAdminServicer_to_server(
            admin_service.AdminServicer(self.broker.admin, node, self._members), server
        )
        metrics.register(node, self.state_machine)
        names = (*service.service_names(), *admin_service.service_names())
        try:  # RocketMQ 5's protocol: its generated stubs come with the official client package
            from broker_adapter.rocketmq import handlers
            from broker_adapter.rocketmq.servicer import MessagingServicer
        except ImportError as err:
            log.warning(
                "%s: RocketMQ 5 clients are not served (%s); install rocketmq-python-client to serve them",
                node.id,
                err,
            )
            return names
        self.rocketmq = MessagingServicer(self.broker, cluster=self.registrar)
        metrics.register_calls(node, self.rocketmq.calls)
        handlers.add_to_server(self.rocketmq, server)
        return (*names, handlers.SERVICE_NAME)

    def credentials_reloaded(self, peer: Any) -> None:
        """A secure node reloaded its certificates (``SecuredPlugin``, docs/security.md "Rotating certificates"):
        the channels this plugin dials (name servers, the leader for forwarded calls) are made anew with them."""
        if self.registrar is not None:
            self.registrar.set_credentials(peer)
        if self.rocketmq is not None:
            self.rocketmq.credentials_reloaded()

    def _catch_up_index(self, store: Any) -> None:
        """Index what the log holds past the key index's last position, up to what was applied (the apply
        loop's replay indexes the rest): the whole log when the index is missing."""
        index = self.state_machine.keyindex
        assert index is not None
        applied = self.state_machine.applied_index
        tail = store.tail()
        if index.last_pos >= tail.end_pos or applied < store.first_index:
            return
        lo = store.first_index
        if index.last_pos >= 0:
            lo, hi = store.first_index, min(applied, store.last_index)
            while lo < hi:  # the first entry past the index's last position
                mid = (lo + hi) // 2
                if store.entry(mid).pos + HEADER_SIZE <= index.last_pos:
                    lo = mid + 1
                else:
                    hi = mid
        n = 0
        for e in _scan(store, lo, min(applied, store.last_index)):
            if is_message(e.body):
                self.state_machine.index_message(e.body, e.pos + HEADER_SIZE)
                n += 1
        index.commit()
        if n:
            log.info("key index: %d messages indexed from the log at start", n)

    def security_rules(self) -> Sequence[ServiceRules]:
        """Who may call the broker's services on a secure group (the node's guard asks; only a secure node
        imports the security modules)."""

        return security_rules.rules()

    async def aclose(self) -> None:
        if self.registrar is not None:
            await self.registrar.aclose()


def registration(node: NodeHandle, sm: BrokerStateMachine, cluster: str) -> nameserver_pb2.BrokerRegistration:
    """What this node tells the name servers: who it is, whether it leads, and the topics it has applied."""
    return nameserver_pb2.BrokerRegistration(
        cluster=cluster,
        group=node.group,
        node_id=node.id,
        address=node.address_of(node.id) or node.config.address,
        leader=node.is_leader(),
        term=node.term,
        topics=[nameserver_pb2.TopicQueues(topic=t, queues=q) for t, q in sorted(sm.topics.items())],
    )


def _scan(log: Any, lo: int, hi: int) -> Iterator[Any]:
    """The normal entries of ``log`` in [lo, hi], read in bounded chunks."""
    lo = max(lo, log.first_index)
    while lo <= hi:
        batch = log.entries(lo, hi + 1, _SCAN_BYTES)
        if not batch:
            return
        for e in batch:
            if e.magic == MAGIC_NORMAL:
                yield e
        lo = batch[-1].index + 1


def make(config: Any) -> BrokerPlugin:
    protocol_without_client()  # a node serves RocketMQ 5's protocol; it never runs the official client
    return BrokerPlugin(config)
