"""The Prometheus endpoint: what an operator scrapes must agree with the node's own view."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dledger.client import AsyncDLedgerClient
from dledger.errors import ConfigError
from dledger.nodeconfig import NodeConfig
from tests.runtime.cluster import LocalGroup


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    hits = [
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
    ]
    assert len(hits) == 1, f"{name} {labels}: {len(hits)} samples"
    return hits[0]


def test_metrics_follow_roles_commits_and_latency(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, metrics_listen="127.0.0.1:0") as g:
            leader = await g.leader()
            async with AsyncDLedgerClient(g.addresses) as c:
                results = [await c.append(b"m" * 100) for _ in range(20)]  # one request each
            last = max(r.index for r in results)
            await g.until(lambda: all(n.metadata().commit_index >= last for n in g.nodes.values()))
            await g.until(
                lambda: all(p.match_index >= last for p in leader.metadata().peers if p.id != leader.id)
            )
            loop = asyncio.get_running_loop()
            for node in g.nodes.values():
                s = await loop.run_in_executor(None, scrape, node.metrics.port)
                me = {"node": node.id, "group": node.group}
                is_leader = node is leader
                assert value(s, "dledger_is_leader", **me) == (1.0 if is_leader else 0.0)
                assert value(s, "dledger_role", role="leader", **me) == (1.0 if is_leader else 0.0)
                assert value(s, "dledger_term", **me) == node.core.term
                assert value(s, "dledger_commit_index", **me) >= last
                assert value(s, "dledger_persists_total", **me) == node.stats["persists"] > 0
                assert value(s, "dledger_persist_seconds_count") >= 1
                if is_leader:
                    # Every append request was timed from its queueing to its commit.
                    assert value(s, "dledger_append_latency_seconds_count") == 20
                    assert value(s, "dledger_append_latency_seconds_sum") > 0
                    for peer in g.nodes:
                        if peer != node.id:
                            assert value(s, "dledger_peer_match_index", peer=peer, **me) >= last
                            assert value(s, "dledger_peer_lag_entries", peer=peer, **me) == 0

    asyncio.run(run())


def test_metrics_listen_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="metrics_listen"):
        NodeConfig("n0", {"n0": "127.0.0.1:1"}, tmp_path, metrics_listen="nowhere")
