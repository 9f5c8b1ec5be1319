"""Benchmark: what retention (``broker_adapter.core.retention``) costs a producer.

Two real three-node broker groups on 127.0.0.1 (flush "sync", 1 MiB segments, the default snapshot policy), the
same but for ``[broker] retention_bytes``: one keeps 8 MiB of log (so every round deletes: the policy is evaluated,
snapshots are taken for it and the log and ConsumeQueues compacted while the producer runs), the baseline keeps
everything. Rounds alternate between them (the machine is shared and rates drift): each round sends ``--messages``
1 KiB messages in batches of 32 from one producer. Prints messages/s per round, the medians, their ratio, and each
retention node's log files at the end.

    python -m bench.retention [--messages 20000] [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from broker_adapter.client import BrokerConnection, Producer
from dledger import group as grp

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench"
SEGMENT = 1 << 20
KEEP = 8 << 20


def start(directory: Path, broker: str) -> grp.GroupSpec:
    g = grp.create(directory, 3, None, state_machine="broker", raft={"segment_size": SEGMENT})
    for n in g.nodes:
        with open(n.config, "a") as f:
            f.write(f"\n[limits]\nmax_body_bytes = 65536\n\n[broker]\n{broker}\n")
    for n in g.nodes:
        grp.start_node(n)
    grp.wait_for_leader(g, 30)
    grp.wait_for_all(g, 30)
    with BrokerConnection(g.addresses) as c:
        c.create_topic(TOPIC, 4)
    return g


def produce(g: grp.GroupSpec, n: int, batch: int = 32) -> float:
    with Producer(g.addresses) as p:
        p.send(TOPIC, BODY)
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            p.send_batch(TOPIC, [BODY] * min(batch, n - i))
        return n / (time.perf_counter() - t0)


def log_bytes(node: grp.NodeSpec) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in (Path(node.data_dir) / "data").rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-retention-"))
    groups = {}
    try:
        groups["retention"] = start(root / "retention", f"retention_bytes = {KEEP}")
        groups["baseline"] = start(root / "baseline", "")
        rates: dict[str, list[float]] = {k: [] for k in groups}
        for r in range(args.rounds):
            for name, g in groups.items():
                rates[name].append(produce(g, args.messages))
                print(f"round {r + 1} {name:>9}: {rates[name][-1]:10,.0f} msg/s")
        med = {k: statistics.median(v) for k, v in rates.items()}
        total = args.messages * args.rounds * (len(BODY) + 200) >> 20
        print(
            f"\nproduce, 1 KiB x {args.messages} x {args.rounds} rounds (about {total} MiB per group), batch 32:"
        )
        print(f"  retention_bytes = {KEEP >> 20} MiB: median {med['retention']:,.0f} msg/s")
        print(f"  no retention (baseline):   median {med['baseline']:,.0f} msg/s")
        print(f"  ratio retention / baseline: {med['retention'] / med['baseline']:.2f}")
        time.sleep(1.0)  # the last compaction
        for name, g in groups.items():
            sizes = ", ".join(f"{n.id} {log_bytes(n) / (1 << 20):.1f}" for n in g.nodes)
            print(f"  log files at the end, {name}: {sizes} MiB")
    finally:
        for g in groups.values():
            grp.stop_group(g)


if __name__ == "__main__":
    main()
