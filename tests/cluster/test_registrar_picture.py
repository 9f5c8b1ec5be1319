"""A broker node's view of the other groups (``Registrar.other_groups``): the name server's ``ClusterInfo`` loaded
into a ``Registry``, so the node routes them by the name server's own rules (``Registry.route``)."""

from __future__ import annotations

from broker_adapter.nameserver.registrar import Registrar, picture
from broker_adapter.nameserver.registry import BrokerNode, Registry
from broker_adapter.v1 import nameserver_pb2 as pb

NODES = [  # (group, node, address, leader, term, topics, age_ms)
    ("g0", "n0", "a:1", True, 2, {"T": 4}, 10),
    ("g1", "n0", "b:1", True, 3, {"T": 2}, 500),  # an old leader, still registered
    ("g1", "n1", "b:2", True, 4, {"T": 2}, 20),
    ("g1", "n2", "b:3", False, 4, {}, 30),  # lags behind the topic's creation
    ("g2", "n0", "c:1", True, 1, {"U": 1}, 5),
    ("g3", "n0", "d:1", True, 5, {"T": 8}, 100),  # two leaders in one term: the latest heard wins
    ("g3", "n1", "d:2", True, 5, {"T": 8}, 50),
]


def cluster_info(now_ms: int) -> tuple[list[pb.RegisteredBroker], Registry]:
    """The picture as ClusterInfo sends it at ``now_ms``, and the name server's registry it describes."""
    brokers, registry = [], Registry()
    for group, nid, address, leader, term, topics, age in NODES:
        reg = pb.BrokerRegistration(
            cluster="c",
            group=group,
            node_id=nid,
            address=address,
            leader=leader,
            term=term,
            topics=[pb.TopicQueues(topic=t, queues=q) for t, q in topics.items()],
        )
        brokers.append(pb.RegisteredBroker(registration=reg, age_ms=age))
        registry.register(BrokerNode("c", group, nid, address, leader, term, topics, now_ms - age))
    return brokers, registry


def test_the_other_groups_are_routed_as_the_name_server_routes_them():
    brokers, registry = cluster_info(now_ms=1_000_000)
    registrar = Registrar((), lambda: pb.BrokerRegistration(), 1.0)
    registrar.cluster = brokers
    others = registrar.other_groups("T", "g0")
    assert others == [r for r in registry.route("T", 1_000_000) if r.group != "g0"]
    assert [(r.group, r.leader_address, r.addresses, r.queues) for r in others] == [
        ("g1", "b:2", ("b:1", "b:2", "b:3"), 2),
        ("g3", "d:2", ("d:1", "d:2"), 8),
    ]
    assert registrar.other_groups("U", "g2") == [] and registrar.other_groups("", "g0") == []


def test_the_picture_expires_nothing_the_name_server_kept():
    """A name server may keep nodes longer than the default expiry: what it sent is what it keeps."""
    old = pb.RegisteredBroker(
        registration=pb.BrokerRegistration(
            cluster="c", group="g", node_id="n0", address="a:1", topics=[pb.TopicQueues(topic="T", queues=1)]
        ),
        age_ms=10**9,
    )
    assert [r.addresses for r in picture([old]).route("T", 0)] == [("a:1",)]
