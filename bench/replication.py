"""Replication benchmark: a three-node local group (real processes), 1 KiB bodies, both flush policies.

    python -m bench.replication                 # default run: a few minutes
    python -m bench.replication --quick         # smoke run (~1 min)
    python -m bench.replication --soak-s 60     # add the 60 s full-load run (leader changes must be 0)

Reports committed appends/s with 1, 16 and 64 concurrent clients and client batches of 1 and 100, p50/p99
latency per call, failover (kill -9 the leader under load, N rounds: time to a new leader and to the next
successful append, median and max) and leader changes under full load. Every figure is printed next to:

- baselines measured in this run on this machine: fdatasync'd 1 KiB writes/s in the same directory (what a
  naive "fsync per entry" design could reach) and unary gRPC calls/s to a node (Metadata, the cost of one call
  with no Raft work), so the ratios say how much batching and pipelining buy;
- the peers measured on this kind of machine (../shared/anchors/README.md): etcd 3.4 (fsyncs): ~990 puts/s with
  one client, ~3,500 with 16, ~5,500 with 64; leader kill to first write: median ~410 ms, max ~750 ms.

The load client is one process (this one) with one ``AsyncDLedgerClient``: concurrent appends share one
bidirectional stream, as the client library does for any concurrent caller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dledger import group as grp
from dledger.client import AsyncDLedgerClient
from dledger.errors import DLedgerError, OutcomeUnknownError

ETCD = {1: 990, 16: 3500, 64: 5500}
ETCD_FAILOVER_MEDIAN_MS = 410
ETCD_FAILOVER_MAX_MS = 750
BODY = 1024


@dataclass
class LoadResult:
    flush: str
    clients: int
    batch: int
    seconds: float
    entries: int
    calls: int
    p50_ms: float
    p99_ms: float
    errors: int
    leader_changes: int

    @property
    def rate(self) -> float:
        return self.entries / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def term_of_leader(c: AsyncDLedgerClient) -> tuple[str, int]:
    info = await c.find_leader()
    return info.node_id, info.term


async def load(
    g: grp.GroupSpec, clients: int, batch: int, seconds: float, warmup_s: float = 1.0
) -> LoadResult:
    body = os.urandom(BODY)
    bodies = [body] * batch
    lat: list[float] = []
    entries = calls = errors = 0
    async with AsyncDLedgerClient(g.addresses, g.name, timeout_s=10, rpc_timeout_s=5) as c:
        leader0, term0 = await term_of_leader(c)
        loop = asyncio.get_running_loop()
        t_start = loop.time() + warmup_s
        t_end = t_start + seconds

        async def worker() -> None:
            nonlocal entries, calls, errors
            while True:
                t0 = loop.time()
                if t0 >= t_end:
                    return
                try:
                    if batch == 1:
                        await c.append(body)
                    else:
                        await c.append_batch(bodies)
                except DLedgerError:
                    errors += 1
                    continue
                t1 = loop.time()
                if t0 >= t_start and t1 <= t_end:
                    lat.append(t1 - t0)
                    entries += batch
                    calls += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
        leader1, term1 = await term_of_leader(c)
    return LoadResult(
        g.flush,
        clients,
        batch,
        seconds,
        entries,
        calls,
        pct(lat, 0.5) * 1000,
        pct(lat, 0.99) * 1000,
        errors,
        (term1 - term0) + (leader1 != leader0 and term1 == term0),
    )


async def failover_rounds(g: grp.GroupSpec, rounds: int, clients: int = 16) -> list[grp.Failover]:
    out: list[grp.Failover] = []
    for _ in range(rounds):
        stop = asyncio.Event()
        async with AsyncDLedgerClient(g.addresses, g.name, timeout_s=10, rpc_timeout_s=2) as c:

            async def worker(stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        await c.append(b"x" * BODY)
                    except (OutcomeUnknownError, DLedgerError):
                        await asyncio.sleep(0.001)

            tasks = [asyncio.create_task(worker()) for _ in range(clients)]
            await asyncio.sleep(
                0.5
            )  # load running before the kill (a load phase, not a wait for a condition)
            f = await grp.kill_leader_async(g)
            out.append(f)
            stop.set()
            await asyncio.gather(*tasks)
            # Bring the killed node back and let it catch up before the next round.
            grp.start_node(g.node(f.killed))
            top = (await c.find_leader()).commit_index
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    info = await c.metadata(g.node(f.killed).address)
                    if info.commit_index >= top:
                        break
                except DLedgerError:
                    pass
                await asyncio.sleep(0.05)
    return out


def fsync_baseline(directory: Path, seconds: float = 2.0) -> float:
    """fdatasync'd 1 KiB appends per second in ``directory`` (the naive one-fsync-per-entry ceiling)."""
    path = directory / "fsync-baseline"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    rec = os.urandom(BODY)
    n = 0
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            os.write(fd, rec)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
        path.unlink()
    return n / (time.monotonic() - t0)


