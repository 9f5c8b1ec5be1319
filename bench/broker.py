"""Benchmark: the broker on a real three-node group (separate processes on 127.0.0.1, flush "sync").

Measured in one run, each figure next to its baseline:

- produce throughput with 1 KiB messages, batch 1 / 32 / 256 (one producer), against raw DLedger appends of
  bodies of the same encoded size and the same batch size (the issue's target: batched produce within 70% of raw
  append throughput);
- consume throughput: pulls of up to 1024 messages from the leader, against the same node's raw committed reads
  through ``Get`` (issue target: 100k messages/s); ``--consume-only N`` measures only this: ``Consumer.pull``,
  the raw ``Pull`` call decoded by ``broker_adapter.pulled``, and ``Consumer.messages`` (pipelined), each with
  the leader's and the client's CPU per message;
- end-to-end latency: send to delivery to a long-polling consumer, one message at a time (moderate load),
  p50/p99 (issue target: p99 under 20 ms);
- produce (4 producers, batch 32) while the leader is killed with SIGKILL halfway: messages/s per 100 ms, printed
  as before / gap / after and saved as a bar chart PNG (``--png``; the red line marks the kill).

    python -m bench.broker [--scale 1.0] [--dir DIR] [--png FILE] [--failover-s 6] [--consume-only N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.proc_cpu import cpu_seconds
from broker_adapter import pulled
from broker_adapter.client import BrokerConnection, Consumer, Producer
from broker_adapter.core import message
from broker_adapter.v1 import broker_pb2
from dledger import group as grp
from dledger.client import DLedgerClient

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench"
QUEUES = 4


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def raw_append(addresses: list[str], n: int, batch: int, size: int) -> float:
    with DLedgerClient(addresses) as c:
        body = b"r" * size
        c.append_batch([body])  # warm the connection
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            c.append_batch([body] * min(batch, n - i))
        return rate(n, time.perf_counter() - t0)


def produce(addresses: list[str], n: int, batch: int) -> float:
    with Producer(addresses) as p:
        p.send(TOPIC, BODY)
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            p.send_batch(TOPIC, [BODY] * min(batch, n - i))
        return rate(n, time.perf_counter() - t0)


def produce_parallel(addresses: list[str], n: int, batch: int, producers: int) -> float:
    """``producers`` threads, each with its own Producer, sending ``n`` messages in all."""
    per = n // producers
    ps = [Producer(addresses) for _ in range(producers)]
    for p in ps:
        p.send(TOPIC, BODY)

    def work(p: Producer) -> None:
        for i in range(0, per, batch):
            p.send_batch(TOPIC, [BODY] * min(batch, per - i))

    threads = [threading.Thread(target=work, args=(p,)) for p in ps]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    for p in ps:
        p.close()
    return rate(per * producers, dt)


def raw_append_parallel(addresses: list[str], n: int, batch: int, size: int, clients: int) -> float:
    """``clients`` concurrent appenders (tasks on one asyncio client) appending ``n`` bodies in all."""
    from dledger.client import AsyncDLedgerClient

    per = n // clients
    body = b"r" * size

    async def run() -> float:
        c = AsyncDLedgerClient(addresses)
        try:
            await c.append_batch([body])

            async def work() -> None:
                for i in range(0, per, batch):
                    await c.append_batch([body] * min(batch, per - i))

            t0 = time.perf_counter()
            await asyncio.gather(*(work() for _ in range(clients)))
            return rate(per * clients, time.perf_counter() - t0)
        finally:
            await c.close()

    return asyncio.run(run())


def consume(address: str, total_per_queue: list[int]) -> float:
    with Consumer([address], "bench-consume") as c:
        c.pull(TOPIC, 0, 0, 1)
        got = 0
        t0 = time.perf_counter()
        for q, end in enumerate(total_per_queue):
            off = 0
            while off < end:
                msgs = c.pull(TOPIC, q, off, 1024)
                off += len(msgs)
                got += len(msgs)
        return rate(got, time.perf_counter() - t0)


def consume_raw(address: str, total_per_queue: list[int]) -> float:
    """``consume`` at batch granularity: ``PullRequest.raw``, decoded by ``broker_adapter.pulled``."""
    with BrokerConnection([address]) as c:
        got = 0
        t0 = time.perf_counter()
        for q, end in enumerate(total_per_queue):
            off = 0
            while off < end:
                req = broker_pb2.PullRequest(topic=TOPIC, queue_id=q, offset=off, max_messages=1024, raw=True)
                r = c.call("Pull", req, retry_unknown=True)
                msgs = pulled.decode(r.raw, r.raw_count)
                off += len(msgs)
                got += len(msgs)
        return rate(got, time.perf_counter() - t0)


def consume_stream(address: str, total_per_queue: list[int]) -> float:
    """``Consumer.messages`` (batches of 1024): the next queue's pull is under way while this side decodes."""
    with Consumer([address], f"bench-stream-{time.monotonic_ns()}") as c:  # a new group: from the start
        total = sum(total_per_queue)
        got = 0
        t0 = time.perf_counter()
        for _ in c.messages(TOPIC, batch=1024, idle_s=0.5, limit=total):
            got += 1
        return rate(got, time.perf_counter() - t0)


