"""Benchmark: do the blocking clients scale with threads the way the async clients scale with tasks?

One real three-node group (separate processes on 127.0.0.1, flush "sync", 1 KiB bodies), one message per call,
64 concurrent callers. In the same run, alternating round by round:

- raw log appends: 64 threads sharing one ``DLedgerClient`` / 64 asyncio tasks on one ``AsyncDLedgerClient`` /
  64 threads with a ``DLedgerClient`` each;
- broker sends: 64 threads sharing one ``Producer`` / 64 asyncio tasks on one ``AsyncProducer``.

It prints msg/s per round and the ratios to the async client (issue 15's target: a blocking client shared by 64
threads at least 0.7x of the async client). On a loaded machine compare ratios, not absolute figures.

    python -m bench.clients [--seconds 3] [--rounds 3] [--callers 64] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker_adapter.client import AsyncProducer, BrokerConnection, Producer
from dledger import group as grp
from dledger.client import AsyncDLedgerClient, DLedgerClient

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench-clients"
QUEUES = 4


def _threads(callers: int, seconds: float, make_op: Callable[[int], Callable[[], object]]) -> float:
    """``callers`` threads, each repeating its operation until ``seconds`` pass; returns operations/s."""
    ops = [make_op(k) for k in range(callers)]
    for op in ops:  # warm every connection before the clock starts
        op()
    counts = [0] * callers
    start = threading.Barrier(callers + 1)
    stop_at = [0.0]

    def work(k: int) -> None:
        op = ops[k]
        start.wait()
        n = 0
        while time.perf_counter() < stop_at[0]:
            op()
            n += 1
        counts[k] = n

    threads = [threading.Thread(target=work, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


async def _tasks(callers: int, seconds: float, op: Callable[[], object]) -> float:
    await op()
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    counts = [0] * callers

    async def work(k: int) -> None:
        while loop.time() < stop_at:
            await op()
            counts[k] += 1

    t0 = loop.time()
    await asyncio.gather(*(work(k) for k in range(callers)))
    return sum(counts) / (loop.time() - t0)


def shared_client(addresses: list[str], callers: int, seconds: float) -> float:
    with DLedgerClient(addresses) as c:
        return _threads(callers, seconds, lambda _k: lambda: c.append(BODY))


def client_per_thread(addresses: list[str], callers: int, seconds: float) -> float:
    clients = [DLedgerClient(addresses) for _ in range(callers)]
    try:
        return _threads(callers, seconds, lambda k: lambda: clients[k].append(BODY))
    finally:
        for c in clients:
            c.close()


def async_client(addresses: list[str], callers: int, seconds: float) -> float:
    async def run() -> float:
        async with AsyncDLedgerClient(addresses) as c:
            return await _tasks(callers, seconds, lambda: c.append(BODY))

    return asyncio.run(run())


def shared_producer(addresses: list[str], callers: int, seconds: float) -> float:
    with Producer(addresses) as p:
        return _threads(callers, seconds, lambda _k: lambda: p.send(TOPIC, BODY))


def async_producer(addresses: list[str], callers: int, seconds: float) -> float:
    async def run() -> float:
        async with AsyncProducer(addresses) as p:
            return await _tasks(callers, seconds, lambda: p.send(TOPIC, BODY))

    return asyncio.run(run())


CASES: dict[str, Callable[[list[str], int, float], float]] = {
    "DLedgerClient shared by the threads": shared_client,
    "AsyncDLedgerClient, one task each": async_client,
    "a DLedgerClient per thread": client_per_thread,
    "Producer shared by the threads": shared_producer,
    "AsyncProducer, one task each": async_producer,
}
RATIOS = [
    ("DLedgerClient shared by the threads", "AsyncDLedgerClient, one task each"),
    ("a DLedgerClient per thread", "AsyncDLedgerClient, one task each"),
    ("Producer shared by the threads", "AsyncProducer, one task each"),
    ("Producer shared by the threads", "AsyncDLedgerClient, one task each"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every case, alternating")
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--dir", type=Path, default=None, help="group directory (default: a temporary one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        d = args.dir or Path(tmp)
        g, _ = grp.up(d, 3, None, state_machine="broker")
        try:
            with BrokerConnection(g.addresses) as c:
                c.create_topic(TOPIC, QUEUES)
            print(
                f"3-node group, flush sync, 1 KiB bodies, {args.callers} concurrent callers, one message a call"
            )
            figures: dict[str, list[float]] = {name: [] for name in CASES}
            for r in range(args.rounds):
                for name, case in CASES.items():
                    figures[name].append(case(g.addresses, args.callers, args.seconds))
                    print(f"round {r + 1}  {name:<38} {figures[name][-1]:>9,.0f} msg/s", flush=True)
            print()
            median = {name: statistics.median(v) for name, v in figures.items()}
            for name, v in median.items():
                print(
                    f"{name:<38} median {v:>9,.0f} msg/s  ({', '.join(f'{x:,.0f}' for x in figures[name])})"
                )
            print()
            for a, b in RATIOS:
                per_round = [x / y for x, y in zip(figures[a], figures[b], strict=True) if y]
                print(
                    f"{a} / {b}: {median[a] / median[b]:.2f}x  (per round {', '.join(f'{x:.2f}' for x in per_round)})"
                )
        finally:
            grp.stop_group(g)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
