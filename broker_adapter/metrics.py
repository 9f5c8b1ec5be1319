"""The broker's Prometheus metrics, on the node's registry (``dledger.metrics``; served when the node config
names ``metrics_listen``): per topic and per consumer group, read from the replicated state at scrape time on
the node's event loop (as the node's own gauges are), so every node of a group reports the same figures for
what it has applied and nothing is counted on the send or consume path, but for the RocketMQ face's call counts
(one dictionary increment per call, which costs a call's few hundred microseconds nothing measurable).

- ``dledger_broker_topic_messages{topic}``: messages the topic's queues hold an offset for (the sum of their
  ends); ``rate()`` of it is the topic's send rate (it drops to 0 when the topic is deleted).
- ``dledger_broker_group_committed{group,topic}``: the sum of the group's committed offsets over the topic's
  queues; ``rate()`` of it is the group's consume rate on that topic.
- ``dledger_broker_group_lag{group,topic}``: messages the group has yet to consume (end - committed, summed).
- ``dledger_broker_key_index_rows``: rows of the key index on this node.
- ``dledger_rocketmq_calls_total{method,served}``: RocketMQ 5 calls this node took that the leader serves, by
  how: ``here`` (this node led), ``relayed`` (a follower's sends on its producer session) or ``forwarded`` (to
  the leader as the client sent them). Clients that dial followers cost the group the relaying or forwarding.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from broker_adapter.core.statemachine import BrokerStateMachine
from dledger.metrics import on_loop

Figures = tuple[dict[str, int], dict[tuple[str, str], tuple[int, int]], int]


def figures(sm: BrokerStateMachine) -> Figures:
    """(messages per topic, (committed, lag) per (group, topic), key index rows): on the node's loop."""
    topics = {t: sum(sm.next_offset(t, q) for q in range(n)) for t, n in sm.topics.items()}
    groups: dict[tuple[str, str], tuple[int, int]] = {}
    for (g, t, q), offset in sm.offsets.items():
        if q >= sm.topics.get(t, 0):
            continue
        committed, lag = groups.get((g, t), (0, 0))
        groups[(g, t)] = (committed + offset, lag + max(0, sm.next_offset(t, q) - offset))
    rows = sm.keyindex.added if sm.keyindex is not None else 0
    return topics, groups, rows


class BrokerCollector(Collector):
    def __init__(self, loop: asyncio.AbstractEventLoop, sm: BrokerStateMachine):
        self._loop = loop
        self._sm = sm

    def _take(self) -> Figures:
        return on_loop(self._loop, lambda: figures(self._sm))

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        topics, groups, rows = self._take()
        messages = GaugeMetricFamily(
            "dledger_broker_topic_messages",
            "Messages stored in the topic's queues (the sum of their ends); rate() is the send rate.",
            labels=["topic"],
        )
        for t, n in sorted(topics.items()):
            messages.add_metric([t], n)
        committed = GaugeMetricFamily(
            "dledger_broker_group_committed",
            "The group's committed offsets summed over the topic's queues; rate() is its consume rate.",
            labels=["group", "topic"],
        )
        lag = GaugeMetricFamily(
            "dledger_broker_group_lag",
            "Messages the group has yet to consume on the topic.",
            labels=["group", "topic"],
        )
        for (g, t), (c, behind) in sorted(groups.items()):
            committed.add_metric([g, t], c)
            lag.add_metric([g, t], behind)
        index = GaugeMetricFamily(
            "dledger_broker_key_index_rows", "Key and message-id index rows written since the node started."
        )
        index.add_metric([], rows)
        return [messages, committed, lag, index]


def register(node: Any, sm: BrokerStateMachine) -> None:
    """Add the broker's figures to the node's registry (a node without one, a test double, gets none)."""
    registry = getattr(getattr(node, "metrics", None), "registry", None)
    if registry is not None:
        registry.register(BrokerCollector(asyncio.get_running_loop(), sm))


class CallsCollector(Collector):
    """``dledger_rocketmq_calls_total``: the RocketMQ face's count of leader calls by (method, how served)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, calls: Counter[tuple[str, str]]):
        self._loop = loop
        self._calls = calls

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        calls = on_loop(self._loop, lambda: sorted(self._calls.items()))
        family = CounterMetricFamily(
            "dledger_rocketmq_calls",
            "RocketMQ 5 calls the leader serves, taken by this node: served here, relayed or forwarded.",
            labels=["method", "served"],
        )
        for (method, served), n in calls:
            family.add_metric([method, served], n)
        return [family]


def register_calls(node: Any, calls: Counter[tuple[str, str]]) -> None:
    """Add the RocketMQ face's call counts to the node's registry (none for a node without one)."""
    registry = getattr(getattr(node, "metrics", None), "registry", None)
    if registry is not None:
        registry.register(CallsCollector(asyncio.get_running_loop(), calls))
