"""Our broker against NATS JetStream, side by side in one run (issue 15):
``python -m bench.jetstream [--quick] [--rounds N] [--seconds S] [--out DIR]``.

Systems: ``ours-sync`` and ``ours-async`` (a 3-node broker group, flush policy sync or async; clients by kind,
``bench.jetstream_ours.KINDS``) and ``nats`` (a 3-node ``nats-server`` cluster with one R3 file stream, the
nats-py client; ``bench.jetstream_nats``). Workloads, 1 KiB bodies:

- ``sequential``: one sender, one message per call (msg/s, p50/p99 per call);
- ``concurrent-64``: 64 concurrent single-message senders;
- ``batched``: each client's batched path, 256 messages per call (ours) or 256 publishes in flight (NATS);
- ``consume``: one consumer pulling everything this round stored, 1,024 per pull, from the leader;
- ``leader-kill``: SIGKILL of the (stream) leader to the next acknowledged send, in milliseconds.

Each round starts every system fresh, runs all its workloads, and stops it before the next system starts, so
only the system under test uses the machine; the order of the systems rotates from round to round (A B C,
B C A, ...) so drift of the shared machine hits all alike. Printed and written (``--out``, default
var/bench/): the median and range over rounds of every figure and the ratio ours/NATS per workload, as
``jetstream-<stamp>.json`` and ``.md`` with the date and the git commit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import math
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.compare.__main__ import machine
from bench.compare.base import ProcessRegistry
from bench.jetstream_load import Plan, run
from bench.jetstream_nats import NatsCluster, find_nats_server, have_nats_py
from bench.jetstream_ours import OursBroker, available_kinds

ALL_SYSTEMS = ("ours-sync", "ours-async", "nats")
WORKLOADS = ("sequential", "concurrent-64", "batched", "consume", "leader-kill")
REFERENCE = "nats"


@dataclass(frozen=True, slots=True)
class Row:
    """One workload of one contender in one round. ``value`` is msg/s, or ms for leader-kill."""

    contender: str
    workload: str
    round: int
    value: float
    p50_ms: float
    p99_ms: float
    messages: int
    errors: int
    note: str = ""


def contender(system: str, kind: str, kinds: list[str]) -> str:
    """The row label: the system's name for its first client kind, ``system/kind`` for the others."""
    return system if kind == kinds[0] else f"{system}/{kind}"


