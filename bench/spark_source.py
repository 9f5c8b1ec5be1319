"""Benchmark of the ``dledger`` Spark source and sink (issue 29): a batch read against our own ``Consumer``, where
the read's time goes, and a stream's latency from send to the sink's commit.

    python -m bench.spark_source                        # make bench-spark: 1,000,000 messages of 256 bytes
    python -m bench.spark_source --quick                # smoke run: 50,000 messages, a 5-second stream
    python -m bench.spark_source --messages 200000 --no-latency

A three-node broker group (flush async, a retention policy that keeps every message) is filled once; then, in the
same run, over the same messages:

- consumer: one ``Consumer`` pulls every queue from offset 0 to its end, 1,024 at a time, from the leader, and
  touches each message's body (a raw pull decoded into tuples: the consumer's own per-message cost);
- spark: ``spark.read.format("dledger")`` on ``local[2]`` (or ``--master``), one partition per queue, every
  column built (Arrow batches), ``count(*)`` and ``sum(length(body))`` in Spark. The session start and a first
  small read (Python workers start, imports) are timed apart; the two reads alternate ``--runs`` times.

Each read also reports CPU per message by process, from ``/proc`` (user + system): the leader serving the pulls,
the reader (the consumer's process; Spark's Python workers), and Spark's JVM (the Arrow hand-off, the rows, the
aggregation). CPU moves far less with a shared machine's load than rates do. The stages of the Python reader are
timed apart in this process over one queue (``stages``): the pull (gRPC, client side), the column-wise batch
(``spark/datasource/columns.py``), and the per-message path it replaced, for comparison.

Streaming latency (``latency``): a query with the default trigger reads a topic with the ``dledger`` source and
writes it with the ``dledger`` sink to another topic; a producer sends one message every ``1/--rate`` s, its
send time in the body; the sink is the real one, with its ``commit`` also recording when each epoch (micro-batch)
committed. A message's latency is its epoch's commit time minus its send time (the epoch of an output message is
in its producer id, ``spark-<query>-b<epoch>-p<partition>``). Printed: p50, p99 and max over every message.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.proc_cpu import cpu_seconds
from broker_adapter.client import BrokerConnection, Consumer, Producer
from broker_adapter.core.formats import PROPERTY_PRODUCER_ID
from dledger import group as grp

TOPIC = "bench"
LATENCY_IN, LATENCY_OUT = "bench-stream-in", "bench-stream-out"
PULL = 1024
_STAMP = struct.Struct(">q")
_EPOCH = re.compile(r"-b(\d+)-p\d+")


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


def consumer_read(addresses: list[str], queues: int) -> tuple[int, float]:
    """Every message of the topic pulled and its body touched: (messages, seconds)."""
    started = time.perf_counter()
    n = 0
    with Consumer(addresses, "bench") as c:
        ends = {t.topic: t.max_offsets for t in c.list_topics()}[TOPIC]
        for q in range(queues):
            at = 0
            while at < ends[q]:
                msgs = c.pull(TOPIC, q, at, PULL)
                n += sum(len(m.body) > 0 for m in msgs)
                at = msgs[-1].queue_offset + 1
    return n, time.perf_counter() - started


def _tree() -> dict[int, tuple[str, int]]:
    """Every process under this one: pid -> (command name, parent pid)."""
    procs: dict[int, tuple[str, int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rpartition(")")[2].split()
            procs[int(p.name)] = (name, int(rest[1]))
    out: dict[int, tuple[str, int]] = {}
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid, (name, ppid) in procs.items():
            if ppid == parent and pid not in out:
                out[pid] = (name, ppid)
                todo.append(pid)
    return out


def _with_children(pid: int) -> float:
    """CPU seconds of a process and of its children it has reaped (a Python worker that ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU seconds used so far by the leader, this process, Spark's JVM and its Python workers."""

    def __init__(self, leader: int):
        self.leader = leader

    def now(self) -> dict[str, float]:
        tree = _tree()
        jvm = [p for p, (name, _) in tree.items() if name == "java"]
        workers = [p for p, (_, parent) in tree.items() if parent in jvm]  # pyspark.daemon, reaping workers
        return {
            "leader": cpu_seconds([self.leader]),
            "client": time.process_time(),
            "jvm": cpu_seconds(jvm),
            "workers": sum(_with_children(p) for p in workers)
            + cpu_seconds(p for p, (_, parent) in tree.items() if parent in workers),
        }

    @staticmethod
    def per_message(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
        return {k: (after[k] - before[k]) / n * 1e6 for k in before}


def _us(cpu: dict[str, float], keys: Iterable[str]) -> str:
    return ", ".join(f"{k} {cpu[k]:.2f}" for k in keys) + " us/msg"


def stages(addresses: list[str], queue: int, limit: int) -> dict[str, float]:
    """CPU per message of the Python reader's stages over one queue (this process, warm): the pull, the
    column-wise batch, and the per-message path (decode, then ``queues.to_batch``) for comparison."""
    from broker_adapter.pulled import decode
    from spark.datasource.queues import raw_batch, to_batch

    pull = columns = per_message = 0.0
    n = at = 0
    with Consumer(addresses, "bench") as c:
        while at < limit:
            t0 = time.process_time()
            data, count = c.pull_raw(TOPIC, queue, at, PULL)
            t1 = time.process_time()
            raw_batch("default", TOPIC, data, count)
            t2 = time.process_time()
            to_batch("default", decode(data, count))
            t3 = time.process_time()
            if not count:
                break
            if at:  # the first pull warms the imports and the channel
                pull, columns, per_message = pull + t1 - t0, columns + t2 - t1, per_message + t3 - t2
                n += count
            at += count
    n = max(n, 1)
    return {"pull": pull / n * 1e6, "columns": columns / n * 1e6, "per-message path": per_message / n * 1e6}


def batch_read(args: argparse.Namespace, spark: Any, g: grp.GroupSpec, cpu: Cpu) -> list[float]:
    servers = ",".join(g.addresses)

    def reader() -> Any:  # a new one each time: DataFrameReader.option changes the reader it is called on
        return spark.read.format("dledger").option("addresses", servers).option("topic", TOPIC)

    t = time.perf_counter()
    reader().option("endingOffsets", f'{{"{TOPIC}": {{"0": 10}}}}').load().count()
    print(f"first small read (Python workers start): {time.perf_counter() - t:.1f} s")
    ratios = []
    for run in range(args.runs):
        before = cpu.now()
        n, took = consumer_read(list(g.addresses), args.queues)
        c_cpu = Cpu.per_message(before, cpu.now(), n)
        before = cpu.now()
        t = time.perf_counter()
        row = reader().load().selectExpr("count(*) as n", "sum(length(body)) as b").collect()[0]
        spark_s = time.perf_counter() - t
        s_cpu = Cpu.per_message(before, cpu.now(), row.n)
        if row.n != n or row.b != n * args.size:
            raise SystemExit(f"spark read {row.n} messages ({row.b} body bytes), the consumer {n}")
        ratios.append((row.n / spark_s) / (n / took))
        load = os.getloadavg()[0]
        print(
            f"run {run}: consumer {n:,} in {took:.2f} s = {n / took:,.0f} msg/s "
            f"(CPU {_us(c_cpu, ('leader', 'client'))})\n"
            f"run {run}: spark    {row.n:,} in {spark_s:.2f} s = {row.n / spark_s:,.0f} msg/s "
            f"(CPU {_us(s_cpu, ('leader', 'workers', 'jvm'))})\n"
            f"run {run}: ratio spark/consumer {ratios[-1]:.2f} (load average {load:.1f})"
        )
    st = stages(list(g.addresses), 0, min(args.messages // args.queues, 200_000))
    print("Python reader stages (this process, one queue): " + _us(st, st))
    return ratios


def _timed_source(commits: Path) -> type:
    """The ``dledger`` source whose stream sink also appends ``<epoch> <time ns>`` to ``commits`` when an epoch
    commits (the real sink otherwise: its tasks send and wait for quorum commit)."""
    from spark.datasource.options import write_options
    from spark.datasource.sink import StreamWriter
    from spark.datasource.source import DLedgerSource

    path = str(commits)

    class TimedWriter(StreamWriter):  # type: ignore[misc]
        def commit(self, messages: list[Any], batchId: int) -> None:
            super().commit(messages, batchId)
            with open(path, "a") as f:
                f.write(f"{batchId} {time.time_ns()}\n")

    class TimedSource(DLedgerSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "dledger-timed"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return TimedWriter(write_options(self.options), schema)

    return TimedSource


def latency(args: argparse.Namespace, spark: Any, g: grp.GroupSpec, work: Path) -> dict[str, float]:
    """Send ``rate`` messages a second for ``seconds`` into a stream (source -> sink); per-message latency
    from send to its epoch's commit, in ms."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers import no ``bench``
    servers = ",".join(g.addresses)
    with BrokerConnection(g.addresses) as c:
        c.create_topic(LATENCY_IN, args.queues)
        c.create_topic(LATENCY_OUT, args.queues)
    commits = work / "commits.txt"
    spark.dataSource.register(_timed_source(commits))
    query = (
        spark.readStream.format("dledger")
        .option("addresses", servers)
        .option("topic", LATENCY_IN)
        .option("startingOffsets", "latest")
        .load()
        .select("body")
        .writeStream.format("dledger-timed")
        .option("addresses", servers)
        .option("topic", LATENCY_OUT)
        .option("checkpointLocation", str(work / "checkpoint"))
        .start()
    )
    try:
        deadline = time.monotonic() + 180
        while query.lastProgress is None:  # the first (empty) epoch planned: the query reads from here on
            if time.monotonic() > deadline or query.exception() is not None:
                raise SystemExit(f"the stream did not start: {query.exception()}")
            time.sleep(0.2)
        total = int(args.rate * args.seconds)
        start = time.monotonic()
        _send_at_rate(list(g.addresses), total, args.rate, start)
        sent_s = time.monotonic() - start
        out = _wait_for(list(g.addresses), total, query)
        commit_ns = _commits(commits, out, query)
    finally:
        query.stop()
    latencies = []
    epochs = set()
    for m in out:
        epoch = int(_EPOCH.search(m.properties[PROPERTY_PRODUCER_ID]).group(1))  # type: ignore[union-attr]
        epochs.add(epoch)
        latencies.append((commit_ns[epoch] - _STAMP.unpack_from(m.body)[0]) / 1e6)
    q = statistics.quantiles(latencies, n=100)
    return {
        "messages": len(latencies),
        "rate": total / sent_s,
        "epochs": len(epochs),
        "p50": statistics.median(latencies),
        "p99": q[98],
        "max": max(latencies),
    }


def _send_at_rate(addresses: list[str], total: int, rate: float, start: float) -> None:
    """Message i is sent at ``start + i / rate`` (four senders, so one slow send does not delay the next),
    its send time (ns since the epoch) in its first 8 bytes."""
    senders = 4

    def send(first: int) -> None:
        with Producer(addresses) as p:
            for i in range(first, total, senders):
                wait = start + i / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                p.send(LATENCY_IN, _STAMP.pack(time.time_ns()) + b"x" * 56)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _commits(commits: Path, out: list[Any], query: Any) -> dict[int, int]:
    """epoch -> its commit time (ns), once every epoch that wrote an output message has committed (at most a
    minute after the last message is stored: the epoch commits after its tasks end)."""
    wanted = set()
    for m in out:
        found = _EPOCH.search(m.properties.get(PROPERTY_PRODUCER_ID, ""))
        if found is None:
            raise SystemExit(f"output message {m.msg_id} has no epoch in its producer id")
        wanted.add(int(found.group(1)))
    deadline = time.monotonic() + 60
    while True:
        text = commits.read_text() if commits.exists() else ""
        done = dict((int(a), int(b)) for a, b in (line.split() for line in text.splitlines() if line))
        if wanted <= done.keys():
            return done
        if time.monotonic() > deadline or query.exception() is not None:
            raise SystemExit(f"epochs {sorted(wanted - done.keys())} never committed: {query.exception()}")
        time.sleep(0.1)


def _wait_for(addresses: list[str], total: int, query: Any) -> list[Any]:
    """Every message of the output topic once ``total`` are there (at most two minutes)."""
    deadline = time.monotonic() + 120
    with Consumer(addresses, "bench") as c:
        while True:
            ends = {t.topic: t.max_offsets for t in c.list_topics()}[LATENCY_OUT]
            if sum(ends) >= total:
                break
            if time.monotonic() > deadline or query.exception() is not None:
                raise SystemExit(f"the stream wrote {sum(ends)} of {total}: {query.exception()}")
            time.sleep(0.2)
        out = []
        for q, end in enumerate(ends):
            at = 0
            while at < end:
                msgs = c.pull(LATENCY_OUT, q, at, PULL)
                out += msgs
                at = msgs[-1].queue_offset + 1
    if len(out) != total:
        raise SystemExit(f"the stream wrote {len(out)} messages for {total} sent")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rate", type=float, default=200.0, help="streaming: messages sent per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="streaming: how long the producer sends")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 50,000 messages, one run, 5 s stream")
    ap.add_argument("--no-batch", action="store_true", help="skip the batch read")
    ap.add_argument("--no-latency", action="store_true", help="skip the streaming latency")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.runs, args.seconds = 50_000, 1, 5.0
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    g = grp.create(work / "g", 3, None, state_machine="broker", flush="async")
    for n in g.nodes:  # a retention policy that keeps everything: snapshots then compact nothing away
        with open(n.config, "a") as f:
            f.write("\n[broker]\nretention_hours = 10000\n")
    for n in g.nodes:
        grp.start_node(n)
    leader = grp.wait_for_leader(g, 30)
    try:
        print(f"load average {os.getloadavg()[0]:.1f} at the start; leader {leader.id} (pid {leader.pid})")
        if not args.no_batch:
            t = time.perf_counter()
            fill(g, args.messages, args.size, args.queues)
            print(f"filled {args.messages:,} messages of {args.size} B in {time.perf_counter() - t:.1f} s")
        from spark.datasource import register
        from spark.session import build_session

        t = time.perf_counter()
        spark = build_session(args.master, app_name="bench-spark")
        register(spark)
        print(f"spark session: {time.perf_counter() - t:.1f} s")
        if not args.no_batch:
            ratios = batch_read(args, spark, g, Cpu(leader.pid or 0))
            print(
                f"batch read: ratio spark/consumer best {max(ratios):.2f}, runs {[round(r, 2) for r in ratios]}"
            )
        if not args.no_latency:
            r = latency(args, spark, g, work)
            print(
                f"streaming latency, send to the sink's epoch commit: {r['messages']:,.0f} messages at "
                f"{r['rate']:.0f} msg/s in {r['epochs']:.0f} epochs: p50 {r['p50']:.0f} ms, p99 {r['p99']:.0f} ms, "
                f"max {r['max']:.0f} ms (load average {os.getloadavg()[0]:.1f})"
            )
        spark.stop()
    finally:
        grp.stop_group(g)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
