"""A member added to a proxied group is reached through its links both ways (docs/chaos.md, "Proxies and new
members"): ``member add`` gives every member a ``[dial]`` entry for the newcomer before the change, each node
reads it when it learns of the member (dledger/nodeconfig.py ``dial_address``), so a partition cuts what the
newcomer is sent, not only what it sends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dledger import group as grp
from dledger import group_members as members
from dledger import nodeconfig
from dledger.chaos.proxy import LinkSpec, Network
from dledger.client import DLedgerClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _links(g: grp.GroupSpec) -> list[LinkSpec]:
    return [LinkSpec(a, b, p, g.node(b).address) for a, b, p in g.links]


def _row(g: grp.GroupSpec, node_id: str) -> grp.NodeStatus:
    return next(r for r in grp.status(g, 0.5) if r.id == node_id)


def test_a_partition_cuts_what_a_new_member_is_sent(tmp_path: Path) -> None:
    directory = tmp_path / "g"
    g = grp.create(directory, 3, None, flush="async", proxied=True)
    net = Network(_links(g), seed=1)
    net.start()
    grown = g
    try:
        for spec in g.nodes:
            grp.start_node(spec)
        grp.wait_for_leader(g, 30.0)
        with DLedgerClient(g.addresses, g.name, timeout_s=20) as c:
            c.append(b"before the newcomer")
            new = members.add_member(directory)
            grown = grp.load(directory)
            assert grown is not None
            net.add_links(s for s in _links(grown) if (s.src, s.dst) not in net.links)
            for n in g.nodes:  # each member's own way to the newcomer: its link's port, not the node's
                port = next(p for a, b, p in grown.links if a == n.id and b == new.id)
                assert nodeconfig.load(Path(n.config)).dial == {new.id: f"127.0.0.1:{port}"}
            first = c.append(b"reaches the learner").index
            row = grp.wait_caught_up(grown, new.id, first, 60.0)
            assert row is not None and row.commit_index is not None and row.commit_index >= first, row
            into = [net.links[(n.id, new.id)].bytes_forwarded for n in g.nodes]
            assert sum(into) > 0, "no member dialled the newcomer through its link"

            net.partition([[new.id], [n.id for n in g.nodes]])
            held = _row(grown, new.id).last_index
            last = first
            for i in range(20):
                last = c.append(f"while cut off {i}".encode()).index
            time.sleep(1.0)  # heartbeats and retries would have carried them by now
            assert _row(grown, new.id).last_index == held, "the newcomer was sent entries across a partition"

            net.heal()
            row = grp.wait_caught_up(grown, new.id, last, 60.0)
            assert row is not None and row.commit_index is not None and row.commit_index >= last, row
    finally:
        grp.stop_group(grown)
        net.stop()


def test_dial_entries_are_added_without_touching_the_rest(tmp_path: Path) -> None:
    """``[dial]`` is created, then grown, in place; ``[peers]`` (the starting voters) and the other tables stay
    as they were."""
    g = grp.create(tmp_path / "g", 3, None, proxied=True)
    config = Path(g.nodes[0].config)
    before = nodeconfig.load(config)
    members._add_dial(config, "n3", "127.0.0.1:30914")
    members._add_dial(config, "n4", "127.0.0.1:30915")
    after = nodeconfig.load(config)
    assert after.dial == {"n3": "127.0.0.1:30914", "n4": "127.0.0.1:30915"}
    assert after.peers == before.peers and after.raft == before.raft and after.sections == before.sections
    assert config.read_text().count("[dial]") == 1
    assert not config.with_name(config.name + ".tmp").exists()