def consume_only(addrs: list[str], leader: grp.NodeStatus, n: int) -> None:
    """Fill the topic with ``n`` messages, then pull them all from the leader: decoded pulls, raw pulls one at a
    time, and ``Consumer.messages`` (pipelined); with the server's (leader process) and this client's CPU per
    message, which the machine's load does not inflate as it does the rates."""
    produce_parallel(addrs, n, 256, 4)
    with BrokerConnection(addrs) as c:
        ends = list({t.topic: t for t in c.list_topics()}[TOPIC].max_offsets)
    total = sum(ends)
    print(
        f"consume {total:,} msgs from the leader, one consumer, pulls of 1024; load {os.getloadavg()[0]:.1f}"
    )
    for _ in range(2):
        for name, run in (("pull()", consume), ("raw Pull", consume_raw), ("messages()", consume_stream)):
            server, client = cpu_seconds([leader.pid]) if leader.pid else 0.0, time.process_time()
            r = run(leader.address, ends)
            server = (cpu_seconds([leader.pid]) - server) if leader.pid else float("nan")
            client = time.process_time() - client
            print(
                f"  {name:<11}{r:>10,.0f} msg/s   server {server / total * 1e6:5.1f} us/msg   "
                f"client {client / total * 1e6:5.1f} us/msg"
            )


def raw_get(addresses: list[str], n: int) -> float:
    with DLedgerClient(addresses) as c:
        last = c.metadata().commit_index
        t0 = time.perf_counter()
        for i in range(max(0, last - n + 1), last + 1):
            c.get(i)
        return rate(min(n, last + 1), time.perf_counter() - t0)


def latency(addresses: list[str], n: int) -> list[float]:
    """Send one message at a time to queue 0; a long-polling consumer records when each arrives."""
    with BrokerConnection(addresses) as c:
        start = {t.topic: t for t in c.list_topics()}[TOPIC].max_offsets[0]
    sent_at: dict[str, float] = {}
    delays: list[float] = []
    done = threading.Event()

    def consumer() -> None:
        with Consumer(addresses, "bench-latency") as c:
            off = start
            while len(delays) < n and not done.is_set():
                for m in c.pull(TOPIC, 0, off, 64, wait_ms=1000):
                    now = time.perf_counter()
                    off = m.queue_offset + 1
                    t = sent_at.get(m.msg_id)
                    if t is not None:
                        delays.append(now - t)

    th = threading.Thread(target=consumer)
    th.start()
    with Producer(addresses) as p:
        for _ in range(n):
            om = p.outgoing(TOPIC, BODY)
            om.queue_id = 0
            sent_at[om.msg_id] = time.perf_counter()
            p.send_messages(TOPIC, [om])
            time.sleep(0.002)  # moderate load: one message every ~2 ms plus the send itself
    deadline = time.monotonic() + 30
    while len(delays) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    th.join(5)
    return delays


