"""A consumer process killed with SIGKILL mid-stream, then the leader killed: the new leader holds at least every
commit acknowledged before (a failover does not rewind the group, as RocketMQ's 10-second follower offset sync
can), and the group resumes exactly at its committed offsets (nothing skipped) and consumes everything after them.

Real processes throughout: a three-node broker group, ``dledger consume`` as the consumer, producers sending
while it consumes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from broker_adapter.client import BrokerConnection, Consumer, Producer
from dledger import group as grp
from tests.integration.conftest import wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "kill-consumer"
QUEUES = 2
GROUP = "billing"


def test_a_killed_consumer_group_resumes_at_its_committed_offsets_after_a_failover(tmp_path):
    g, _ = grp.up(tmp_path / "g", 3, None, state_machine="broker")
    consumer = None
    try:
        with BrokerConnection(g.addresses) as c:
            c.create_topic(TOPIC, QUEUES)
        acked: list = []
        stop = threading.Event()

        def produce() -> None:
            with Producer(g.addresses, retry_for_s=60) as p:
                i = 0
                while not stop.is_set() and i < 20_000:
                    acked.extend(p.send_batch(TOPIC, [f"m{i + k}".encode() for k in range(20)]))
                    i += 20
                    time.sleep(0.005)

        producer = threading.Thread(target=produce)
        producer.start()
        consumer = subprocess.Popen(
            [sys.executable, "-m", "dledger", "consume", "--addresses", ",".join(g.addresses), "--topic", TOPIC,
             "--group", GROUP, "--from-beginning", "--idle-s", "60", "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip

        def committing(probe: Consumer) -> bool:
            if consumer.poll() is not None:  # it died on its own: say why instead of waiting out the clock
                raise AssertionError(
                    f"dledger consume exited {consumer.returncode}: {consumer.stderr.read()}"
                )
            return all((probe.committed(TOPIC, q) or 0) >= 50 for q in range(QUEUES))

        with Consumer(g.addresses, GROUP, retry_for_s=30) as probe:
            wait(
                lambda: committing(probe),
                60,
                "the consumer process committing offsets on every queue",
                group=g,
            )
            os.kill(consumer.pid, signal.SIGKILL)  # mid-stream: no clean shutdown, no last commit
            consumer.wait(10)
            assert consumer.returncode == -signal.SIGKILL, consumer.stderr.read() if consumer.stderr else ""
            # Acknowledged commits as seen now; one the consumer sent just before it died may still land.
            seen = {q: probe.committed(TOPIC, q) for q in range(QUEUES)}
        leader = grp.wait_for_leader(g)
        grp.kill_node(g.node(leader.id))
        grp.wait_for_leader(g, exclude=leader.id)
        stop.set()
        producer.join(120)
        assert not producer.is_alive()

        with Consumer(g.addresses, GROUP, retry_for_s=60) as c:
            committed = {q: c.committed(TOPIC, q) for q in range(QUEUES)}
            for q in range(QUEUES):
                assert committed[q] >= seen[q], (
                    f"queue {q}: the new leader rewound the group to {committed[q]}"
                )
            resumed = list(c.messages(TOPIC, idle_s=3))
        for q in range(QUEUES):
            offsets = [m.queue_offset for m in resumed if m.queue_id == q]
            assert offsets and offsets[0] == committed[q], (
                f"queue {q} resumed at {offsets[:1]}, not {committed[q]}"
            )
            assert offsets == list(range(committed[q], committed[q] + len(offsets))), f"queue {q}: a gap"
        resumed_ids = {m.msg_id for m in resumed}
        for r in acked:  # every acknowledged message: consumed before the kill (below the commit) or after
            assert r.queue_offset < committed[r.queue_id] or r.msg_id in resumed_ids, r
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait(10)
        grp.stop_group(g)
