"""``dledger chaos``: one seeded fault-injection run against a fresh local group of real node processes.

Operators run it to see the service under faults on their own machine (``make chaos`` runs a long randomized
one); every run writes its history, ack log, schedule and verdicts to ``--out`` and prints a summary. A failing
run prints the line that reproduces it (seed and fault schedule). Exit status: 0 when every checker passes.
"""

from __future__ import annotations

import random
import signal
import tempfile
from pathlib import Path
from typing import Annotated

import typer


def run_chaos(
    dir: Annotated[
        Path | None, typer.Option("--dir", help="group directory (default: a temporary one)")
    ] = None,
    out: Annotated[Path, typer.Option(help="where the history, schedule and verdicts go")] = Path(
        "chaos-out"
    ),
    faults: Annotated[str, typer.Option(help="comma-separated fault kinds, or 'all'")] = "all",
    duration: Annotated[
        float, typer.Option("--duration", help="seconds of faults (0: exactly --steps)")
    ] = 0.0,
    steps: Annotated[int, typer.Option(help="faults to inject (0: as many as fit in --duration)")] = 0,
    seed: Annotated[int | None, typer.Option(help="schedule seed (default: random, printed)")] = None,
    workload: Annotated[
        str, typer.Option(help="an installed workload (default: the installed tenant's, else kv registers)")
    ] = "",
    audit: Annotated[
        bool, typer.Option(help="workloads that have one: run the Spark audit of the final files")
    ] = True,
    flush: Annotated[
        str,
        typer.Option(
            help="the nodes' flush policy: sync (fdatasync before the ack) or async; power cuts "
            "(powerloss-* faults) show what async gives up"
        ),
    ] = "sync",
    cluster: Annotated[
        int,
        typer.Option(
            "--cluster",
            help="groups of a cluster with name servers (0: one plain group); the workload must bring a "
            "cluster (the installed tenant's does; the log's own KV registers do not)",
        ),
    ] = 0,
    secure: Annotated[
        bool,
        typer.Option(help="TLS and authentication on every node (and name server), our own certificates"),
    ] = False,
) -> None:
    """Run a seeded fault schedule against a local group under load, then check the history and the files."""
    from rich.console import Console
    from rich.table import Table

    from dledger.chaos.nemesis import FAULT_KINDS
    from dledger.chaos.runner import RunConfig, run
    from dledger.chaos.workload import default_workload, workload_names

    console = Console()
    # A run stopped with SIGTERM (or by a job runner's timeout) still stops its nodes and proxies on the way out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    kinds = FAULT_KINDS if faults == "all" else tuple(k.strip() for k in faults.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        console.print(f"[red]error:[/red] unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        raise typer.Exit(2)
    workload = workload or default_workload()
    if workload not in workload_names():
        console.print(f"[red]error:[/red] --workload must be one of: {', '.join(workload_names())}")
        raise typer.Exit(2)
    if flush not in ("sync", "async"):
        console.print(f"[red]error:[/red] --flush must be sync or async, got {flush!r}")
        raise typer.Exit(2)
    if cluster == 1 or cluster < 0 or cluster > 16:
        console.print(f"[red]error:[/red] --cluster must be 2..16 groups (0: one plain group), got {cluster}")
        raise typer.Exit(2)
    if (cluster or secure) and workload == "kv":
        console.print(
            f"[red]error:[/red] --cluster and --secure run the installed tenant's workload (--workload "
            f"{default_workload()}): the KV registers have no cluster and their client no TLS"
        )
        raise typer.Exit(2)
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    if steps == 0 and duration == 0:
        steps = len(kinds)
    tmp = None
    if dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="dledger-chaos-")
        dir = Path(tmp.name) / "group"
    console.print(
        f"chaos run: seed {seed}, faults {', '.join(kinds)}, workload {workload}, flush {flush}"
        + (f", cluster of {cluster} groups" if cluster else "")
        + (", secure" if secure else "")
        + f", output in {out}"
    )
    ok = False
    try:
        cfg = RunConfig(
            dir.resolve(),
            out.resolve(),
            seed=seed,
            faults=tuple(kinds),
            steps=steps,
            duration_s=duration,
            workload=workload,
            audit=audit,
            flush=flush,
            groups=max(1, cluster),
            secure=secure,
        )
        summary = run(cfg, log=console.print)
        ok = summary.ok
    finally:
        if tmp is not None:
            if ok:
                tmp.cleanup()
            else:  # the nodes' logs and files are the evidence: keep them
                console.print(f"the group's files and node logs are kept in {dir}")
    t = Table(title=f"chaos run, seed {seed}: {'PASS' if summary.ok else 'FAIL'}")
    t.add_column("measure")
    t.add_column("value")
    t.add_row("faults injected", ", ".join(f"{k} x{n}" for k, n in sorted(summary.faults.items())))
    t.add_row("operations", ", ".join(f"{k} {v:,}" for k, v in summary.operations.items()))
    t.add_row("leader changes", str(summary.leader_changes))
    t.add_row("longest gap between acknowledgements", f"{summary.longest_unavailability_s:.2f} s")
    t.add_row("elapsed", f"{summary.elapsed_s:.0f} s")
    for v in summary.verdicts:
        t.add_row(
            f"checker: {v['name']}",
            "PASS" if v["ok"] else f"FAIL: {v['count']} violation(s), e.g. {v['examples'][:2]}",
        )
        if "power_cuts" in v:
            t.add_row(
                "power cuts",
                f"{v['power_cuts']}: {v['committed_entries_lost']:,} of {v['committed_entries_checked']:,} "
                f"committed entries lost (most in one cut: {v['most_lost_in_one_cut']:,})",
            )
    console.print(t)
    if not summary.ok:
        console.print(f"reproduce: {summary.reproduce(cfg)}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("chaos")(run_chaos)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
