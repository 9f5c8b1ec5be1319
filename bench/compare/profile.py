"""Profile our leader under the comparison's workloads with py-spy (sampling, from outside the process).

    python -m bench.compare.profile --out /work/profiles/compare [--seconds 10] [--flush sync]

For each workload (sequential, 64 writers, batched) a fresh ``ours-<flush>`` group is loaded by the same code
as ``python -m bench.compare`` while ``py-spy record --nonblocking`` samples the leader process: once in
py-spy's raw (collapsed stacks) format, summarised here as the top frames by self time and by inclusive time,
and once as a flame graph SVG. The figures measured while profiling are printed too, but they are not the
comparison's figures (sampling costs the leader some CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.compare import workloads as wl
from bench.compare.base import ProcessRegistry
from bench.compare.ours import OursSystem

RATE = 200  # samples per second


# Frames every sample passes through (entry point, event loop, thread plumbing): they say nothing about where
# the time goes, so the inclusive table leaves them out.
PLUMBING = (
    "<frozen runpy>",
    "typer/",
    "dledger/__main__.py",
    "dledger/cli.py",
    "asyncio/runners.py",
    "threading.py",
    "concurrent/futures/thread.py",
    "BaseEventLoop.run_forever",
    "BaseEventLoop._run_once",
    "Handle._run",
)


@dataclass(frozen=True, slots=True)
class Profile:
    total: int  # samples
    by_self: list[tuple[str, int]]  # leaf frames
    by_inclusive: list[tuple[str, int]]  # frames anywhere on the stack, plumbing left out
    by_file: list[tuple[str, int]]  # self samples summed per source file


def raw_stacks(raw: Path) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw output (``frame;frame;... count`` per line) as (frames without process/thread, samples)."""
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield [f for f in stack.split(";") if not f.startswith(("process ", "thread "))], int(count)


def top_frames(raw: Path, n: int = 15) -> Profile:
    """Summarise py-spy's raw output (``frame;frame;... count`` per line, frames ``func (file)``)."""
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, c in raw_stacks(raw):
        total += c
        if not frames:
            continue
        leaf = frames[-1]
        self_t[leaf] += c
        files[leaf.rpartition("(")[2].rstrip(")")] += c
        for f in set(frames):
            if not any(p in f for p in PLUMBING):
                incl[f] += c
    return Profile(total, self_t.most_common(n), incl.most_common(n), files.most_common(n))


async def profile_point(
    system: OursSystem, point: wl.LoadPoint, seconds: float, out: Path, py_spy: str, fmt: str
) -> tuple[wl.LoadResult, Path]:
    pid = await system.leader_pid()
    if pid is None:
        raise RuntimeError("no leader to profile")
    suffix = {"raw": "txt", "flamegraph": "svg"}[fmt]
    path = out / f"{system.name}-{point.workload}.{suffix}"
    warmup = 1.0
    spy = await asyncio.create_subprocess_exec(
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--nonblocking",
        "--rate",
        str(RATE),
        "--duration",
        str(int(seconds)),
        "--format",
        fmt,
        "-o",
        str(path),
        # raw: only samples holding the GIL (Python CPU time, the scarce resource), per function; the flame
        # graph: wall-clock stacks of every thread (fdatasync and waits included), per line.
        *(["--nolineno", "--gil"] if fmt == "raw" else ["--threads"]),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        result = await wl.run_load(system, point, seconds, warmup_s=warmup)
        _, err = await asyncio.wait_for(spy.communicate(), seconds + 30)
    finally:
        if spy.returncode is None:
            spy.kill()
            await spy.wait()
    if spy.returncode != 0 or not path.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.decode(errors='replace')[-500:]}")
    return result, path


async def run(args: argparse.Namespace, py_spy: str) -> str:
    registry = ProcessRegistry()
    system = OursSystem(registry, args.flush)
    lines: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="dledger-profile-"))
    try:
        for point in (wl.SEQUENTIAL, wl.CONCURRENT_64, wl.BATCHED):
            for fmt in ("raw", "flamegraph"):
                workdir = root / f"{point.workload}-{fmt}"
                workdir.mkdir()
                await system.start(workdir)
                try:
                    result, path = await profile_point(system, point, args.seconds, args.out, py_spy, fmt)
                finally:
                    await system.stop()
                if fmt != "raw":
                    lines.append(f"flame graph: {path}")
                    continue
                prof = top_frames(path)
                total = prof.total
                busy = total / (RATE * args.seconds)
                lines += [
                    "",
                    f"## {system.name} leader, {point.workload} ({point.writers} writers x {result.batch}): "
                    f"{result.rate:,.0f} writes/s while sampled, p50 {result.p50_ms:.2f} ms",
                    f"{total} samples holding the GIL at {RATE}/s over {args.seconds:g} s: the leader ran Python "
                    f"about {busy:.0%} of the time (100% = one core, the most one process can); stacks: {path}",
                    "",
                    "| self % | frame (leaf) |",
                    "|---|---|",
                    *[f"| {c / total:.1%} | `{f}` |" for f, c in prof.by_self],
                    "",
                    "| inclusive % | frame (anywhere on the stack; loop and thread plumbing left out) |",
                    "|---|---|",
                    *[f"| {c / total:.1%} | `{f}` |" for f, c in prof.by_inclusive],
                    "",
                    "| self % | source file |",
                    "|---|---|",
                    *[f"| {c / total:.1%} | `{f}` |" for f, c in prof.by_file],
                ]
    finally:
        registry.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "dledger-profiles")
    ap.add_argument("--seconds", type=float, default=10.0, help="sampled seconds per workload")
    ap.add_argument("--flush", choices=["sync", "async"], default="sync")
    args = ap.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("py-spy is not installed: pip install '.[bench]'", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    text = asyncio.run(run(args, py_spy))
    (args.out / "profile.md").write_text(text + "\n")
    print(text)
    print(f"\nwritten: {args.out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
