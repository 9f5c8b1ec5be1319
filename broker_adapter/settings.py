"""The ``[broker]`` table of a node's config: the broker plugin's own settings, validated by the plugin when the
node builds it (``make``), so a bad value stops the node at start with the key, the value and what is accepted.
The node's core config (``dledger/nodeconfig.py``) only hands the table over (``NodeConfig.sections``).

Example::

    [broker]
    auto_create_topic_queues = 4          # an unknown topic is created with 4 queues (0, the default: refused)
    nameservers = ["127.0.0.1:9876"]      # register with these name servers (docs/cluster.md)
    cluster = "DefaultCluster"
    nameserver_heartbeat_ms = 2000
    retention_hours = 72                  # docs/broker.md, Retention; 0 turns each off
    retention_bytes = 0
    disk_max_used_percent = 0
    max_delay_ms = 86400000               # how far ahead a delayed message may be due (RocketMQ: 1 day)
    key_index = true                      # index keys and message ids at dispatch (queries by key and id)
    auto_renew_invisible_ms = 60000       # a PushConsumer's message: invisible this long, renewed while it runs
    group_commit_linger_ms = 4            # under concurrent load, calls wait up to this for others to join
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker_adapter.core.timer import DEFAULT_MAX_DELAY_MS
from dledger.errors import ConfigError
from dledger.nodeconfig import ID_RE, parse_address

SECTION: Final = "broker"


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    # a send to (or a RocketMQ route query for) an unknown topic creates it with this many queues, through the
    # log; 0 refuses it with NOT_FOUND instead
    auto_create_topic_queues: int = 0
    # name servers this node registers with (docs/cluster.md): host:port each; none: a standalone group
    nameservers: tuple[str, ...] = ()
    cluster: str = "DefaultCluster"  # the cluster name it registers under (RocketMQ's brokerClusterName)
    nameserver_heartbeat_ms: int = 2_000  # re-registration period; a name server expires a node after 120 s
    # retention (broker_adapter/core/retention.py, docs/broker.md "Retention"); 0 turns each off, and with all off
    # the snapshot policy alone compacts the log. RocketMQ's fileReservedTime and diskMaxUsedSpaceRatio.
    retention_hours: float = 0.0
    retention_bytes: int = 0
    disk_max_used_percent: float = 0.0
    # how far ahead a delayed message's delivery time may be (RocketMQ's proxy default: 1 day); a later one is
    # refused (RocketMQ 5: ILLEGAL_DELIVERY_TIME)
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS
    # keep the key and message-id index (broker_adapter/core/keyindex.py); off: queries by key and id are refused
    key_index: bool = True
    # the invisible time of a PushConsumer's auto-renewed receive, and of each renewal (RocketMQ's proxy:
    # defaultInvisibleTimeMills, 60 s); renewed a sixth of it before it runs out (broker_adapter/rocketmq/renewal.py)
    auto_renew_invisible_ms: int = 60_000
    # under concurrent load, the calls that came while a proposal was in flight wait this long for others to
    # join them in the next one (broker_adapter/core/group_commit.py); 0: flushed as soon as the last finishes
    group_commit_linger_ms: float = 4.0

    def __post_init__(self) -> None:
        if not isinstance(self.key_index, bool):
            raise ConfigError(f"[broker] key_index must be true or false, got {self.key_index!r}")
        n = self.auto_create_topic_queues
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1024:
            raise ConfigError(
                f"[broker] auto_create_topic_queues must be an integer in 0..1024 (0: off), got {n!r}"
            )
        ns: Any = self.nameservers
        ns = tuple(a.strip() for a in ns.split(",") if a.strip()) if isinstance(ns, str) else tuple(ns)
        object.__setattr__(self, "nameservers", ns)
        for addr in self.nameservers:
            parse_address(addr, "[broker] nameservers")
        hb = self.nameserver_heartbeat_ms
        if isinstance(hb, bool) or not isinstance(hb, int) or not 100 <= hb <= 60_000:
            raise ConfigError(
                f"[broker] nameserver_heartbeat_ms must be an integer in 100..60000, got {hb!r}"
            )
        if not ID_RE.match(str(self.cluster)):
            raise ConfigError(
                f"[broker] cluster {self.cluster!r} is invalid: use 1-64 letters, digits, '_', '.', '-'"
            )
        for name, hi in (
            ("retention_hours", 1e6),
            ("retention_bytes", 1 << 62),
            ("disk_max_used_percent", 100),
            ("group_commit_linger_ms", 100),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= hi:
                raise ConfigError(f"[broker] {name} must be a number in 0..{hi:g} (0: off), got {v!r}")
        r = self.auto_renew_invisible_ms
        if isinstance(r, bool) or not isinstance(r, int) or not 3_000 <= r <= 3_600_000:
            raise ConfigError(
                f"[broker] auto_renew_invisible_ms must be an integer in 3000..3600000, got {r!r}"
            )
        d = self.max_delay_ms
        if isinstance(d, bool) or not isinstance(d, int) or not 1_000 <= d <= 400 * 86_400_000:
            raise ConfigError(
                f"[broker] max_delay_ms must be an integer in 1000..{400 * 86_400_000}, got {d!r}"
            )

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> BrokerSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(table) - known
        if unknown:
            raise ConfigError(f"[broker]: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**table)

    @classmethod
    def of(cls, node_config: Any) -> BrokerSettings:
        """The settings in a node config's ``[broker]`` table (defaults without one)."""
        return cls.from_table(getattr(node_config, "sections", {}).get(SECTION, {}))