async def unary_baseline(address: str, concurrency: int, seconds: float = 2.0) -> float:
    """Unary gRPC calls per second to a node (Metadata: one call, no Raft work)."""
    n = 0
    async with AsyncDLedgerClient([address], timeout_s=5) as c:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def worker() -> None:
            nonlocal n
            while loop.time() < end:
                await c.metadata(address)
                n += 1

        t0 = loop.time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (loop.time() - t0)


def fmt_ratio(x: float, base: float) -> str:
    return f"{x / base:5.2f}x" if base else "  n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per load point")
    ap.add_argument("--rounds", type=int, default=10, help="failover rounds (sync policy)")
    ap.add_argument(
        "--soak-s", type=float, default=0.0, help="a full-load run of this length (64 x 100, sync)"
    )
    ap.add_argument("--flush", choices=["sync", "async", "both"], default="both")
    ap.add_argument("--quick", action="store_true", help="2 s per point, 3 failover rounds")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 2.0, 3
    policies = ["sync", "async"] if args.flush == "both" else [args.flush]
    points = [(1, 1), (16, 1), (64, 1), (1, 100), (16, 100), (64, 100)]

    results: list[LoadResult] = []
    failovers: list[grp.Failover] = []
    soak: LoadResult | None = None
    # One event loop for every measurement: grpc.aio's poller keeps posting to the loop it started on, and a
    # fresh asyncio.run() per point leaves it calling into closed loops ("Event loop is closed" noise).
    with tempfile.TemporaryDirectory(prefix="dledger-bench-") as tmp, asyncio.Runner() as runner:
        root = Path(tmp)
        fsync_rate = fsync_baseline(root)
        print(f"baseline: fdatasync'd 1 KiB writes in {root}: {fsync_rate:,.0f}/s")
        for policy in policies:
            g = grp.create(root / policy, 3, None, flush=policy)
            try:
                for spec in g.nodes:
                    grp.start_node(spec)
                grp.wait_for_leader(g)
                if policy == policies[0]:
                    lead = grp.leader_of(grp.status(g))
                    u1 = runner.run(unary_baseline(lead.address, 1))
                    u64 = runner.run(unary_baseline(lead.address, 64))
                    print(
                        f"baseline: unary gRPC calls to the leader: {u1:,.0f}/s (1 caller), {u64:,.0f}/s (64)"
                    )
                for clients, batch in points:
                    r = runner.run(load(g, clients, batch, args.seconds))
                    results.append(r)
                    print(
                        f"{policy:5} clients={clients:3} batch={batch:3}: {r.rate:9,.0f} entries/s  "
                        f"p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:7.2f} ms  errors {r.errors}  "
                        f"leader changes {r.leader_changes}",
                        flush=True,
                    )
                if policy == "sync" and args.rounds:
                    failovers = runner.run(failover_rounds(g, args.rounds))
                    for f in failovers:
                        print(
                            f"failover: killed {f.killed}, {f.new_leader} leads after {f.to_leader_s * 1000:.0f} ms, "
                            f"append after {f.to_append_s * 1000:.0f} ms",
                            flush=True,
                        )
                if policy == "sync" and args.soak_s:
                    soak = runner.run(load(g, 64, 100, args.soak_s))
                    print(
                        f"soak {args.soak_s:.0f} s at 64 x 100: {soak.rate:,.0f} entries/s, "
                        f"leader changes {soak.leader_changes}",
                        flush=True,
                    )
            finally:
                grp.stop_group(g)

    print()
    print(
        "| flush | clients | batch | entries/s | p50 ms | p99 ms | vs etcd (same clients) | vs fsync/entry | vs unary calls |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        etcd = ETCD[r.clients]
        unary = u1 if r.clients == 1 else u64
        print(
            f"| {r.flush} | {r.clients} | {r.batch} | {r.rate:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
            f"{fmt_ratio(r.rate, etcd)} | {fmt_ratio(r.rate, fsync_rate)} | {fmt_ratio(r.rate, unary)} |"
        )
    if failovers:
        leader_ms = [f.to_leader_s * 1000 for f in failovers]
        append_ms = [f.to_append_s * 1000 for f in failovers]
        med, mx = statistics.median(append_ms), max(append_ms)
        print()
        print(
            f"failover over {len(failovers)} rounds (sync, 16 clients): new leader median "
            f"{statistics.median(leader_ms):.0f} ms max {max(leader_ms):.0f} ms; next append median {med:.0f} ms "
            f"max {mx:.0f} ms; vs etcd (410 / 750 ms): {med / ETCD_FAILOVER_MEDIAN_MS:.2f}x / "
            f"{mx / ETCD_FAILOVER_MAX_MS:.2f}x of its time (lower is better)"
        )
    total_changes = sum(r.leader_changes for r in results) + (soak.leader_changes if soak else 0)
    print(f"leader changes during load runs: {total_changes}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "fsync_baseline": fsync_rate,
                    "unary_baseline": {"1": u1, "64": u64},
                    "load": [asdict(r) | {"rate": r.rate} for r in results],
                    "failover": [asdict(f) for f in failovers],
                    "soak": asdict(soak) if soak else None,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
