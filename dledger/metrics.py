"""Prometheus metrics of one node, served over HTTP when the node's config names ``metrics_listen``.

Operators watch a log service through its metrics (etcd, DLedger and RocketMQ all export them): who leads, how
far each follower and the state machine lag, how long appends and disk writes take. Each node owns its own
registry (no process-global state), so several nodes in one process (tests, benchmarks) never mix figures.

The gauges are read on the node's event loop at scrape time (the HTTP server runs in its own thread, and the
core is not thread-safe), so a scrape always sees one consistent view. Latency histograms are observed where
the work happens: ``append_latency`` on the leader from enqueue to commit, ``persist`` in the I/O thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from dledger.transport.base import NodeInfo

ROLES = ("follower", "candidate", "leader")
# Sub-millisecond to seconds: a local fsync is ~0.1 ms, a commit over loopback a few ms, a stall seconds.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.032,
    0.064,
    0.128,
    0.256,
    0.512,
    1.0,
    2.0,
    5.0,
)
SCRAPE_TIMEOUT_S = 2.0


T = TypeVar("T")


def on_loop(loop: asyncio.AbstractEventLoop, take: Callable[[], T]) -> T:
    """``take()`` run on the node's event loop (where what it reads changes) for a scrape's thread; an error
    fails the scrape."""
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            fut.set_result(take())
        except Exception as e:  # reported to the scraper as a failed scrape
            fut.set_exception(e)

    loop.call_soon_threadsafe(run)
    return fut.result(timeout=SCRAPE_TIMEOUT_S)


class _NodeCollector(Collector):
    """Turns ``Node.metadata()`` and ``Node.stats`` into metric families at scrape time."""

    def __init__(self, snapshot: Callable[[], tuple[NodeInfo, dict[str, int]]]):
        self._snapshot = snapshot

    def describe(self) -> Iterable[Metric]:
        return ()  # registering must not scrape: the node's loop is the one registering

    def collect(self) -> Iterable[Metric]:
        info, stats = self._snapshot()
        labels = {"group": info.group, "node": info.node_id}
        names, values = list(labels), list(labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"dledger_{name}", doc, labels=names)
            g.add_metric(values, value)
            return g

        yield InfoMetricFamily(
            "dledger_node",
            "Static facts of this node.",
            value={**labels, "address": info.address, "flush": info.flush, "data_dir": info.data_dir},
        )
        role = GaugeMetricFamily("dledger_role", "1 for this node's current role.", labels=[*names, "role"])
        for r in ROLES:
            role.add_metric([*values, r], 1.0 if info.role == r else 0.0)
        yield role
        yield gauge("term", "Current Raft term.", info.term)
        yield gauge("is_leader", "1 when this node leads the group.", 1.0 if info.role == "leader" else 0.0)
        yield gauge("last_index", "Index of the last entry in this node's log.", info.last_index)
        yield gauge(
            "commit_index", "Highest index this node knows committed and holds in storage.", info.commit_index
        )
        yield gauge(
            "applied_index",
            "Highest index applied to the state machine (the commit index without one).",
            info.applied_index,
        )
        yield gauge(
            "apply_lag_entries",
            "Committed entries not yet applied.",
            max(0, info.commit_index - info.applied_index),
        )
        match = GaugeMetricFamily(
            "dledger_peer_match_index",
            "Leader's view of each follower's log (-1 off the leader).",
            labels=[*names, "peer"],
        )
        lag = GaugeMetricFamily(
            "dledger_peer_lag_entries",
            "Entries a follower is behind the leader's log.",
            labels=[*names, "peer"],
        )
        for p in info.peers:
            if p.id == info.node_id:
                continue
            match.add_metric([*values, p.id], p.match_index)
            if info.role == "leader":
                lag.add_metric([*values, p.id], max(0, info.last_index - p.match_index))
        yield match
        yield lag
        for key, value in sorted(stats.items()):
            c = CounterMetricFamily(f"dledger_{key}", f"Node counter {key} since start.", labels=names)
            c.add_metric(values, value)
            yield c


class NodeMetrics:
    """A node's registry, its histograms, and (once ``serve`` ran) the HTTP endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.append_latency = Histogram(
            "dledger_append_latency_seconds",
            "Leader: time from a client's append being queued to its commit (group commit included).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.persist = Histogram(
            "dledger_persist_seconds",
            "Time the I/O thread spent writing one Ready (hard state, entries, fsync per flush policy).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._server: WSGIServer | None = None
        self.port = 0

    def watch(
        self, loop: asyncio.AbstractEventLoop, snapshot: Callable[[], tuple[NodeInfo, dict[str, int]]]
    ) -> None:
        """Register the gauges; ``snapshot`` runs on ``loop`` (the node's) at each scrape."""

        self.registry.register(_NodeCollector(lambda: on_loop(loop, snapshot)))

    def serve(self, address: str) -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0 picks a free one); returns the port."""
        host, _, port = address.rpartition(":")  # validated by NodeConfig
        self._server, _ = start_http_server(int(port), host, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    @property
    def serving(self) -> bool:
        return self._server is not None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
