"""Benchmark of the Spark audit: 3 nodes x N entries of 1 KiB, against a plain single-process Python pass.

    python -m bench.audit                      # N = 300,000 (about two minutes here)
    python -m bench.audit --entries 1000000    # the issue's figure (3 x 1 M entries, 3.2 GB)

The group is written once with the real writer (``storage.filestore.FileLogStore``: node 0's log, then copied to
nodes 1 and 2, so all three agree) plus each node's commit checkpoint (``storage.meta_lmdb``). Then, in the same
run and over the same files (in the page cache for both):

- plain: one Python process runs the audit's own per-segment scan (``spark.segment.scan_segment``: structure,
  pos, index continuity, terms, body_crc, chain_crc, index units) over every segment of every node, then compares
  the nodes with numpy up to the commit index. This is the work of checks 1 and 2 without Spark.
- spark: ``spark.audit.run_audit`` on ``local[*]`` (or ``--master``), the whole audit as ``dledger audit`` runs
  it. The session start-up is timed apart; the audit runs ``--runs`` times (the first run also starts the Python
  workers).

Printed: entries/s of each, and the ratio spark/plain (the issue's target: at least 0.5 on this 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from spark.segment import SegmentTask, scan_segment
from storage import codec
from storage.filestore import FileLogStore
from storage.meta_lmdb import LmdbMetaStore

BODY = 1024
COMMIT_INDEX_KEY = "commit_index"  # dledger.runtime.datadir.COMMIT_INDEX_KEY


def build_group(root: Path, entries: int, segment_size: int, terms: int = 4) -> tuple[list[Path], int]:
    """Write node 0 with FileLogStore, copy it to nodes 1 and 2; returns the node dirs and the commit index."""
    n0 = root / "n0"
    store = FileLogStore.open(str(n0), segment_size=segment_size, flush="async")
    chain, end, index = 0, 0, 0
    per_term = max(1, entries // terms)
    body_base = os.urandom(BODY)
    batch = bytearray()
    try:
        while index < entries:
            term = 1 + index // per_term
            body = index.to_bytes(8, "big") + body_base[8:]
            size = codec.HEADER_SIZE + BODY
            pos = codec.place(end, size, segment_size)
            chain = codec.encode_into(batch, index, term, pos, body, chain)
            end = pos + size
            index += 1
            if len(batch) >= 1 << 20:
                store.append(bytes(batch))
                batch.clear()
        if batch:
            store.append(bytes(batch))
        store.sync()
    finally:
        store.close()
    commit = entries - 1 - entries // 100  # the last 1 % is an uncommitted tail
    nodes = [n0]
    for k in (1, 2):
        dst = root / f"n{k}"
        shutil.copytree(n0, dst)
        nodes.append(dst)
    for node in nodes:
        meta = LmdbMetaStore(str(node / "meta"))
        meta.put(COMMIT_INDEX_KEY, str(commit).encode(), sync=True)
        meta.close()
    return nodes, commit


def _segments(node: Path) -> list[tuple[int, str]]:
    return sorted((int(p.name), str(p)) for p in (node / "data").iterdir() if p.name.isdigit())


def plain_pass(nodes: list[Path], commit: int) -> tuple[int, int]:
    """Checks 1 and 2 in one Python process: the same per-segment scan, then a numpy comparison of the nodes."""
    per_node = []
    violations = 0
    total = 0
    for k, node in enumerate(nodes):
        index_files = tuple(
            sorted((int(p.name), str(p)) for p in (node / "index").iterdir() if p.name.isdigit())
        )
        segs = _segments(node)
        cols: dict[str, list[np.ndarray]] = {
            "index": [],
            "term": [],
            "pos": [],
            "body_crc": [],
            "chain_crc": [],
        }

        def keep(chunk, cols=cols):
            for name in cols:
                cols[name].append(getattr(chunk, name))

        for j, (start, path) in enumerate(segs):
            summary = scan_segment(SegmentTask(k, path, start, j == len(segs) - 1, index_files), keep)
            violations += sum(summary["counts"].values())
            total += summary["entries"]
        per_node.append({name: np.concatenate(v) if v else np.zeros(0, np.int64) for name, v in cols.items()})
    ref = per_node[0]
    for other in per_node[1:]:
        common, a, b = np.intersect1d(ref["index"], other["index"], assume_unique=True, return_indices=True)
        committed = common <= commit
        for name in ("term", "pos", "body_crc", "chain_crc"):
            violations += int(np.count_nonzero(ref[name][a][committed] != other[name][b][committed]))
    return total, violations


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__.split("\n")[0])
    p.add_argument("--entries", type=int, default=300_000, help="entries per node (default 300,000)")
    p.add_argument("--segment-mb", type=int, default=64, help="data segment size in MiB (default 64)")
    p.add_argument("--runs", type=int, default=2, help="Spark audit runs (the first also starts the workers)")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument(
        "--dir", default=None, help="scratch directory (default: a new one under $TMPDIR, removed)"
    )
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    scratch = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-audit-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, scratch)
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run(args, scratch: Path) -> int:
    n = args.entries
    t = time.perf_counter()
    nodes, commit = build_group(scratch / "group", n, args.segment_mb << 20)
    gen_s = time.perf_counter() - t
    total = 3 * n
    size_mb = sum(f.stat().st_size for node in nodes for f in (node / "data").iterdir()) / 1e6
    print(
        f"group: 3 nodes x {n:,} entries of {BODY} B ({size_mb:,.0f} MB of data files, "
        f"{args.segment_mb} MiB segments), written in {gen_s:.1f} s; commit index {commit:,}",
        flush=True,
    )

    plain = []
    for _ in range(2):
        t = time.perf_counter()
        seen, bad = plain_pass(nodes, commit)
        plain.append(time.perf_counter() - t)
        if seen != total or bad:
            print(
                f"plain pass saw {seen} entries and {bad} violations; expected {total} and 0", file=sys.stderr
            )
            return 1
    plain_s = min(plain)
    print(
        f"plain Python, 1 process:   {plain_s:6.2f} s  {total / plain_s:>10,.0f} entries/s  (runs: "
        + ", ".join(f"{x:.2f}" for x in plain)
        + ")",
        flush=True,
    )

    from spark.audit import run_audit
    from spark.session import build_session, warm_up

    t = time.perf_counter()
    spark = build_session(args.master)
    warm_up(spark)  # the Python workers start here, not inside the first measured audit
    startup_s = time.perf_counter() - t
    print(
        f"Spark start-up (session + workers): {startup_s:6.2f} s  (master {spark.sparkContext.master}, "
        f"{spark.sparkContext.defaultParallelism} cores)",
        flush=True,
    )
    runs = []
    try:
        for k in range(args.runs):
            t = time.perf_counter()
            report = run_audit(spark, [str(x) for x in nodes])
            dt = time.perf_counter() - t
            runs.append({"s": dt, "timings": report.timings})
            if not report.ok or sum(x.entries for x in report.nodes) != total:
                print(f"spark audit failed on a clean group: {sorted(report.rules())}", file=sys.stderr)
                return 1
            phases = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in report.timings.items() if k != "total_s")
            print(
                f"Spark audit run {k + 1}:         {dt:6.2f} s  {total / dt:>10,.0f} entries/s  ({phases})",
                flush=True,
            )
    finally:
        spark.stop()
    best = min(r["s"] for r in runs)
    ratio = plain_s / best
    print(
        f"ratio Spark / plain (entries/s, best run): {ratio:.2f}  (target >= 0.5); "
        f"first run {plain_s / runs[0]['s']:.2f}; with start-up {plain_s / (best + startup_s):.2f}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "entries_per_node": n,
                    "segment_mb": args.segment_mb,
                    "plain_s": plain,
                    "startup_s": startup_s,
                    "spark_runs": runs,
                    "ratio": ratio,
                    "entries_total": total,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
