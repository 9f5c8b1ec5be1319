"""Benchmark: CPU per message of every process (leader, followers, client) for broker sends against raw log
appends, in the same run (issue 15: on a small machine the broker's throughput is bounded by CPU per message,
not by latency).

One real three-node group (separate processes on 127.0.0.1, 1 KiB bodies); workloads, alternating round by
round:

- ``send-64``: 64 asyncio tasks on one ``AsyncProducer``, one message per call;
- ``append-64``: the same on one ``AsyncDLedgerClient`` (the baseline);
- ``send-batch``: one task calling ``AsyncProducer.send_batch`` of 256;
- ``append-batch``: one task calling ``AsyncDLedgerClient.append_batch`` of 256 (the baseline).

CPU is read from ``/proc/PID/stat`` (user + system, every thread) of each node before and after the window, and
from ``os.times()`` for the client (this process). Printed: msg/s and microseconds of CPU per message per
process, and the ratio broker / raw per process. Throughput moves with the machine's load; CPU per message far
less, so compare those. With ``--profile DIR`` each node is also sampled with py-spy (raw collapsed stacks).

    python -m bench.cpu_per_message [--seconds 5] [--rounds 2] [--flush sync|async] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.proc_cpu import cpu_seconds
from broker_adapter.client import AsyncProducer, BrokerConnection
from dledger import group as grp
from dledger.client import AsyncDLedgerClient

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench-cpu"
BATCH = 256
WORKLOADS = ("send-64", "append-64", "send-batch", "append-batch")
SPY = ("py-spy", "record", "--nonblocking", "-r", "100", "-f", "raw")
BASELINE = {"send-64": "append-64", "send-batch": "append-batch"}


def _client(workload: str, addresses: list[str]) -> tuple[object, Callable[[], Awaitable[int]], int]:
    """(client, one operation returning the messages it carried, concurrent tasks)."""
    if workload.startswith("send"):
        p = AsyncProducer(addresses)
        if workload == "send-64":
            return p, lambda: _one(p.send(TOPIC, BODY)), 64
        return p, lambda: _many(p.send_batch(TOPIC, [BODY] * BATCH)), 1
    c = AsyncDLedgerClient(addresses)
    if workload == "append-64":
        return c, lambda: _one(c.append(BODY)), 64
    return c, lambda: _many(c.append_batch([BODY] * BATCH)), 1


async def _one(call: Awaitable[object]) -> int:
    await call
    return 1


async def _many(call: Awaitable[list]) -> int:
    return len(await call)


async def _measure(
    workload: str, g: grp.GroupSpec, seconds: float, profile: Path | None, rnd: int
) -> dict[str, float]:
    client, op, tasks = _client(workload, g.addresses)
    await op()  # channels, the leader and the topic's queues, before the clock runs
    leader = (await grp.wait_for_leader_async(g, 30.0)).id
    pids = {s.id: grp.read_pid(s) for s in g.nodes}
    spies = []
    if profile is not None:
        for nid, pid in pids.items():
            role = "leader" if nid == leader else "follower"
            out = profile / f"r{rnd}-{workload}-{role}-{nid}.txt"
            spies.append(
                subprocess.Popen(
                    [*SPY, "-d", str(int(seconds)), "-o", str(out), "-p", str(pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    loop = asyncio.get_running_loop()
    before = {nid: cpu_seconds([pid]) for nid, pid in pids.items() if pid}
    me = os.times()
    count = 0
    stop_at = loop.time() + seconds

    async def work() -> None:
        nonlocal count
        while loop.time() < stop_at:
            n = await op()  # not ``count += await op()``: that reads count before the await
            count += n

    t0 = loop.time()
    await asyncio.gather(*(work() for _ in range(tasks)))
    elapsed = loop.time() - t0
    mine = os.times()
    row = {"msg/s": count / elapsed}
    followers = []
    for nid, pid in pids.items():
        if pid:
            us = (cpu_seconds([pid]) - before[nid]) * 1e6 / max(count, 1)
            if nid == leader:
                row["leader"] = us
            else:
                followers.append(us)
    row["followers"] = statistics.mean(followers) if followers else float("nan")
    row["client"] = ((mine.user + mine.system) - (me.user + me.system)) * 1e6 / max(count, 1)
    row["total"] = row["leader"] + 2 * row["followers"] + row["client"]
    for s in spies:
        s.wait()
    await client.close()  # type: ignore[attr-defined]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy raw profiles of each node go here")
    args = ap.parse_args(argv)
    if args.profile is not None:
        if shutil.which("py-spy") is None:
            raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
    figures: dict[str, list[dict[str, float]]] = {w: [] for w in WORKLOADS}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        g, _ = grp.up(Path(tmp), 3, None, state_machine="broker", flush=args.flush)
        try:
            with BrokerConnection(g.addresses) as c:
                c.create_topic(TOPIC, 4)
            print(
                f"3-node group, flush {args.flush}, 1 KiB bodies; CPU in microseconds per message", flush=True
            )
            for rnd in range(args.rounds):
                for w in WORKLOADS:
                    row = asyncio.run(_measure(w, g, args.seconds, args.profile, rnd))
                    figures[w].append(row)
                    print(
                        f"round {rnd + 1} {w:<13} {row['msg/s']:>8,.0f} msg/s  leader {row['leader']:6.1f}  "
                        f"follower {row['followers']:6.1f}  client {row['client']:6.1f}  total {row['total']:6.1f}",
                        flush=True,
                    )
        finally:
            grp.stop_group(g)
    print()
    med = {w: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for w, rows in figures.items()}
    for w, m in med.items():
        print(
            f"{w:<13} median {m['msg/s']:>8,.0f} msg/s  leader {m['leader']:6.1f}  follower {m['followers']:6.1f}  "
            f"client {m['client']:6.1f}  total {m['total']:6.1f} us/msg"
        )
    print()
    for w, base in BASELINE.items():
        a, b = med[w], med[base]
        print(
            f"{w} / {base}: throughput {a['msg/s'] / b['msg/s']:.2f}x, CPU per message: leader "
            f"{a['leader'] / b['leader']:.2f}x, follower {a['followers'] / b['followers']:.2f}x, total "
            f"{a['total'] / b['total']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
