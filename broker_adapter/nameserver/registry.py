"""What one name server knows: the broker nodes that registered lately and the consumers that heartbeat lately.

Pure and clock-driven (``now_ms`` is an argument), so the expiry rules are tested without waiting. A name server
keeps nothing on disk and talks to no other name server: every broker node registers with all of them and
renews its registration as its heartbeat, so each one rebuilds the same picture within one heartbeat period
after a restart (RocketMQ's NameServer works the same way; it drops a broker after 120 s of silence).

Routes are per group, not per node: a topic's route lists every group that has the topic, each with its live
nodes and the one that says it leads in the highest term. A node that stopped heartbeating disappears after
``broker_expiry_ms``; a group whose every node expired disappears with them. See docs/cluster.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BROKER_EXPIRY_MS = 120_000  # RocketMQ's NameServer: a broker silent for 120 s is removed
CONSUMER_EXPIRY_MS = 10_000  # consumers heartbeat every second or so; a dead one's queues move within this


@dataclass(frozen=True, slots=True)
class BrokerNode:
    cluster: str
    group: str
    node_id: str
    address: str
    leader: bool
    term: int
    topics: dict[str, int]  # topic -> queues
    seen_ms: int


@dataclass(frozen=True, slots=True)
class GroupRoute:
    group: str
    cluster: str
    leader_address: str  # "" when no live node says it leads
    addresses: tuple[str, ...]
    queues: int  # the topic's queues in this group (0 when asked for no topic)


@dataclass(slots=True)
class Registry:
    broker_expiry_ms: int = BROKER_EXPIRY_MS
    consumer_expiry_ms: int = CONSUMER_EXPIRY_MS
    _brokers: dict[tuple[str, str], BrokerNode] = field(default_factory=dict)  # (group, node_id) -> node
    _consumers: dict[str, dict[str, int]] = field(default_factory=dict)  # group -> client id -> seen_ms

    def register(self, node: BrokerNode) -> None:
        self._brokers[(node.group, node.node_id)] = node

    def unregister(self, group: str, node_id: str) -> None:
        self._brokers.pop((group, node_id), None)

    def live_brokers(self, now_ms: int) -> list[BrokerNode]:
        self._expire(now_ms)
        return sorted(self._brokers.values(), key=lambda n: (n.cluster, n.group, n.node_id))

    def route(self, topic: str, now_ms: int) -> list[GroupRoute]:
        """Every live group serving ``topic`` (every live group when ``topic`` is empty), sorted by name.

        A group's queue count is the largest any live node reports: a follower may lag behind the topic's
        creation, never ahead of it, and queue counts only grow."""
        by_group: dict[str, list[BrokerNode]] = {}
        for n in self.live_brokers(now_ms):
            by_group.setdefault(n.group, []).append(n)
        routes = []
        for group, nodes in sorted(by_group.items()):
            queues = max((n.topics.get(topic, 0) for n in nodes), default=0) if topic else 0
            if topic and queues == 0:
                continue
            leaders = [n for n in nodes if n.leader]
            leader = max(leaders, key=lambda n: (n.term, n.seen_ms)).address if leaders else ""
            routes.append(
                GroupRoute(group, nodes[0].cluster, leader, tuple(n.address for n in nodes), queues)
            )
        return routes

    def consumer_heartbeat(self, group: str, client_id: str, now_ms: int) -> None:
        self._consumers.setdefault(group, {})[client_id] = now_ms

    def unregister_consumer(self, group: str, client_id: str) -> None:
        members = self._consumers.get(group)
        if members is not None:
            members.pop(client_id, None)
            if not members:
                del self._consumers[group]

    def consumers(self, group: str, now_ms: int) -> list[str]:
        self._expire(now_ms)
        return sorted(self._consumers.get(group, {}))

    def consumer_groups(self, now_ms: int) -> dict[str, list[str]]:
        self._expire(now_ms)
        return {g: sorted(m) for g, m in sorted(self._consumers.items())}

    def _expire(self, now_ms: int) -> None:
        for key, node in list(self._brokers.items()):
            if now_ms - node.seen_ms > self.broker_expiry_ms:
                del self._brokers[key]
        for group, members in list(self._consumers.items()):
            for cid, seen in list(members.items()):
                if now_ms - seen > self.consumer_expiry_ms:
                    del members[cid]
            if not members:
                del self._consumers[group]