def run_round(system, rnd: int, seconds: float, warmup: float, kill_timeout_s: float) -> list[Row]:
    rows: list[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        unit = "ms" if row.workload == "leader-kill" else "msg/s"
        lat = "" if math.isnan(row.p50_ms) else f"  p50 {row.p50_ms:7.2f} ms  p99 {row.p99_ms:7.2f} ms"
        err = f"  errors {row.errors} ({row.note})" if row.errors else f"  ({row.note})" if row.note else ""
        print(
            f"round {rnd} {row.contender:24} {row.workload:14} {row.value:10,.0f} {unit}{lat}{err}",
            flush=True,
        )

    for kind in system.kinds:
        label = contender(system.name, kind, system.kinds)
        for plan in (Plan("sequential", 1, 1), Plan("concurrent-64", 64, 1), None):
            client = system.client(kind)
            plan = plan or client.batch_plan
            m = run(client, plan, seconds, warmup)
            emit(
                Row(
                    label,
                    plan.workload,
                    rnd,
                    m.rate,
                    m.latency_ms(0.5),
                    m.latency_ms(0.99),
                    m.messages,
                    m.errors,
                    m.first_error,
                )
            )
    m = system.consume(seconds)
    emit(Row(system.name, "consume", rnd, m.rate, m.latency_ms(0.5), m.latency_ms(0.99), m.messages, 0))
    try:
        note, ms = system.leader_kill(kill_timeout_s)
        emit(Row(system.name, "leader-kill", rnd, ms, math.nan, math.nan, 1, 0, note))
    except Exception as e:  # recorded as a failed round, not a crash of the whole run
        emit(Row(system.name, "leader-kill", rnd, math.nan, math.nan, math.nan, 0, 1, repr(e)))
    return rows


@contextlib.contextmanager
def started(system, root: Path, label: str):
    """``system`` running in its own directory; its data is deleted after success and kept after failure."""
    workdir = root / label
    workdir.mkdir(parents=True)
    ok = False
    try:
        system.start(workdir)
        yield system
        ok = True
    finally:
        system.stop()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"{system.name} failed in {label}: its data and logs are in {workdir}", file=sys.stderr)


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def summarize(rows: list[Row], order: list[str]) -> list[dict]:
    """Per (workload, contender): median, min and max over the rounds, median p50/p99, and the ratio of the
    median to NATS's (ours / NATS: above 1 is better for msg/s, below 1 is better for leader-kill ms)."""
    out = []
    for w in WORKLOADS:
        ref = _median([r.value for r in rows if r.workload == w and r.contender == REFERENCE])
        for c in order:
            rs = [r for r in rows if r.workload == w and r.contender == c]
            if not rs:
                continue
            vals = [r.value for r in rs if not math.isnan(r.value)]
            med = _median(vals)
            out.append(
                {
                    "workload": w,
                    "contender": c,
                    "unit": "ms" if w == "leader-kill" else "msg/s",
                    "rounds": len(rs),
                    "median": med,
                    "min": min(vals) if vals else math.nan,
                    "max": max(vals) if vals else math.nan,
                    "p50_ms": _median([r.p50_ms for r in rs]),
                    "p99_ms": _median([r.p99_ms for r in rs]),
                    "errors": sum(r.errors for r in rs),
                    "ratio_to_nats": med / ref
                    if c != REFERENCE and ref and not math.isnan(ref)
                    else math.nan,
                }
            )
    return out


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def table(summary: list[dict], order: list[str]) -> str:
    """A markdown table: workloads down, contenders across, then one ratio column per contender of ours."""
    ours = [c for c in order if c != REFERENCE]
    has_ref = REFERENCE in order
    head = ["workload", *order, *([f"{c} / nats" for c in ours] if has_ref else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(s["workload"], s["contender"]): s for s in summary}
    for w in WORKLOADS:
        if not any((w, c) in by for c in order):
            continue
        cells = [f"{w} ({'ms, lower is better' if w == 'leader-kill' else 'msg/s'})"]
        for c in order:
            s = by.get((w, c))
            if s is None:
                cells.append("")
                continue
            cell = f"{_num(s['median'])} ({_num(s['min'])}-{_num(s['max'])})"
            if w in ("sequential", "concurrent-64") and not math.isnan(s["p50_ms"]):
                cell += f", p50 {s['p50_ms']:.2f} / p99 {s['p99_ms']:.2f} ms"
            if s["errors"]:
                cell += f", {s['errors']} errors"
            cells.append(cell)
        if has_ref:
            for c in ours:
                s = by.get((w, c))
                r = s["ratio_to_nats"] if s else math.nan
                cells.append("" if math.isnan(r) else f"{r:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _clean(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except OSError:
        return ""
    rev = out.stdout.strip()
    return f"{rev}{'-dirty' if rev and dirty else ''}"


def build_systems(names: list[str], kinds: list[str], registry: ProcessRegistry, install: bool):
    systems, notes = [], []
    for name in names:
        if name in ("ours-sync", "ours-async"):
            systems.append(OursBroker(registry, name.split("-", 1)[1], kinds))
        elif name == "nats":
            if not have_nats_py():
                notes.append("nats-py is not installed (pip install '.[bench]'); NATS is skipped")
                continue
            binary, note = find_nats_server(install)
            notes.append(note)
            if binary:
                nats = NatsCluster(registry, binary)
                systems.append(nats)
                notes.append(f"{nats.version()}, nats-py {importlib.metadata.version('nats-py')}")
        else:
            raise SystemExit(f"unknown system {name!r}; choose from {', '.join(ALL_SYSTEMS)}")
    return systems, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.jetstream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1 s per workload")
    ap.add_argument("--rounds", type=int, help="rounds (default 3; quick 1)")
    ap.add_argument("--seconds", type=float, help="measured seconds per workload (default 5; quick 1)")
    ap.add_argument(
        "--warmup", type=float, help="unmeasured seconds before each workload (default 1; quick 0.3)"
    )
    ap.add_argument(
        "--systems", default=",".join(ALL_SYSTEMS), help=f"comma-separated subset of {','.join(ALL_SYSTEMS)}"
    )
    ap.add_argument(
        "--kinds",
        default=None,
        help="our client kinds, comma-separated (default: every one the code has: "
        + ",".join(available_kinds())
        + ")",
    )
    ap.add_argument(
        "--kill-timeout", type=float, default=60.0, help="give up on the next ack after a kill (s)"
    )
    ap.add_argument(
        "--no-install", action="store_true", help="do not apt-get install nats-server when missing"
    )
    ap.add_argument("--out", type=Path, default=Path("var/bench"), help="where the JSON and markdown go")
    args = ap.parse_args(argv)
    for name, full, quick in (("rounds", 3, 1), ("seconds", 5.0, 1.0), ("warmup", 1.0, 0.3)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    kinds = [k.strip() for k in (args.kinds or ",".join(available_kinds())).split(",") if k.strip()]
    names = [s.strip() for s in args.systems.split(",") if s.strip()]

    registry = ProcessRegistry()
    root = Path(tempfile.mkdtemp(prefix="bench-jetstream-"))
    rows: list[Row] = []
    t0 = time.monotonic()
    systems, notes = build_systems(names, kinds, registry, install=not args.no_install)
    for note in notes:
        print(note, flush=True)
    if not systems:
        print("no system to run", file=sys.stderr)
        return 2
    try:
        for rnd in range(args.rounds):
            k = rnd % len(systems)
            for system in systems[k:] + systems[:k]:
                with started(system, root, f"round{rnd}-{system.name}"):
                    rows += run_round(system, rnd, args.seconds, args.warmup, args.kill_timeout)
        shutil.rmtree(root, ignore_errors=True)  # on failure it stays, with the failed system's logs
    finally:
        registry.stop_all()

    order = [contender(s.name, k, s.kinds) for s in systems for k in s.kinds]
    summary = summarize(rows, order)
    now = dt.datetime.now(dt.UTC)
    commit = git_commit()
    command = "python -m bench.jetstream " + shlex.join(argv if argv is not None else sys.argv[1:])
    clients = {contender(s.name, k, s.kinds): s.describe(k) for s in systems for k in s.kinds}
    meta = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": machine(),
        "command": command.strip(),
        "wall_s": round(time.monotonic() - t0, 1),
        "settings": {k: getattr(args, k) for k in ("rounds", "seconds", "warmup")},
        "contenders": order,
        "durability": {s.name: s.durability for s in systems},
        "clients": clients,
        "notes": notes,
    }
    header = (
        f"Broker vs NATS JetStream, {meta['date']}, commit {commit}, {meta['machine']}; `{meta['command']}` "
        f"({args.rounds} rounds x {args.seconds:g} s per workload, systems alternating; wall {meta['wall_s']:.0f} s). "
        "Medians over rounds (range in brackets); ratio = ours / NATS."
    )
    durability = "Durability: " + "; ".join(f"{s.name}: {s.durability}" for s in systems) + "."
    durability += "\n\nClients: " + "; ".join(f"{c}: {d}" for c, d in clients.items()) + "."
    text = table(summary, order)
    print(f"\n{header}\n\n{text}\n\n{durability}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"jetstream-{now.strftime('%Y%m%d-%H%M%S')}"
    Path(f"{stem}.md").write_text(f"{header}\n\n{text}\n\n{durability}\n")
    doc = {"meta": meta, "summary": summary, "rounds": [asdict(r) for r in rows]}
    Path(f"{stem}.json").write_text(json.dumps(_clean(doc), indent=2) + "\n")
    print(f"\nwritten: {stem}.md, {stem}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
