"""Benchmark of the ``dledger`` Spark source: a batch read of a topic against our own ``Consumer`` reading it.

    python -m bench.spark_source                       # 200,000 messages of 256 bytes, 4 queues
    python -m bench.spark_source --messages 1000000    # the issue's figure

A three-node broker group (flush async, a retention policy that keeps every message) is filled once; then, in the same run, over the same messages:

- consumer: one ``Consumer`` pulls every queue from offset 0 to its end, 1,024 at a time, from the leader, and
  touches each message's body (the consumer's own per-message cost: one raw pull decoded into tuples);
- spark: ``spark.read.format("dledger")`` on ``local[2]`` (or ``--master``), one partition per queue, every
  column built (Arrow batches), summed in Spark. The session start and a first small read (Python workers start,
  imports) are timed apart; the read runs ``--runs`` times.

Printed: messages/s of each, and the ratio spark/consumer (the issue's target: at least 0.7 with two cores).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from broker_adapter.client import BrokerConnection, Consumer, Producer
from dledger import group as grp

TOPIC = "bench"


def fill(g: grp.GroupSpec, messages: int, size: int, queues: int) -> None:
    with BrokerConnection(g.addresses) as c:
        c.create_topic(TOPIC, queues)
    body = b"x" * size
    per = messages // 4

    def work() -> None:
        with Producer(g.addresses, retry_for_s=60) as p:
            for i in range(0, per, 1024):
                p.send_batch(TOPIC, [body] * min(1024, per - i))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def consumer_rate(g: grp.GroupSpec, queues: int) -> tuple[int, float]:
    started = time.perf_counter()
    n = 0
    with Consumer(g.addresses, "bench") as c:
        ends = {t.topic: t.max_offsets for t in c.list_topics()}[TOPIC]
        for q in range(queues):
            at = 0
            while at < ends[q]:
                msgs = c.pull(TOPIC, q, at, 1024)
                n += sum(len(m.body) > 0 for m in msgs)
                at = msgs[-1].queue_offset + 1
    return n, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    g = grp.create(work / "g", 3, None, state_machine="broker", flush="async")
    for n in g.nodes:  # a retention policy that keeps everything: snapshots then compact nothing away
        with open(n.config, "a") as f:
            f.write("\n[broker]\nretention_hours = 10000\n")
    for n in g.nodes:
        grp.start_node(n)
    grp.wait_for_leader(g, 30)
    try:
        t = time.perf_counter()
        fill(g, args.messages, args.size, args.queues)
        print(f"filled {args.messages:,} messages of {args.size} B in {time.perf_counter() - t:.1f} s")
        from spark.datasource import register
        from spark.session import build_session

        t = time.perf_counter()
        spark = build_session(args.master, app_name="bench-spark")
        register(spark)
        servers = ",".join(g.addresses)

        def reader():  # a new one each time: DataFrameReader.option changes the reader it is called on
            return spark.read.format("dledger").option("addresses", servers).option("topic", TOPIC)

        reader().option("endingOffsets", '{"bench": {"0": 10}}').load().count()
        print(f"spark start and first small read: {time.perf_counter() - t:.1f} s")
        for run in range(args.runs):
            n, took = consumer_rate(g, args.queues)
            print(f"run {run}: consumer {n:,} in {took:.2f} s = {n / took:,.0f} msg/s")
            t = time.perf_counter()
            row = reader().load().selectExpr("count(*) as n", "sum(length(body)) as b").collect()[0]
            spark_s = time.perf_counter() - t
            print(
                f"run {run}: spark    {row.n:,} in {spark_s:.2f} s = {row.n / spark_s:,.0f} msg/s; "
                f"ratio spark/consumer {(row.n / spark_s) / (n / took):.2f}"
            )
        spark.stop()
    finally:
        grp.stop_group(g)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
