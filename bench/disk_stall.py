"""Benchmark: a disk that stalls every follower's fdatasync at once, with a leader that steps down after one
check-quorum period without a quorum heard (the thesis' rule) against two (the node's default; docs/raft.md,
"Check-quorum").

Since 2026-11-29 (decision 0031) heartbeats and their answers leave while a write is in progress, and a write
slower than 50 ms sends a follower's fdatasync off its event loop for 30 s: the first stall of a run is taken
inline (its step-down, if any, is that one), the ones after it are not an election at either setting. ``slow``
counts the nodes' entries into that mode.

Three nodes on one machine share one disk: under ``flush = "sync"`` at full load a stall of the disk holds both
followers' event loops in their fdatasync together, and a leader that then hears no one for one period steps down.
Here the stall is injected, so every run sees the same ones: a real 3-node group (``sync``, processes on
127.0.0.1, started through the fault launcher ``dledger.chaos.faultnode``) takes ``--writers`` concurrent 1 KiB
appends while, once a second, both followers' next fdatasync sleeps ``--stall-ms`` (``faultnode.stall_sync``).
Each setting of ``[raft] check_quorum_periods`` gets its own group, the settings alternating round by round.
Printed per run: appends a second, appends that failed (a leader change under them), the leaders' step-downs
(their logs) and the term at the end.

``--stalled leader`` stalls the first leader's fdatasync instead (before decision 0031 its heartbeats waited for
its write, and the followers' election timeouts ran out), ``--stalled all`` every node's.

    python -m bench.disk_stall [--stall-ms 250] [--stalls 5] [--rounds 2] [--periods 1,2] [--writers 16]
                               [--stalled followers|leader|all]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dledger import group as grp
from dledger.chaos import faultnode
from dledger.client import AsyncDLedgerClient
from dledger.core.config import RaftConfig
from dledger.errors import ConfigError

BODY = b"x" * 1024
LAUNCHER = "dledger.chaos.faultnode"
WHOSE = {"followers": "both followers'", "leader": "the first leader's", "all": "every node's"}


async def _load(
    g: grp.GroupSpec, stalled: list[grp.NodeSpec], args: argparse.Namespace
) -> tuple[int, int, float]:
    """(appends, failed appends, seconds) while the ``stalled`` nodes stall ``args.stalls`` times, a second
    apart."""
    async with AsyncDLedgerClient(g.addresses, g.name, timeout_s=20) as c:
        await c.append(b"warm-up")
        stop = time.monotonic() + 1.0 + args.stalls
        done = failed = 0

        async def writer() -> None:
            nonlocal done, failed
            while time.monotonic() < stop:
                try:
                    await c.append(BODY)
                    done += 1
                except Exception:  # a leader change under the append: counted, the load goes on
                    failed += 1

        async def stalls() -> None:
            for _ in range(args.stalls):
                await asyncio.sleep(1.0)
                at = time.time() + 0.02
                for n in stalled:  # the first sync of each after the same instant
                    faultnode.stall_sync(n.data_dir, at, args.stall_ms)

        t0 = time.monotonic()
        await asyncio.gather(stalls(), *(writer() for _ in range(args.writers)))
        return done, failed, time.monotonic() - t0


def _untaken(stalled: list[grp.NodeSpec]) -> int:
    """Stalls no fdatasync took (a node not started through the fault launcher would take none)."""
    return sum(faultnode.stall_path(n.data_dir).exists() for n in stalled)


def run_one(root: Path, periods: int, args: argparse.Namespace) -> dict[str, float]:
    d = root / f"p{periods}-{time.monotonic_ns()}"
    g = grp.create(d, 3, None, flush="sync", raft={"check_quorum_periods": periods})
    try:
        for spec in g.nodes:
            grp.start_node(spec, LAUNCHER)
        lead = grp.wait_for_leader(g, 30.0).id
        stalled = {
            "followers": [n for n in g.nodes if n.id != lead],
            "leader": [n for n in g.nodes if n.id == lead],
            "all": list(g.nodes),
        }[args.stalled]
        done, failed, secs = asyncio.run(_load(g, stalled, args))
        untaken = _untaken(stalled)
        logs = [Path(n.data_dir, "node.log").read_text() for n in g.nodes]
        downs = sum(text.count("stepped down") for text in logs)
        slow = sum(text.count("waits for its disk off its event loop") for text in logs)
        terms = [r.term for r in grp.status(g, 1.0) if r.term is not None]
        return {
            "rate": done / secs,
            "failed": failed,
            "step_downs": downs,
            "term": max(terms, default=0),
            "untaken": untaken,
            "slow": slow,
        }
    finally:
        grp.stop_group(g)
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.disk_stall", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stall-ms", type=float, default=250.0, help="each stall (default 250)")
    ap.add_argument("--stalls", type=int, default=5, help="stalls per run, one a second (default 5)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--periods", default="1,2", help="check_quorum_periods settings to compare (default 1,2)")
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument(
        "--stalled",
        choices=("followers", "leader", "all"),
        default="followers",
        help="whose fdatasync stalls: both followers (default), the first leader, or every node",
    )
    args = ap.parse_args(argv)
    try:
        settings = [int(p) for p in args.periods.split(",")]
        for p in settings:
            RaftConfig(check_quorum_periods=p)  # the setting's own check: the range a node accepts
    except (ValueError, ConfigError) as e:
        ap.error(f"--periods {args.periods!r}: {e}")
    if args.stalls < 1 or args.stall_ms <= 0:
        ap.error("--stalls must be >= 1 and --stall-ms > 0")
    load = os.getloadavg()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load {load[0]:.1f}, {os.cpu_count()} CPUs; "
        f"3-node group, flush sync, {args.writers} writers of 1 KiB; {WHOSE[args.stalled]} fdatasync stalled "
        f"{args.stall_ms:.0f} ms, {args.stalls} times a run",
        flush=True,
    )
    rows: dict[int, list[dict[str, float]]] = {p: [] for p in settings}
    root = Path(tempfile.mkdtemp(prefix="dledger-disk-stall-"))
    try:
        for r in range(args.rounds):
            for p in settings[r % len(settings) :] + settings[: r % len(settings)]:
                row = run_one(root, p, args)
                rows[p].append(row)
                print(
                    f"round {r} check_quorum_periods={p}: {row['rate']:,.0f} appends/s, "
                    f"failed {row['failed']:.0f}, step-downs {row['step_downs']:.0f}, term {row['term']:.0f}, "
                    f"stalls not taken {row['untaken']:.0f}, slow {row['slow']:.0f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    for p, rs in rows.items():
        downs = sum(r["step_downs"] for r in rs)
        print(
            f"check_quorum_periods={p}: median {statistics.median(r['rate'] for r in rs):,.0f} appends/s, "
            f"step-downs {downs:.0f} in {len(rs)} runs ({args.stalls * len(rs)} stalls), "
            f"failed appends {sum(r['failed'] for r in rs):.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
