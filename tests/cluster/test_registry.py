"""The name server's registry (expiry, routes) and the consumers' queue allocation, without processes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.cluster.client import ClusterQueue, allocate
from broker_adapter.nameserver.registry import BrokerNode, Registry
from dledger.errors import InvalidRequestError


def node(group, nid, leader=False, term=1, topics=None, seen=0, address=None):
    return BrokerNode(
        "c",
        group,
        nid,
        address or f"127.0.0.1:{1000 + hash((group, nid)) % 5000}",
        leader,
        term,
        topics or {},
        seen,
    )


def test_route_lists_groups_with_the_topic_and_their_leader():
    r = Registry(broker_expiry_ms=1000)
    r.register(node("g0", "n0", leader=True, topics={"T": 4}, address="a:1"))
    r.register(node("g0", "n1", topics={"T": 4}, address="a:2"))
    r.register(node("g1", "n0", topics={"T": 2}, address="b:1"))
    r.register(node("g2", "n0", leader=True, topics={"U": 1}, address="c:1"))
    routes = r.route("T", now_ms=10)
    assert [(x.group, x.leader_address, x.addresses, x.queues) for x in routes] == [
        ("g0", "a:1", ("a:1", "a:2"), 4),
        ("g1", "", ("b:1",), 2),
    ]
    assert [x.group for x in r.route("", now_ms=10)] == ["g0", "g1", "g2"]


def test_a_lagging_follower_does_not_shrink_the_queue_count():
    r = Registry()
    r.register(node("g0", "n0", topics={"T": 8}))
    r.register(node("g0", "n1", topics={}))
    assert r.route("T", 0)[0].queues == 8


def test_the_leader_of_the_highest_term_wins_while_an_old_one_is_still_registered():
    r = Registry()
    r.register(node("g0", "n0", leader=True, term=3, address="old:1"))
    r.register(node("g0", "n1", leader=True, term=4, address="new:1"))
    assert r.route("", 0)[0].leader_address == "new:1"


def test_silent_brokers_and_consumers_expire():
    r = Registry(broker_expiry_ms=1000, consumer_expiry_ms=500)
    r.register(node("g0", "n0", topics={"T": 1}, seen=0))
    r.register(node("g0", "n1", topics={"T": 1}, seen=900))
    r.consumer_heartbeat("cg", "a", 0)
    r.consumer_heartbeat("cg", "b", 400)
    assert r.consumers("cg", 501) == ["b"]
    assert r.consumers("cg", 901) == []
    assert r.consumer_groups(901) == {}
    assert [n.node_id for n in r.live_brokers(1000)] == ["n0", "n1"]
    assert [n.node_id for n in r.live_brokers(1001)] == ["n1"]
    assert r.route("T", 2000) == []


def test_unregister_removes_at_once():
    r = Registry()
    r.register(node("g0", "n0"))
    r.unregister("g0", "n0")
    r.consumer_heartbeat("cg", "a", 0)
    r.unregister_consumer("cg", "a")
    assert r.live_brokers(0) == [] and r.consumers("cg", 0) == []


queues_st = st.lists(
    st.builds(ClusterQueue, st.sampled_from(["g0", "g1", "g2"]), st.integers(0, 15)), unique=True, max_size=40
)
members_st = st.lists(st.text("abcdef", min_size=1, max_size=4), unique=True, min_size=1, max_size=8)


@given(queues_st, members_st, st.sampled_from(["average", "round_robin"]))
def test_allocation_covers_every_queue_exactly_once_and_is_balanced(queues, members, strategy):
    shares = {m: allocate(strategy, list(reversed(queues)), members[::-1], m) for m in members}
    assigned = [q for share in shares.values() for q in share]
    assert sorted(assigned) == sorted(queues)  # every queue once, none twice
    sizes = [len(s) for s in shares.values()]
    assert max(sizes) - min(sizes) <= 1


def test_allocation_rejects_an_unknown_strategy_and_a_stranger_gets_nothing():
    with pytest.raises(InvalidRequestError, match="average or round_robin"):
        allocate("hash", [ClusterQueue("g0", 0)], ["a"], "a")
    assert allocate("average", [ClusterQueue("g0", 0)], ["a"], "b") == []
