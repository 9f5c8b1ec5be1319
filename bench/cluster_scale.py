"""Benchmark: how produce throughput grows with broker groups, and what one group costs.

For each cluster size (``--groups 1,2,3`` by default) it starts a real local cluster (one name server, G groups of
three node processes on 127.0.0.1, flush "sync"), creates a topic with 4 queues in every group, and has 64 threads
share one ``ClusterProducer`` (one 1 KiB message per call, spread over every group's queues) for ``--seconds``.

Printed per size: msg/s, the ratio to one group in the same run, and the CPU the node processes used per message
(their user+system time from /proc over the run). On one 2-core machine every group shares the same two cores,
so the total cannot grow much: the useful figure is CPU per message, which says what a multi-machine cluster
gets. With each group on its own machines, throughput adds up group by group until the clients or the network
limit it (docs/cluster.md works the prediction out).

    python -m bench.cluster_scale [--groups 1,2,3] [--seconds 5] [--callers 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from bench.proc_cpu import cpu_seconds
from broker_adapter.cluster import local as cl
from broker_adapter.cluster.client import ClusterProducer
from dledger.errors import DLedgerError

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench-scale"
QUEUES = 4


def _node_pids(c: cl.ClusterSpec) -> list[int]:
    pids = []
    for g in c.groups:
        for spec in c.group(g).nodes:
            pid = (Path(spec.data_dir) / "node.pid").read_text().strip()
            pids.append(int(pid))
    return pids


def run_one(groups: int, seconds: float, callers: int, base: Path) -> dict:
    c = cl.up(base / f"g{groups}", groups=groups, nodes=3, nameservers=1, heartbeat_ms=500)
    try:
        cl.create_topic(c, TOPIC, QUEUES)
        cl.wait_registered(c)
        with ClusterProducer(c.nameserver_addresses) as p:
            deadline = time.monotonic() + 20
            while True:  # until every group's topic is in the route
                try:
                    if len(p._routes.get(TOPIC, refresh=True)) == groups:
                        break
                except DLedgerError:  # not registered yet
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the topic never reached every group's route")
                time.sleep(0.1)
            for _ in range(4 * groups):
                p.send(TOPIC, BODY)
            counts = [0] * callers
            stop = threading.Event()

            def sender(k: int) -> None:
                while not stop.is_set():
                    p.send(TOPIC, BODY)
                    counts[k] += 1

            pids = _node_pids(c)
            cpu0 = cpu_seconds(pids)
            threads = [threading.Thread(target=sender, args=(k,)) for k in range(callers)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - t0
            cpu = cpu_seconds(pids) - cpu0
        sent = sum(counts)
        return {
            "groups": groups,
            "msg_s": sent / elapsed,
            "cpu_ms_per_msg": 1000 * cpu / max(sent, 1),
            "sent": sent,
        }
    finally:
        cl.down(c)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="1,2,3", help="cluster sizes to run, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--dir", type=Path, default=None, help="where the clusters live (default: a temp dir)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.groups.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="dledger-bench-scale-") as tmp:
        base = args.dir or Path(tmp)
        rows = [run_one(g, args.seconds, args.callers, base) for g in sizes]
    one = rows[0]["msg_s"] if rows else 0
    cores = os.cpu_count() or 1
    print(
        f"produce through ClusterProducer, {args.callers} threads, 1 KiB, flush sync, {cores} cores, 3 nodes/group"
    )
    print(f"{'groups':>6} {'msg/s':>9} {'x first':>8} {'node CPU ms/msg':>16} {'msg/s per core-second':>22}")
    for r in rows:
        per_core = 1000 / r["cpu_ms_per_msg"] if r["cpu_ms_per_msg"] else 0
        print(
            f"{r['groups']:>6} {r['msg_s']:>9.0f} {r['msg_s'] / one if one else 0:>8.2f} "
            f"{r['cpu_ms_per_msg']:>16.3f} {per_core:>22.0f}"
        )


if __name__ == "__main__":
    main()
