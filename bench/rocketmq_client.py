"""Benchmark: what RocketMQ 5 compatibility costs. The official client (``rocketmq-python-client``, unchanged)
against our own client, on the same three-node broker group (separate processes on 127.0.0.1, flush "sync"),
in the same run, alternating which goes first in every round so that machine drift hits both alike.

Per round, 1 KiB messages:

- sequential send: the official ``Producer.send`` one message at a time, against our ``Producer.send``;
- concurrent send, ``--inflight`` sends outstanding: the official ``Producer.send_async`` (a window of futures),
  against one of our ``Producer`` objects shared by as many threads, each sending one message at a time (our
  client has no async send; the same number of sends are in flight);
- consume: the official ``SimpleConsumer`` receiving batches of 32 and acknowledging every message (one
  ``AckMessage`` each, through the log: the protocol's way), one ack at a time, then again (another group) with
  each batch's acks sent at once (from a thread pool); against our ``Consumer`` pulling 32 at a time and committing
  the group's offset after every batch (also through the log). Each side consumes what it sent.

Prints messages/s per round, the medians with [min-max], and the ratio official / ours (below 1: the official
client is slower). Every process started is stopped by its pid at the end, also on failure.

    python -m bench.rocketmq_client [--rounds 3] [--messages 600] [--inflight 16] [--dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from broker_adapter.client import BrokerConnection, Consumer
from broker_adapter.client import Producer as OurProducer
from broker_adapter.rocketmq import ensure_event_loop
from dledger import group as grp

BODY = bytes(range(256)) * 4  # 1 KiB
QUEUES = 4


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _message(topic: str, i: int) -> Message:
    m = Message()
    m.topic = topic
    m.body = BODY
    m.tag = "bench"
    m.keys = f"k{i}"
    return m


def official_send(cfg: ClientConfiguration, topic: str, n: int) -> float:
    ensure_event_loop()
    p = Producer(cfg, (topic,))
    p.startup()
    try:
        p.send(_message(topic, -1))  # warm: route and connection
        t0 = time.perf_counter()
        for i in range(n):
            p.send(_message(topic, i))
        return rate(n, time.perf_counter() - t0)
    finally:
        p.shutdown()


def official_send_async(cfg: ClientConfiguration, topic: str, n: int, inflight: int) -> float:
    ensure_event_loop()
    p = Producer(cfg, (topic,))
    p.startup()
    try:
        p.send(_message(topic, -1))
        pending: set = set()
        t0 = time.perf_counter()
        for i in range(n):
            if len(pending) >= inflight:
                done, pending = wait(pending, return_when="FIRST_COMPLETED")
                for f in done:
                    f.result()  # a failed send fails the benchmark: nothing is counted that was not acked
            pending.add(p.send_async(_message(topic, i)))
        for f in pending:
            f.result()
        return rate(n, time.perf_counter() - t0)
    finally:
        p.shutdown()


def our_send(addresses: list[str], topic: str, n: int) -> float:
    with OurProducer(addresses) as p:
        p.send(topic, BODY, tags="bench", keys=["k-1"])
        t0 = time.perf_counter()
        for i in range(n):
            p.send(topic, BODY, tags="bench", keys=[f"k{i}"])
        return rate(n, time.perf_counter() - t0)


def our_send_concurrent(addresses: list[str], topic: str, n: int, inflight: int) -> float:
    with OurProducer(addresses) as p, ThreadPoolExecutor(inflight) as pool:
        p.send(topic, BODY)
        t0 = time.perf_counter()
        for f in [pool.submit(p.send, topic, BODY, "bench", [f"k{i}"]) for i in range(n)]:
            f.result()
        return rate(n, time.perf_counter() - t0)


def official_consume(
    cfg: ClientConfiguration, topic: str, group: str, n: int, concurrent_acks: bool = False
) -> float:
    """Receive and ack ``n`` messages (the topic holds exactly the ones this side sent): one ack at a time, or
    every ack of a received batch in flight at once from a thread pool, then the next receive. (The client's
    ``ack_async`` returns None in 5.1.2 instead of its future, so nothing could wait for those acks.)"""
    pool = ThreadPoolExecutor(32) if concurrent_acks else None
    ensure_event_loop()
    c = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1)
    c.startup()
    try:
        got = 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            batch = c.receive(32, 30)
            if pool is not None:
                list(pool.map(c.ack, batch))
            else:
                for m in batch:
                    c.ack(m)
            got += len(batch)
        return rate(got, time.perf_counter() - t0)
    finally:
        c.shutdown()
        if pool is not None:
            pool.shutdown()


def our_consume(addresses: list[str], topic: str, group: str, n: int) -> float:
    with Consumer(addresses, group) as c:
        got = 0
        t0 = time.perf_counter()
        for _ in c.messages(topic, batch=32, idle_s=1.0, limit=n):
            got += 1
        return rate(got, time.perf_counter() - t0)


def _alternate(round_no: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[float, float]:
    """Run a then b on even rounds, b then a on odd ones; returns (a's figure, b's figure)."""
    if round_no % 2 == 0:
        ra = a()
        return ra, b()
    rb = b()
    return a(), rb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=600, help="messages per side per measurement")
    ap.add_argument("--inflight", type=int, default=16, help="sends outstanding in the concurrent runs")
    ap.add_argument("--dir", type=Path, default=None, help="group directory (default: a temporary one)")
    args = ap.parse_args()
    tmp = None
    d = args.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-rmq-")
        d = Path(tmp.name)
    g, _ = grp.up(d, 3, None, state_machine="broker")
    try:
        grp.wait_for_all(g, 30)
        addrs = g.addresses
        cfg = ClientConfiguration(";".join(addrs), Credentials(), request_timeout=10)
        n, w = args.messages, args.inflight
        rows: dict[str, list[tuple[float, float]]] = {}
        print(f"3-node broker group, flush sync, 1 KiB bodies, {n} messages per side per measurement")
        print(f"{'round':<7}{'workload':<24}{'official msg/s':>16}{'ours msg/s':>13}{'ratio':>8}")
        with BrokerConnection(addrs) as c:
            for r in range(args.rounds):
                t_off, t_our = f"rmq-official-{r}", f"rmq-ours-{r}"  # one topic per side and round
                c.create_topic(t_off, QUEUES)
                c.create_topic(t_our, QUEUES)
                # The senders put n + 1 (warm-up) messages, and the concurrent ones another n + 1.
                pairs = [
                    ("send", partial(official_send, cfg, t_off, n), partial(our_send, addrs, t_our, n)),
                    (
                        f"send, {w} in flight",
                        partial(official_send_async, cfg, t_off, n, w),
                        partial(our_send_concurrent, addrs, t_our, n, w),
                    ),
                    (
                        "consume, ack each",
                        partial(official_consume, cfg, t_off, f"g-off-{r}", 2 * n + 2),
                        partial(our_consume, addrs, t_our, f"g-our-{r}", 2 * n + 2),
                    ),
                    (  # other groups: every message again
                        "consume, acks at once",
                        partial(official_consume, cfg, t_off, f"g-off-async-{r}", 2 * n + 2, True),
                        partial(our_consume, addrs, t_our, f"g-our-again-{r}", 2 * n + 2),
                    ),
                ]
                for name, official, ours in pairs:
                    a, b = _alternate(r, official, ours)
                    rows.setdefault(name, []).append((a, b))
                    print(f"{r + 1:<7}{name:<24}{a:>16,.0f}{b:>13,.0f}{a / b:>8.2f}")
        print()
        print("medians over the rounds [min-max]; ratio = official / ours")
        print(f"{'workload':<24}{'official msg/s':>26}{'ours msg/s':>26}{'ratio':>8}")
        for name, vals in rows.items():
            off = [a for a, _ in vals]
            our = [b for _, b in vals]
            mo, mu = statistics.median(off), statistics.median(our)
            print(
                f"{name:<24}{f'{mo:,.0f} [{min(off):,.0f}-{max(off):,.0f}]':>26}"
                f"{f'{mu:,.0f} [{min(our):,.0f}-{max(our):,.0f}]':>26}{mo / mu:>8.2f}"
            )
    finally:
        grp.stop_group(g)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
