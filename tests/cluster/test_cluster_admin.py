"""Administration of a cluster through its name servers (issue 28): two one-node broker groups and two name
servers, with a 30 s registration heartbeat so that only the immediate registration of a topic change can make
a new topic routable in time.

- ``cluster topic`` (``local.create_topic``) and ``topic create --nameservers`` return only once every name
  server routes the topic to every group: a producer started right after reaches both groups at once.
- ``consumer-group list|describe`` (with the members the name servers know), ``topic status``, ``message query``
  and ``topic delete`` with ``--nameservers`` act on every group serving the topic.
"""

from __future__ import annotations

import json
import time

import pytest

from broker_adapter.cluster import local as cl
from broker_adapter.cluster.client import ClusterConsumer, ClusterProducer
from broker_adapter.nameserver.client import NameServerClient, NoRouteError
from tests.broker.test_admin import cli  # the broker's commands, run in-process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = cl.up(tmp_path_factory.mktemp("cadmin"), groups=2, nodes=1, nameservers=2, heartbeat_ms=30_000)
    try:
        yield c
    finally:
        cl.down(c)


def test_a_new_topic_is_routable_everywhere_when_the_command_returns(cluster):
    t0 = time.monotonic()
    cl.create_topic(cluster, "fresh", 2)
    took = time.monotonic() - t0
    assert took < 10, f"cluster topic took {took:.1f} s: it waited for a heartbeat"
    for address in cluster.nameserver_addresses:
        with NameServerClient([address]) as ns:
            assert [(r.group, r.queues) for r in ns.route("fresh")] == [("g0", 2), ("g1", 2)]
    with ClusterProducer(cluster.nameserver_addresses) as p:
        groups = {p.send("fresh", f"m{i}".encode())[0] for i in range(8)}
    assert groups == {"g0", "g1"}

    ns = ",".join(cluster.nameserver_addresses)
    out = cli("topic", "create", "--topic", "fresh2", "--queues", "1", "--nameservers", ns)
    assert "routable" in out
    with ClusterProducer(cluster.nameserver_addresses) as p:
        assert {p.send("fresh2", b"x")[0] for _ in range(6)} == {"g0", "g1"}


def test_groups_topics_and_queries_through_the_name_servers(cluster):
    ns = ",".join(cluster.nameserver_addresses)
    cl.create_topic(cluster, "orders", 1)
    with ClusterProducer(cluster.nameserver_addresses) as p:
        for i in range(10):
            p.send("orders", f"o{i}".encode(), keys=[f"order-{i}"])
    with ClusterConsumer(cluster.nameserver_addresses, "billing", "orders") as c:
        got = list(c.messages(idle_s=1.0))
        assert len(got) == 10
        described = json.loads(
            cli("consumer-group", "describe", "--group", "billing", "--nameservers", ns, "--json")
        )
        assert len(described["members"]) == 1, "the consumer heartbeats to the name servers"
    assert {q["broker_group"] for q in described["queues"]} == {"g0", "g1"}
    assert sum(q["max_offset"] for q in described["queues"]) == 10
    assert all(q["committed"] + q["lag"] == q["max_offset"] for q in described["queues"])
    listed = json.loads(cli("consumer-group", "list", "--nameservers", ns, "--json"))
    assert {(r["broker_group"], r["consumer_group"]) for r in listed} == {
        ("g0", "billing"),
        ("g1", "billing"),
    }
    status = json.loads(cli("topic", "status", "--topic", "orders", "--nameservers", ns, "--json"))
    assert sum(r["max_offset"] for r in status) == 10
    found = json.loads(cli("message", "query", "--key", "order-7", "--nameservers", ns, "--json"))
    assert [m["body"] for m in found] == ["o7"]
    cli("consumer-group reset --group billing --topic orders --to earliest --nameservers", ns)
    described = json.loads(
        cli("consumer-group", "describe", "--group", "billing", "--nameservers", ns, "--json")
    )
    assert sum(q["lag"] for q in described["queues"]) == 10

    cli("topic", "delete", "--topic", "orders", "--nameservers", ns)
    deadline = time.monotonic() + 10
    for address in cluster.nameserver_addresses:
        with NameServerClient([address]) as one:
            while True:
                try:
                    one.route("orders")
                except NoRouteError:
                    break
                assert time.monotonic() < deadline, f"{address} still routes a deleted topic"
                time.sleep(0.05)
