"""Retention on real three-node groups (issue 16; ``broker_adapter.core.retention``).

- By bytes: after a producer that kept sending (bounded here), every node's log files are within the policy
  (plus the two partly used segments at its ends), and no node deleted more than the policy says: from the first
  message a node still holds to the log's end there are at least ``retention_bytes`` less one message. A group
  that reads from offset 0 is answered from the first held offset, then gets every later message, without gaps.
- By age: messages older than the newest by the policy go on every node, none within it.
- Independent of snapshots: with a snapshot every 100 entries and a policy that keeps everything, every node
  still serves every message from offset 0 after snapshots, a leader kill and a restart.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker_adapter.client import Consumer, Producer
from broker_adapter.v1 import broker_pb2
from dledger import group as grp
from dledger.errors import NotFoundError
from tests.rocketmq.conftest import create_topic, poll

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SEGMENT = 64 << 10


def start(directory: Path, broker: str, snapshot_entries: int) -> grp.GroupSpec:
    g = grp.create(directory, 3, None, state_machine="broker", raft={"segment_size": SEGMENT})
    for n in g.nodes:
        with open(n.config, "a") as f:
            f.write(
                f"\n[limits]\nmax_body_bytes = 16384\n\n[snapshot]\nentries = {snapshot_entries}\n\n"
                f"[broker]\n{broker}\n"
            )
    for n in g.nodes:
        grp.start_node(n)
    try:
        grp.wait_for_leader(g, 30)
        grp.wait_for_all(g, 30)
    except Exception:
        grp.stop_group(g)
        raise
    return g


def disk_bytes(path: Path) -> int:
    """Bytes the files under ``path`` occupy on disk (allocated blocks: sparse holes do not count)."""
    return sum(os.stat(p).st_blocks * 512 for p in path.rglob("*") if p.is_file())


def read_all(g: grp.GroupSpec, topic: str, node: grp.NodeSpec, queues: int) -> list:
    """Every message ``node`` holds, each queue pulled from offset 0 (served from its first held offset)."""
    got = []
    with Consumer(g.addresses, "reader") as c:
        for q in range(queues):
            offset = 0
            while True:
                batch = c.pull(topic, q, offset, 256, allow_follower=True, address=node.address)
                if not batch:
                    break
                got += batch
                offset = batch[-1].queue_offset + 1
    return got


def _knows(g: grp.GroupSpec, topic: str, node: grp.NodeSpec) -> bool:
    try:
        read_all(g, topic, node, 1)
    except NotFoundError:
        return False
    return True


def log_end(g: grp.GroupSpec) -> int | None:
    """The log's end once every node has applied all of it (None before). ``Route`` is answered by the node
    asked, from its own applied end: a lagging follower's is behind the log's (and the nodes' floors are
    computed from the end each reaches), so the end is the one all nodes agree on after the last write."""
    with Consumer(g.addresses, "probe") as c:
        ends = {
            c.call(
                "Route", broker_pb2.RouteRequest(), retry_unknown=True, address=n.address
            ).max_commitlog_offset
            for n in g.nodes
        }
    return ends.pop() if len(ends) == 1 else None


@pytest.fixture
def groups():
    started: list[grp.GroupSpec] = []
    yield started
    for g in started:
        grp.stop_group(g)


def test_retention_by_bytes_bounds_every_node_and_deletes_no_more(tmp_path, groups):
    keep = 256 << 10
    g = start(tmp_path / "g", f"retention_bytes = {keep}", snapshot_entries=100_000)
    groups.append(g)
    create_topic(g, "ret", 2)
    body = b"r" * 600
    with Producer(g.addresses) as p:
        for _ in range(60):  # about 2.2 MB: eight times the policy
            p.send_batch("ret", [body] * 50)
    ends = poll(lambda: log_end(g), 30, "every node applied the whole log")
    for n in g.nodes:  # the policy is looked at again within a second of the last write (Snapshots.recheck)
        poll(
            lambda n=n: disk_bytes(Path(n.data_dir) / "data") <= keep + 3 * SEGMENT,
            30,
            f"{n.id}'s log files within {keep} bytes and three segments",
        )
        msgs = read_all(g, "ret", n, 2)
        assert msgs, f"{n.id} holds nothing"
        by_queue: dict[int, list[int]] = {}
        for m in msgs:
            by_queue.setdefault(m.queue_id, []).append(m.queue_offset)
        for q, offsets in by_queue.items():
            assert offsets[0] > 0, f"{n.id} queue {q} kept everything: nothing was deleted"
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "a gap after the first held"
        first = min(m.commitlog_offset for m in msgs)
        size = 48 + max(len(m.body) for m in msgs) + 200
        assert ends - first >= keep - size, f"{n.id} deleted more than the policy says ({ends - first} kept)"


def test_snapshots_no_longer_delete_what_the_policy_keeps(tmp_path, groups):
    g = start(tmp_path / "g", "retention_hours = 24", snapshot_entries=100)
    groups.append(g)
    create_topic(g, "keep", 2)
    sent = 0
    with Producer(g.addresses) as p:
        for i in range(30):
            p.send_batch("keep", [b"k%d" % (i * 20 + j) for j in range(20)])
            sent += 20
            if i == 15:
                leader = grp.wait_for_leader(g)
                grp.kill_node(g.node(leader.id))
                grp.wait_for_leader(g, exclude=leader.id)
    grp.start_node(g.node(leader.id))  # restarts from its snapshot and a log that starts before it
    grp.wait_for_all(g, 30)
    for n in g.nodes:
        assert any((Path(n.data_dir) / "snapshot").iterdir()), f"{n.id} took no snapshot"
    for n in g.nodes:
        # the restarted node catches up first
        poll(lambda n=n: len(read_all(g, "keep", n, 2)) == sent, 30, f"{n.id} serving all {sent} messages")
        bodies = sorted(int(m.body[1:]) for m in read_all(g, "keep", n, 2))
        assert bodies == list(range(sent))


def test_retention_by_age_deletes_what_is_older_than_the_newest_by_the_policy(tmp_path, groups):
    """``retention_hours = 0.001`` (3.6 s): messages sent first are deleted on every node once messages stored
    more than 3.6 s later arrive, and no node deletes a message stored within 3.6 s of the newest it holds. Age
    runs on the messages' store times: the test waits for the producer's own later sends, and checks store
    times, never a duration."""
    keep_ms = 3_600
    g = start(tmp_path / "g", "retention_hours = 0.001", snapshot_entries=100_000)
    groups.append(g)
    create_topic(g, "age", 1)
    # Every node knows the topic before the test reads each one (a node that joined last may still be catching up).
    poll(lambda: all(_knows(g, "age", n) for n in g.nodes), 30, "the topic on every node")
    stored: dict[int, int] = {}  # queue offset -> store time, as read while still held

    def look() -> list[list]:
        held = [read_all(g, "age", n, 1) for n in g.nodes]
        for msgs in held:
            stored.update((m.queue_offset, m.store_timestamp) for m in msgs)
        return held

    with Producer(g.addresses) as p:
        first = [p.send("age", b"old%d" % i) for i in range(50)]
        look()
        assert len(stored) == 50

        def old_ones_gone() -> bool:
            p.send("age", b"new")  # one more send per look (bounded by the poll)
            return all(msgs and msgs[0].queue_offset > first[-1].queue_offset for msgs in look())

        poll(old_ones_gone, 60, "the first messages deleted on every node", interval_s=0.2)
    for n, msgs in zip(g.nodes, look(), strict=True):
        newest = max(m.store_timestamp for m in msgs)
        gone = msgs[0].queue_offset - 1  # the newest message this node deleted
        assert stored[gone] < newest - keep_ms + 1, f"{n.id} deleted offset {gone} within the policy"
        offsets = [m.queue_offset for m in msgs]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
            f"{n.id}: a gap in what it keeps"
        )
