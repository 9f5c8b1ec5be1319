"""The official Node.js client (npm ``rocketmq-client-nodejs``) produces and consumes against a real three-node
group, also after a leader kill (issue 16). grpc-js can dial one ``host:port`` only, so the client is given one
node's address and the route must advertise exactly that (``route.advertised``); that node forwards to whichever
node leads. Skipped only where ``node`` is not installed."""

from __future__ import annotations

import pytest

from dledger import group as grp
from tests.rocketmq import node_client
from tests.rocketmq.conftest import create_topic, start_group

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(node_client.node() is None, reason="node (Node.js) is not installed on this machine"),
]


@pytest.fixture
def own_group(tmp_path):
    g = start_group(tmp_path / "g")
    yield g
    grp.stop_group(g)


def test_node_client_produces_and_consumes_through_a_leader_kill(own_group, tmp_path):
    g = own_group
    topic = "node-orders"
    create_topic(g, topic, 4)
    leader = grp.wait_for_leader(g)
    follower = next(n for n in g.nodes if n.id != leader.id)  # the one address the client knows
    before = node_client.run(tmp_path, "produce", follower.address, topic, "a", "30")["sent"]
    assert [s["body"] for s in before] == [f"a{i}" for i in range(30)]

    grp.kill_node(g.node(leader.id))
    new = grp.wait_for_leader(g, exclude=leader.id)
    assert new.id != leader.id
    after = node_client.run(tmp_path, "produce", follower.address, topic, "b", "30")["sent"]
    assert len(after) == 30

    sent = {s["id"]: s["body"] for s in before + after}
    got = node_client.run(tmp_path, "consume", follower.address, topic, "node-g", str(len(sent)), "90")
    received = {m["id"]: m["body"] for m in got["received"]}
    assert len(got["received"]) == len(received), "a message was received twice although it was acked"
    assert received == sent