def failover_series(
    g: grp.GroupSpec, seconds: float, producers: int = 4, batch: int = 32, bucket_s: float = 0.1
):
    """Produce for ``seconds`` with ``producers`` threads, SIGKILL the leader halfway; returns (msg/s per bucket,
    the bucket of the kill, the killed node)."""
    acks: list[tuple[float, int]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        with Producer(g.addresses, retry_for_s=30) as p:
            while not stop.is_set():
                n = len(p.send_batch(TOPIC, [BODY] * batch))
                with lock:
                    acks.append((time.perf_counter(), n))

    threads = [threading.Thread(target=work) for _ in range(producers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds / 2)
    killed = grp.wait_for_leader(g).id
    grp.kill_node(g.node(killed))
    t_kill = time.perf_counter() - t0
    time.sleep(seconds / 2)
    stop.set()
    for t in threads:
        t.join(60)
    grp.start_node(g.node(killed))
    buckets = [0] * int(seconds / bucket_s + 1)
    for t, n in acks:
        k = int((t - t0) / bucket_s)
        if k < len(buckets):
            buckets[k] += n
    return [b / bucket_s for b in buckets], int(t_kill / bucket_s), killed


def write_bar_png(path: Path, values: list[float], mark: int, height: int = 240, bar_w: int = 6) -> None:
    """A bar chart as a PNG (no plotting library needed): one bar per value, a red line at bucket ``mark``."""
    import struct
    import zlib

    top = max(values) or 1.0
    rows = []
    for y in range(height):
        level = (height - y) / height * top
        row = bytearray(b"\x00")  # PNG filter: none
        for i, v in enumerate(values):
            for x in range(bar_w):
                if i == mark and x < 2:
                    row += b"\xd0\x20\x20"
                elif v >= level and x < bar_w - 1:
                    row += b"\x30\x60\xb0"
                elif y % 60 == 0:
                    row += b"\xd8\xd8\xd8"
                else:
                    row += b"\xff\xff\xff"
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", bar_w * len(values), height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
    png += chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument(
        "--png",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bench-broker-failover.png",
        help="where to save the failover plot",
    )
    ap.add_argument("--failover-s", type=float, default=6.0, help="length of the produce run with a kill")
    ap.add_argument(
        "--consume-only",
        type=int,
        default=0,
        metavar="N",
        help="only the consume figures: decoded, raw and pipelined pulls of N messages, with CPU per message",
    )
    args = ap.parse_args()
    s = args.scale
    tmp = None
    d = args.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-broker-")
        d = Path(tmp.name)
    g, _ = grp.up(d, 3, None, state_machine="broker")
    try:
        addrs = g.addresses
        with BrokerConnection(addrs) as c:
            c.create_topic(TOPIC, QUEUES)
        if args.consume_only:
            consume_only(addrs, grp.wait_for_leader(g), args.consume_only)
            return
        size = message.encoded_size(TOPIC, len(BODY), {"x" * 40: "y" * 120})  # about a real message's size
        print(f"3-node group, flush sync, 1 KiB bodies (~{size} bytes per message entry)")
        print(f"{'run':<28}{'msg/s':>12}{'raw append/s':>16}{'ratio':>9}")
        for batch, n in ((1, int(1000 * s)), (32, int(8192 * s)), (256, int(16384 * s))):
            raw = raw_append(addrs, n, batch, size)
            prod = produce(addrs, n, batch)
            print(f"{'produce batch ' + str(batch):<28}{prod:>12,.0f}{raw:>16,.0f}{prod / raw:>9.2f}")
        n = int(8192 * s)
        raw = raw_append_parallel(addrs, n, 32, size, 16)
        prod = produce_parallel(addrs, n, 32, 16)
        print(f"{'produce batch 32, 16 prod.':<28}{prod:>12,.0f}{raw:>16,.0f}{prod / raw:>9.2f}")
        with BrokerConnection(addrs) as c:
            ends = list({t.topic: t for t in c.list_topics()}[TOPIC].max_offsets)
            leader = grp.wait_for_leader(g).address
        cons = consume(leader, ends)
        raw = raw_get([leader], min(2000, sum(ends)))
        print(
            f"{'consume (pull 1024)':<28}{cons:>12,.0f}{raw:>16,.0f}{cons / raw:>9.2f}   (baseline: raw Get/s)"
        )
        delays = sorted(latency(addrs, int(500 * s)))
        if delays:
            p50 = statistics.median(delays) * 1000
            p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))] * 1000
            print(
                f"end-to-end latency (send -> long-poll delivery), {len(delays)} msgs: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
            )
        series, mark, killed = failover_series(g, args.failover_s)
        before = [v for v in series[:mark] if v > 0]
        after = series[mark + 1 :]
        gap = next((i for i, v in enumerate(after) if v > 0), len(after)) * 0.1
        steady = statistics.median(before) if before else 0.0
        print(
            f"produce while killing leader {killed} (4 producers, batch 32): {steady:,.0f} msg/s before, "
            f"no acks for {gap * 1000:.0f} ms after the kill, {statistics.median(after[-10:]):,.0f} msg/s at the end; "
            f"plot: {args.png}"
        )
        write_bar_png(args.png, series, mark)
    finally:
        grp.stop_group(g)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
