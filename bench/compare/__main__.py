"""Run the comparison: ``python -m bench.compare [--quick] [--out DIR]`` (also ``make bench-compare``).

Phases, each system started fresh for each phase and stopped before the next one starts (so only the system
under test uses the machine):

1. throughput rounds: in each round every system runs workloads 1-3 in turn; the order of the systems rotates
   from round to round (A B C, B C A, ...), so drift of the shared machine hits all of them alike;
2. failover: N kill -9 rounds per system (ours with ``sync``; the flush policy does not change an election);
3. stability: one full-load run per system, the leader polled every 100 ms.

Then the tables are printed and written, with the JSON and the PNG, to ``--out``. Every process started is
stopped by its pid at the end, also on failure (try/finally, and atexit for the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.compare import report
from bench.compare import workloads as wl
from bench.compare.base import ProcessRegistry, System
from bench.compare.ours import OursSystem

ALL_SYSTEMS = ("ours-sync", "ours-async", "ours-broker-sync", "etcd", "pysyncobj")
FAILOVER_SYSTEMS = ("ours-sync", "etcd", "pysyncobj")
STABILITY_SYSTEMS = ("ours-sync", "ours-async", "etcd", "pysyncobj")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} vCPU ({cpu}), {mem_gib:.0f} GiB, {platform.system()} {platform.release()}"


def build_systems(
    names: list[str], registry: ProcessRegistry, install: bool
) -> tuple[list[System], list[str]]:
    notes: list[str] = []
    systems: list[System] = []
    for name in names:
        if name == "ours-sync":
            systems.append(OursSystem(registry, "sync"))
        elif name == "ours-async":
            systems.append(OursSystem(registry, "async"))
        elif name == "ours-broker-sync":
            systems.append(OursSystem(registry, "sync", broker=True))
        elif name == "etcd":
            from bench.compare.etcd import EtcdSystem, find_etcd

            binary, note = find_etcd(install)
            notes.append(note)
            if binary:
                systems.append(EtcdSystem(registry, binary))
                notes.append(f"etcd version {systems[-1].version}")
        elif name == "pysyncobj":
            try:
                version = importlib.metadata.version("pysyncobj")
            except importlib.metadata.PackageNotFoundError:
                notes.append("pysyncobj is not installed (pip install '.[bench]'); PySyncObj is skipped")
                continue
            from bench.compare.pysyncobj_group import PySyncObjSystem

            systems.append(PySyncObjSystem(registry))
            notes.append(f"pysyncobj {version}")
        else:
            raise SystemExit(f"unknown system {name!r}; choose from {', '.join(ALL_SYSTEMS)}")
    return systems, notes


async def run(args: argparse.Namespace, systems: list[System], root: Path) -> dict:
    loads: list[wl.LoadResult] = []
    failovers: list[wl.FailoverResult] = []
    stability: list[wl.LoadResult] = []
    n = 0

    @contextlib.asynccontextmanager
    async def phase(system: System, label: str):
        """Start ``system`` fresh in its own directory; stop it after. The directory (data, logs) is deleted
        when the phase succeeded and kept, and named, when it failed."""
        nonlocal n
        n += 1
        workdir = root / f"{n:03d}-{label}"
        workdir.mkdir()
        ok = False
        try:
            await system.start(workdir)
            yield system
            ok = True
        finally:
            await system.stop()
            if ok:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                print(
                    f"{system.name} failed in phase {label}: its data and logs are in {workdir}",
                    file=sys.stderr,
                )

    for rnd in range(args.rounds):
        order = systems[rnd % len(systems) :] + systems[: rnd % len(systems)]
        for system in order:
            async with phase(system, f"round{rnd}"):
                points = [wl.BATCHED] if "broker" in system.name else list(wl.THROUGHPUT_POINTS)
                for point in points:
                    r = await wl.run_load(system, point, args.seconds, round_no=rnd, warmup_s=args.warmup)
                    loads.append(r)
                    print(
                        f"round {rnd} {system.name:17} {r.workload:14} {r.writers:3} x {r.batch:<3} "
                        f"{r.rate:10,.0f} writes/s  p50 {r.p50_ms:8.2f} ms  p99 {r.p99_ms:8.2f} ms  "
                        f"errors {r.errors}  elections {r.elections}",
                        flush=True,
                    )

    for system in systems:
        if system.name not in FAILOVER_SYSTEMS or not args.failover_rounds:
            continue
        async with phase(system, "failover"):
            for k in range(args.failover_rounds):
                f = await wl.failover_round(system, k)
                failovers.append(f)
                print(
                    f"failover {system.name:10} round {k}: killed {f.killed}, next write after "
                    f"{f.to_write_ms:6.0f} ms, new leader seen after {f.to_leader_ms:6.0f} ms",
                    flush=True,
                )

    for system in systems:
        if system.name not in STABILITY_SYSTEMS or not args.stability_s:
            continue
        async with phase(system, "stability"):
            r = await wl.run_load(
                system, wl.FULL_LOAD, args.stability_s, warmup_s=args.warmup, poll_leader_s=0.1
            )
            stability.append(r)
            print(
                f"stability {system.name:10} {r.seconds:.0f} s at {r.writers} x {r.batch}: {r.rate:,.0f} writes/s, "
                f"leader changes {r.leader_changes}, elections {r.elections}, errors {r.errors}",
                flush=True,
            )
    return {"loads": loads, "failovers": failovers, "stability": stability}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="short run: 2 rounds of 1.5 s points, 2 failover rounds, 5 s stability",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "dledger-compare",
        help="where the tables, JSON and PNG go",
    )
    ap.add_argument("--rounds", type=int, help="throughput rounds (default 3; quick 2)")
    ap.add_argument("--seconds", type=float, help="measured seconds per load point (default 5; quick 1.5)")
    ap.add_argument(
        "--warmup", type=float, help="unmeasured seconds before each load point (default 1; quick 0.5)"
    )
    ap.add_argument("--failover-rounds", type=int, help="kill -9 rounds per system (default 5; quick 2)")
    ap.add_argument("--stability-s", type=float, help="length of the full-load run (default 60; quick 5)")
    ap.add_argument(
        "--systems", default=",".join(ALL_SYSTEMS), help=f"comma-separated subset of {','.join(ALL_SYSTEMS)}"
    )
    ap.add_argument(
        "--no-install", action="store_true", help="do not apt-get install etcd-server when it is missing"
    )
    args = ap.parse_args(argv)
    defaults = (2, 1.5, 0.5, 2, 5.0) if args.quick else (3, 5.0, 1.0, 5, 60.0)
    for name, default in zip(
        ("rounds", "seconds", "warmup", "failover_rounds", "stability_s"), defaults, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, default)

    registry = ProcessRegistry()
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    root = Path(tempfile.mkdtemp(prefix="dledger-compare-"))
    systems: list[System] = []
    t0 = time.monotonic()
    try:
        systems, notes = build_systems(names, registry, install=not args.no_install)
        for note in notes:
            print(note, flush=True)
        if not systems:
            print("no system to run", file=sys.stderr)
            return 2
        results = asyncio.run(run(args, systems, root))
        shutil.rmtree(root, ignore_errors=True)  # on failure it stays, with the failed phase's logs
    finally:
        registry.stop_all()
        for s in systems:
            cleanup = getattr(s, "cleanup", None)
            if cleanup is not None:
                cleanup()

    durability = {s.name: s.durability for s in systems}
    summaries = report.summarize(results["loads"], [s.name for s in systems])
    fsum = report.summarize_failover(results["failovers"])
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.compare " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        rev = ""
    meta = {
        "date": now,
        "machine": machine(),
        "command": command.strip(),
        "commit": rev,
        "wall_s": round(time.monotonic() - t0, 1),
        "settings": {
            k: getattr(args, k) for k in ("rounds", "seconds", "warmup", "failover_rounds", "stability_s")
        },
        "systems": {
            s.name: {
                "durability": s.durability,
                "client": s.client_kind,
                "batched_path": s.batch_path,
            }
            for s in systems
        },
        "notes": notes,
    }
    text = report.tables(summaries, fsum, results["stability"], durability)
    header = (
        f"Compared on {now}, {meta['machine']}, commit {rev}; `{meta['command']}` "
        f"({args.rounds} rounds x {args.seconds:g} s per point, systems alternating; wall {meta['wall_s']:.0f} s)."
    )
    clients = (
        "Load clients: "
        + "; ".join(f"{s.name}: {s.client_kind}, batched: {s.batch_path}" for s in systems)
        + "."
    )
    print()
    print(header)
    print()
    print(text)
    print()
    print(clients)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.md").write_text(f"{header}\n\n{text}\n\n{clients}\n")
    report.write_json(
        args.out / "compare.json",
        meta,
        results["loads"],
        summaries,
        results["failovers"],
        fsum,
        results["stability"],
    )
    png = args.out / "compare.png"
    if report.write_png(png, summaries, fsum, f"3-member groups on 127.0.0.1, 1 KiB writes — {now}"):
        print(f"\nwritten: {args.out / 'compare.md'}, {args.out / 'compare.json'}, {png}")
    else:
        print(
            f"\nwritten: {args.out / 'compare.md'}, {args.out / 'compare.json'} (no PNG: matplotlib is not installed)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
