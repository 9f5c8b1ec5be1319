"""``dledger console --nameservers`` on a real cluster (two one-node broker groups, one name server), over HTTP
(the browser tests are tests/console/test_console.py): the console finds the groups through the name server,
lists a cluster consumer's member from it, finds a message by key in whichever group stored it, and resets a
consumer group's offsets in every group that has the topic with one form (checked with ``BrokerAdmin`` on each
group, and on the page)."""

from __future__ import annotations

import html
import http.cookiejar
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from broker_adapter.admin_client import BrokerAdmin
from broker_adapter.cluster import local as cl
from broker_adapter.cluster.client import ClusterConsumer, ClusterProducer
from dledger import group as grp
from tests.console.support import ConsoleProcess
from tests.rocketmq.conftest import poll

# extra to the normal set (make test stays under 10 minutes): the per-group paths are test_console.py's
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[cl.ClusterSpec, ConsoleProcess]]:
    c = cl.up(tmp_path_factory.mktemp("console-cluster"), groups=2, nodes=1, nameservers=1)
    try:
        cl.create_topic(c, "orders", 1)
        with ClusterProducer(c.nameserver_addresses) as p:
            for i in range(10):
                p.send("orders", f"o{i}".encode(), keys=[f"order-{i}"])
        (port,) = grp.free_ports(1)
        console = ConsoleProcess(["--nameservers", ",".join(c.nameserver_addresses)], port, https=False)
        try:
            yield c, console
        finally:
            console.stop()
    finally:
        cl.down(c)


def page(console: ConsoleProcess, path: str) -> str:
    with urllib.request.urlopen(console.url + path, timeout=10) as r:
        return html.unescape(r.read().decode())


def test_a_message_is_found_by_key_in_the_group_that_stored_it(cluster):
    c, console = cluster

    def holds(g: str) -> bool:
        with BrokerAdmin(c.group(g).addresses) as a:
            return bool(a.query_by_key("order-7", "orders"))

    (owner,) = [g for g in c.groups if holds(g)]
    found = poll(
        lambda: re.findall(r'<tr class="found".*?</tr>', page(console, "/search?by=key&value=order-7"), re.S),
        15.0,
        "the groups known",
    )
    (row,) = found
    assert f"<td>{owner}</td>" in row and "order-7" in row and "o7" in row


def test_members_from_the_name_server_and_a_reset_in_every_group_with_the_topic(cluster):
    c, console = cluster
    with ClusterConsumer(c.nameserver_addresses, "billing", "orders") as consumer:
        assert len(list(consumer.messages(idle_s=1.0))) == 10

        def shown() -> bool:
            text = page(console, "/consumer?cg=billing")
            member = re.search(r'id="members">([^<]*)<', text)
            return (
                member is not None
                and member.group(1) != "none known"
                and text.count('data-topic="orders"') == 2
            )

        poll(shown, 15.0, "the member and both groups' offsets")
    # the reset form from the page: a POST with the session's cookie and token, from this console's origin
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(console.url + "/consumer?cg=billing", timeout=10) as r:
        token = re.search(r'name="csrf" value="([^"]+)"', r.read().decode())
    assert token is not None
    form = {"csrf": token.group(1), "cg": "billing", "topic": "orders", "mode": "earliest", "group": ""}
    req = urllib.request.Request(
        console.url + "/consumer/reset",
        data=urllib.parse.urlencode(form).encode(),
        headers={"Origin": console.url},
        method="POST",
    )
    with opener.open(req, timeout=10) as r:
        after = html.unescape(r.read().decode())  # the redirect to the group's page, with the outcome
    assert "reset billing on orders to earliest" in after and "g0: 0:" in after and "g1: 0:" in after, after
    for g in c.groups:
        with BrokerAdmin(c.group(g).addresses) as a:
            (q,) = a.describe_group("billing", "orders")
            assert q.committed == 0 and q.lag == q.max_offset, g
    rows = re.findall(r'<tr data-group="(g\d)".*?class="committed">(\d+)</td>', after, re.S)
    assert sorted(rows) == [("g0", "0"), ("g1", "0")]
