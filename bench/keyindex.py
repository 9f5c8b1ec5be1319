"""Benchmark: a query by key through the key index (``broker_adapter.core.keyindex``; docs/formats.md section 8).

Two parts:

- ``index``: the index alone, as the dispatcher uses it: ``--index-messages`` messages (each one key and one
  message id: two entries) added in chunks of 256 (a header write per apply chunk), then ``--queries`` lookups
  of random keys among them. Prints the insertion rate, the CPU per message, the files' size and the lookup
  latencies.
- ``group``: a real three-node broker group on 127.0.0.1 (retention keeping the whole log):
  ``--group-messages`` 100-byte messages, each with its own key, sent in batches of 256 (every node indexes them
  at dispatch), then ``--queries`` queries by key and by message id through ``BrokerAdmin`` (gRPC to the leader,
  the index lookup, reading the message from the log and checking its ConsumeQueue unit). Prints the send rate
  and the query latencies; ``--compare`` first runs the same group with ``[broker] key_index = false``.

    python -m bench.keyindex [--index-messages 1000000] [--group-messages 200000] [--queries 500] [--compare]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from broker_adapter.admin_client import BrokerAdmin
from broker_adapter.client import BrokerConnection, Producer
from broker_adapter.core.keyindex import KEY, KeyIndex
from dledger import group as grp

CHUNK = 256


def _ms(samples: list[float]) -> str:
    s = sorted(samples)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    return f"p50 {statistics.median(s) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, max {s[-1] * 1000:.2f} ms"


def bench_index(directory: Path, n: int, queries: int) -> None:
    idx = KeyIndex(directory)
    t0, c0 = time.perf_counter(), time.process_time()
    pos = 0
    for start in range(0, n, CHUNK):
        for i in range(start, min(n, start + CHUNK)):
            pos += 200
            idx.add(pos, f"7F00000100002A9F0000{i:012X}", [f"order-{i}"])
        idx.commit()
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    size = sum(p.stat().st_blocks * 512 for p in directory.iterdir())
    print(
        f"index: {n:,} messages ({2 * n:,} rows) in {took:.1f} s: {n / took:,.0f} messages/s, "
        f"CPU {cpu / n * 1e6:.1f} us a message, {size / 1e6:.0f} MB"
    )
    rng = random.Random(7)
    lat = []
    for _ in range(queries):
        i = rng.randrange(n)
        t = time.perf_counter()
        got = idx.lookup(KEY, f"order-{i}", 32)
        lat.append(time.perf_counter() - t)
        assert got == [(i + 1) * 200], (i, got)
    print(f"index: lookup by key among {n:,}: {_ms(lat)}")
    idx.close()


def bench_group(directory: Path, n: int, queries: int, key_index: bool = True) -> None:
    g = grp.create(directory, 3, None, state_machine="broker")
    for node in g.nodes:
        with open(node.config, "a") as f:
            # retention keeps the whole log (without it, snapshots compact it: messages before one are gone)
            f.write(f"\n[broker]\nretention_hours = 1000\nkey_index = {str(key_index).lower()}\n")
    for node in g.nodes:
        grp.start_node(node)
    try:
        grp.wait_for_leader(g, 30)
        grp.wait_for_all(g, 30)
        with BrokerConnection(g.addresses) as c:
            c.create_topic("bench", 8)
        body = b"x" * 100
        ids: list[str] = []
        t0 = time.perf_counter()
        with Producer(g.addresses) as p:
            for start in range(0, n, CHUNK):
                sent = p.send_batch(
                    "bench", [(body, None, [f"order-{i}"]) for i in range(start, min(n, start + CHUNK))]
                )
                ids += [r.msg_id for r in sent]
        took = time.perf_counter() - t0
        print(
            f"group: {n:,} keyed messages sent in {took:.1f} s ({n / took:,.0f} msg/s), key_index={key_index}"
        )
        if not key_index:
            return
        rng = random.Random(7)
        with BrokerAdmin(g.addresses) as a:
            a.query_by_key("order-0")  # connect, pass the read barrier
            by_key, by_id = [], []
            for _ in range(queries):
                i = rng.randrange(n)
                t = time.perf_counter()
                (m,) = a.query_by_key(f"order-{i}")
                by_key.append(time.perf_counter() - t)
                assert m.keys == (f"order-{i}",)
                t = time.perf_counter()
                (m,) = a.query_by_id(ids[i])
                by_id.append(time.perf_counter() - t)
                assert m.msg_id == ids[i]
        print(f"group: query by key among {n:,} messages (gRPC round trip included): {_ms(by_key)}")
        print(f"group: query by message id among {n:,}: {_ms(by_id)}")
        sizes = [
            sum(f.stat().st_blocks * 512 for f in (Path(x.data_dir) / "keyindex").iterdir()) for x in g.nodes
        ]
        print(f"group: index per node {', '.join(f'{s / 1e6:.0f} MB' for s in sizes)}")
    finally:
        grp.stop_group(g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index-messages", type=int, default=1_000_000)
    ap.add_argument("--group-messages", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--compare", action="store_true", help="first the same group without the index")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-keyindex-"))
    os.makedirs(root, exist_ok=True)
    try:
        if args.index_messages:
            (root / "index").mkdir(exist_ok=True)
            bench_index(root / "index", args.index_messages, args.queries)
        if args.group_messages and args.compare:
            bench_group(root / "plain", args.group_messages, args.queries, key_index=False)
        if args.group_messages:
            bench_group(root / "group", args.group_messages, args.queries)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
