"""The comparison's output: markdown tables for the terminal (and the README), a JSON file, a PNG chart.

Every figure is a median over the rounds with its range, labelled with the system's durability. Ratios are
always "our advantage": for rates ours / peer, for times peer / ours, so above 1 means we did better. The
pairs compared are the honest ones: ``ours-sync`` with etcd (both fsync before acknowledging), ``ours-async``
with PySyncObj (neither does), and ``ours-sync`` with PySyncObj (issue 8's bar: ahead while being durable).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.compare.workloads import FailoverResult, LoadResult

PAIRS = (
    ("ours-sync", "etcd"),
    ("ours-sync", "pysyncobj"),
    ("ours-async", "pysyncobj"),
    ("ours-async", "etcd"),
)
WORKLOAD_ORDER = ("sequential", "concurrent-16", "concurrent-64", "batched")


@dataclass(frozen=True, slots=True)
class Summary:
    system: str
    workload: str
    rounds: int
    batch: int
    rate_median: float
    rate_min: float
    rate_max: float
    p50_ms: float  # median over rounds of each round's p50
    p99_ms: float
    errors: int
    elections: int
    client_cpu: float  # median over rounds, in cores: near 1.0 the load generator itself was the limit


@dataclass(frozen=True, slots=True)
class FailoverSummary:
    system: str
    rounds: int
    to_write_median_ms: float
    to_write_max_ms: float
    to_leader_median_ms: float
    to_leader_max_ms: float
    per_round_ms: tuple[float, ...]


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def summarize(loads: list[LoadResult], order: list[str] | None = None) -> list[Summary]:
    """One row per (workload, system), workloads in issue order, systems in ``order`` (default: by name)."""
    order = order or sorted({r.system for r in loads})
    keys = sorted(
        {(r.workload, r.system) for r in loads},
        key=lambda k: (_workload_rank(k[0]), order.index(k[1]) if k[1] in order else len(order), k[1]),
    )
    out = []
    for workload, system in keys:
        rs = [r for r in loads if r.workload == workload and r.system == system]
        rates = [r.rate for r in rs]
        out.append(
            Summary(
                system=system,
                workload=workload,
                rounds=len(rs),
                batch=rs[0].batch,
                rate_median=_median(rates),
                rate_min=min(rates),
                rate_max=max(rates),
                p50_ms=_median([r.p50_ms for r in rs]),
                p99_ms=_median([r.p99_ms for r in rs]),
                errors=sum(r.errors for r in rs),
                elections=sum(r.elections for r in rs),
                client_cpu=_median([r.client_cpu for r in rs]),
            )
        )
    return out


def summarize_failover(results: list[FailoverResult]) -> list[FailoverSummary]:
    out = []
    for system in dict.fromkeys(r.system for r in results):
        rs = [r for r in results if r.system == system]
        writes = [r.to_write_ms for r in rs]
        leaders = [r.to_leader_ms for r in rs if not math.isnan(r.to_leader_ms)]
        out.append(
            FailoverSummary(
                system=system,
                rounds=len(rs),
                to_write_median_ms=_median(writes),
                to_write_max_ms=max(writes),
                to_leader_median_ms=_median(leaders),
                to_leader_max_ms=max(leaders) if leaders else float("nan"),
                per_round_ms=tuple(round(w, 1) for w in writes),
            )
        )
    return out


def _workload_rank(w: str) -> int:
    return WORKLOAD_ORDER.index(w) if w in WORKLOAD_ORDER else len(WORKLOAD_ORDER)


def _num(x: float, digits: int = 0) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0%}"


def _ratio(ours: float, peer: float) -> str:
    if math.isnan(ours) or math.isnan(peer) or peer == 0 or ours == 0:
        return "n/a"
    return f"{ours / peer:.2f}x"


def tables(
    summaries: list[Summary],
    failovers: list[FailoverSummary],
    stability: list[LoadResult],
    durability: dict[str, str],
) -> str:
    """Markdown tables: throughput, ratios, failover, stability, and the durability legend."""
    lines = [
        "Client CPU: the load generator's own CPU during the point (100% = one core; near it, the client was the limit).",
        "",
        "| workload | system | values/call | writes/s median [range] | p50 ms | p99 ms | errors | client CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.workload} | {s.system} | {s.batch} | {_num(s.rate_median)} [{_num(s.rate_min)}-{_num(s.rate_max)}] "
            f"| {_num(s.p50_ms, 2)} | {_num(s.p99_ms, 2)} | {s.errors} | {_pct(s.client_cpu)} |"
        )
    by = {(s.workload, s.system): s for s in summaries}
    pairs = [(a, b) for a, b in PAIRS if any(k[1] == a for k in by) and any(k[1] == b for k in by)]
    if pairs:
        lines += [
            "",
            "Our advantage (above 1 = we did better): writes/s ours ÷ peer, and p50 latency peer ÷ ours.",
            "",
            "| workload | " + " | ".join(f"{a} vs {b}" for a, b in pairs) + " |",
            "|---|" + "---|" * len(pairs),
        ]
        for w in dict.fromkeys(s.workload for s in summaries):
            cells = []
            for a, b in pairs:
                sa, sb = by.get((w, a)), by.get((w, b))
                if sa is None or sb is None:
                    cells.append("n/a")
                elif w == "batched":
                    cells.append(_ratio(sa.rate_median, sb.rate_median))
                else:
                    cells.append(
                        f"{_ratio(sa.rate_median, sb.rate_median)} rate, {_ratio(sb.p50_ms, sa.p50_ms)} p50"
                    )
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
        broker = by.get(("batched", "ours-broker-sync"))
        peers = [b for b in ("etcd", "pysyncobj") if ("batched", b) in by]
        if broker is not None and peers:
            cells = ", ".join(
                f"{_ratio(broker.rate_median, by[('batched', b)].rate_median)} {b}" for b in peers
            )
            lines += [
                "",
                f"Batched produce through the broker (ours-broker-sync, fsync before ack): {cells}.",
            ]
    if failovers:
        lines += [
            "",
            "| failover (kill -9 leader) | rounds | to next write median / max ms | to new leader median / max ms | per round ms |",
            "|---|---|---|---|---|",
        ]
        ours = next((f for f in failovers if f.system.startswith("ours")), None)
        for f in failovers:
            note = ""
            if ours is not None and f is not ours:
                note = f" (ours {_ratio(f.to_write_median_ms, ours.to_write_median_ms)} faster, median)"
            lines.append(
                f"| {f.system}{note} | {f.rounds} | {_num(f.to_write_median_ms)} / {_num(f.to_write_max_ms)} | "
                f"{_num(f.to_leader_median_ms)} / {_num(f.to_leader_max_ms)} | {', '.join(_num(x) for x in f.per_round_ms)} |"
            )
    if stability:
        lines += [
            "",
            "| stability (full load) | writers x values | seconds | writes/s | leader changes | elections (term +) | errors |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in stability:
            lines.append(
                f"| {r.system} | {r.writers} x {r.batch} | {r.seconds:.0f} | {_num(r.rate)} | {r.leader_changes} | "
                f"{r.elections} | {r.errors} |"
            )
    lines += ["", "Durability: " + "; ".join(f"{k}: {v}" for k, v in durability.items()) + "."]
    return "\n".join(lines)


def write_json(
    path: Path,
    meta: dict,
    loads: list[LoadResult],
    summaries: list[Summary],
    failovers: list[FailoverResult],
    failover_summaries: list[FailoverSummary],
    stability: list[LoadResult],
) -> None:
    def clean(x):  # JSON has no NaN
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    doc = {
        "meta": meta,
        "summary": [asdict(s) for s in summaries],
        "failover_summary": [asdict(f) for f in failover_summaries],
        "stability": [asdict(r) for r in stability],
        "rounds": [asdict(r) for r in loads],
        "failover_rounds": [asdict(f) for f in failovers],
    }
    path.write_text(json.dumps(clean(doc), indent=2) + "\n")


def write_png(path: Path, summaries: list[Summary], failovers: list[FailoverSummary], title: str) -> bool:
    """Grouped bars (log scale) of median writes/s per workload with min-max whiskers, and failover medians.
    Returns False (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    workloads = list(dict.fromkeys(s.workload for s in summaries))
    systems = list(dict.fromkeys(s.system for s in summaries))
    by = {(s.workload, s.system): s for s in summaries}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    ax = axes[0]
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, ys, lo, hi = [], [], [], []
        for j, w in enumerate(workloads):
            s = by.get((w, system))
            if s is None or s.rate_median <= 0:
                continue
            xs.append(j + (i - (len(systems) - 1) / 2) * width)
            ys.append(s.rate_median)
            lo.append(s.rate_median - s.rate_min)
            hi.append(s.rate_max - s.rate_median)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=system)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_yscale("log")
    ax.set_ylabel("acknowledged 1 KiB writes/s (median, range)")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    ax2 = axes[1]
    if failovers:
        names = [f.system for f in failovers]
        ax2.bar(names, [f.to_write_median_ms for f in failovers], color="tab:gray")
        ax2.scatter(
            names, [f.to_write_max_ms for f in failovers], marker="_", s=300, color="tab:red", label="max"
        )
        ax2.set_ylabel("kill -9 leader → next write, ms (median; red: max)")
        ax2.tick_params(axis="x", labelrotation=30)
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
