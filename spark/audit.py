"""``dledger audit DIR... [--master URL] [--ack-log FILE] [--report DIR]``: prove from the files that a group agrees.

The audit reads every node's files (never writes them), in Spark, split by segment file, and runs the four checks
of ``spark.checks``. Exit status: 0 when every check passes, 1 when any finds a violation, 2 when the input is
unusable (a missing directory, a file that cannot be read, a malformed ack log), with a message naming it.

``run_audit`` is the library entry (it takes a session, so tests share one); ``main`` parses arguments, builds
or reuses a session (stopping it only if it started it), prints the summary table and writes the reports.
``spark/audit_job.py`` is the same ``main`` as a script for ``spark-submit``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from rich.console import Console

from spark import checks, session
from spark.layout import AuditInputError, NodeLayout, cluster_groups, discover
from spark.meta import read_meta
from spark.report import AuditReport, NodeSummary, render_table, write_reports
from spark.segment import SegmentTask
from spark.tasks import (
    KIND_ENTRY,
    KIND_SUMMARY,
    QUEUE_DDL,
    SCAN_DDL,
    queue_partition,
    scan_partition,
    task_json,
)

SCAN_TASK_BYTES = 512 << 20  # pack segments smaller than this into one scan task (at least 2 tasks per core)

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_INPUT = 2

# Python exceptions raised in a Spark task that mean "the input cannot be read", not "the audit has a bug".
_INPUT_ERRORS = ("FileNotFoundError", "PermissionError", "IsADirectoryError", "OSError")


def segment_tasks(layouts: list[NodeLayout], full: bool, commit: int | None) -> list[SegmentTask]:
    tasks = []
    for lay in layouts:
        index_files = tuple((f.start, f.path) for f in lay.index)
        begin_at = lay.start.end_pos if lay.start is not None else 0
        for k, f in enumerate(lay.data):
            begin = begin_at - f.start if k == 0 and begin_at > f.start else 0
            tasks.append(
                SegmentTask(
                    lay.node,
                    f.path,
                    f.start,
                    k == len(lay.data) - 1,
                    index_files,
                    full=full,
                    commit=commit,
                    begin=begin,
                )
            )
    return tasks


def _scan(spark: SparkSession, tasks: list[SegmentTask], data_bytes: int) -> DataFrame:
    """Segments scanned by Spark tasks; the rows are cached (several checks read them).

    One segment per task while segments are large; small segments (tests, benchmarks, short logs) are packed
    several to a task, since a Spark task costs a fixed 0.1-0.2 s here whatever its size. There are always at
    least two tasks per core, so a cluster still spreads the scan over all its cores."""
    if not tasks:
        return spark.createDataFrame([], SCAN_DDL)
    cores = spark.sparkContext.defaultParallelism
    partitions = min(len(tasks), max(2 * cores, -(-data_bytes // SCAN_TASK_BYTES)))
    return (
        _task_partitions(spark, [task_json(t) for t in tasks], partitions)
        .mapInArrow(scan_partition, SCAN_DDL)
        .persist()
    )


def queue_tasks(layouts: list[NodeLayout]) -> list[str]:
    """One task per node that has ConsumeQueues: its files are small (20 bytes per message), so a node's queues
    are read by one task rather than paying a task's overhead per file."""
    out = []
    for lay in layouts:
        files = [
            {"topic": topic, "queue_id": qid, "path": f.path, "start": f.start}
            for (topic, qid), fs in sorted(lay.queues.items())
            for f in fs
        ]
        if files:
            out.append(json.dumps({"node": lay.node, "files": files}))
    return out


def _one_task_per_partition(spark: SparkSession, rows: list[str]) -> DataFrame:
    return _task_partitions(spark, rows, len(rows))


def _task_partitions(spark: SparkSession, rows: list[str], partitions: int) -> DataFrame:
    """A one-column DataFrame of task descriptions in ``partitions`` partitions of consecutive rows, made in the
    JVM (a range and an array literal), so no Python worker runs before the task's own function."""
    tasks = F.array(*[F.lit(r) for r in rows])
    return spark.range(0, len(rows), 1, max(1, partitions)).select(
        F.element_at(tasks, (F.col("id") + 1).cast("int")).alias("task")
    )


def run_audit(
    spark: SparkSession,
    dirs: Sequence[str],
    ack_log: str | None = None,
) -> AuditReport:
    """Audit the nodes in ``dirs`` with ``spark``; raises ``AuditInputError`` on unusable input."""
    t0 = time.perf_counter()
    layouts = discover(list(dirs))
    metas = [read_meta(lay.meta_dir) for lay in layouts]
    if ack_log is not None and not os.path.isfile(ack_log):
        raise AuditInputError(f"{ack_log}: ack log not found (a file of JSON lines is expected)")
    if ack_log is not None and not os.access(ack_log, os.R_OK):
        raise AuditInputError(f"{ack_log}: permission denied (the audit needs to read it)")
    acks, n_acks = None, 0
    if ack_log is not None:  # validated before any file of the group is read
        acks = checks.read_acks(spark, ack_log)
        n_acks, n_bad, bad = checks.invalid_acks(acks)
        if n_bad:
            raise AuditInputError(
                f"{ack_log}: {n_bad} records are neither a raw append {{index, pos, body_crc}} nor a message "
                f"{{msg_id, topic, queue_id, queue_offset, commitlog_offset}}; first: {bad[0].asDict()}"
            )
    # Every entry row is needed only to match raw appends in an ack log, or to find the commit index without a
    # checkpoint; otherwise checkpoints, messages and tails suffice (see checks.agreement).
    known = [m.commit_index for m in metas if m.commit_index is not None]
    full = ack_log is not None or not known
    tasks = segment_tasks(layouts, full, max(known) if known else None)
    data_bytes = sum(f.length for lay in layouts for f in lay.data)
    session.prepare(spark, data_bytes)
    timings: dict[str, float] = {}
    cached: list[DataFrame] = []
    try:
        t = time.perf_counter()
        scanned = _scan(spark, tasks, data_bytes)
        cached.append(scanned)
        summaries = [json.loads(r["info"]) for r in scanned.filter(F.col("kind") == KIND_SUMMARY).collect()]
        timings["scan_s"] = time.perf_counter() - t
        entries = scanned.filter(F.col("kind") == KIND_ENTRY).drop("kind", "info")
        integrity, scan_findings, logs = checks.integrity(layouts, summaries)

        t = time.perf_counter()
        agreement, commit, commit_source = checks.agreement(spark, entries, layouts, metas, logs, exact=full)
        if not full and agreement.violations:
            # The checkpoints differ somewhere: compare every entry to name the first divergence exactly.
            rescanned = _scan(spark, segment_tasks(layouts, True, commit), data_bytes)
            cached.append(rescanned)
            entries = rescanned.filter(F.col("kind") == KIND_ENTRY).drop("kind", "info")
            agreement, commit, commit_source = checks.agreement(spark, entries, layouts, metas, logs)
        timings["agreement_s"] = time.perf_counter() - t

        t = time.perf_counter()
        q = queue_tasks(layouts)
        units = _one_task_per_partition(spark, q).mapInArrow(queue_partition, QUEUE_DDL) if q else None
        message_count = sum(s.get("messages", 0) for s in summaries)
        broker = checks.broker(
            entries, units, layouts, commit, scan_findings[checks.CHECK_BROKER], message_count
        )
        timings["broker_s"] = time.perf_counter() - t

        t = time.perf_counter()
        if acks is not None or message_count:
            delivery = checks.delivery(
                entries, commit, acks, ack_log, n_acks, agreed=agreement.violation_count == 0
            )
        else:
            delivery = checks.CheckResult(
                checks.CHECK_DELIVERY,
                "4. delivery (ack log)",
                checks.SKIP,
                0,
                "acks",
                notes=("no --ack-log and no broker messages",),
            )
        timings["delivery_s"] = time.perf_counter() - t
    finally:
        for df in cached:
            df.unpersist()
    timings["total_s"] = time.perf_counter() - t0
    terms: dict[str, dict[int, int]] = {lay.name: {} for lay in layouts}
    for s in summaries:
        per = terms[layouts[s["node"]].name]
        for term, n in s["terms"].items():
            per[int(term)] = per.get(int(term), 0) + n
    nodes = tuple(
        NodeSummary(
            lay.name,
            lay.root,
            log.segments,
            log.entries,
            log.first_index,
            log.last_index,
            m.commit_index,
            m.commit_key,
        )
        for lay, m, log in zip(layouts, metas, logs, strict=True)
    )
    return AuditReport(
        nodes=nodes,
        commit_index=commit,
        commit_source=commit_source,
        checks=(integrity, agreement, broker, delivery),
        terms={name: dict(sorted(per.items())) for name, per in terms.items()},
        timings=timings,
        master=spark.sparkContext.master,
    )


def _input_failure(err: Exception) -> str | None:
    """The message to show when a Spark job failed because a file could not be read (else None)."""
    text = str(err)
    for name in _INPUT_ERRORS:
        at = text.find(name + ":")
        if at >= 0:
            return text[at:].splitlines()[0]
    if "FAILFAST" in text or "Malformed records" in text:
        return "the ack log holds a line that is not a JSON object of the documented schema"
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dledger audit",
        description="Replay every node's files in Spark and prove that the group agrees (read-only).",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="node data directories, or a group directory, or a cluster directory (every group is audited)",
    )
    p.add_argument("--master", default=None, help="Spark master URL (default local[*], or spark-submit's)")
    p.add_argument("--ack-log", default=None, metavar="FILE", help="producers' acknowledgements, JSON lines")
    p.add_argument("--report", default=None, metavar="DIR", help="write audit.json and audit.html here")
    return p


def _group_acks(ack_log: str, group: str, out_dir: str) -> str:
    """The lines of a cluster's ack log that name ``group`` (``ClusterProducer`` acks carry it), as a file."""
    path = os.path.join(out_dir, f"acks-{group}.jsonl")
    with open(ack_log, "rb") as src, open(path, "wb") as dst:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise AuditInputError(f"{ack_log}:{n}: not a JSON line: {err}") from None
            if not isinstance(record, dict) or "group" not in record:
                raise AuditInputError(f"{ack_log}:{n}: a cluster's ack record needs the group it was sent to")
            if record["group"] == group:
                dst.write(line if line.endswith(b"\n") else line + b"\n")
    return path


def main_cluster(args: argparse.Namespace, groups: list[tuple[str, str]]) -> int:
    """Audit every group of a cluster in one Spark session: one report per group, exit as for one group."""
    import tempfile

    console = Console(stderr=False)
    err = Console(stderr=True)
    for _, gdir in groups:
        try:
            discover([gdir])
        except AuditInputError as e:
            err.print(f"[bold red]audit: unusable input:[/] {e}", highlight=False, soft_wrap=True)
            return EXIT_INPUT
    started = SparkSession.getActiveSession() is None
    spark = session.build_session(args.master)
    worst = EXIT_OK
    try:
        with tempfile.TemporaryDirectory(prefix="dledger-audit-acks-") as tmp:
            for name, gdir in groups:
                try:
                    acks = _group_acks(args.ack_log, name, tmp) if args.ack_log else None
                    report = run_audit(spark, [gdir], acks)
                except AuditInputError as e:
                    err.print(f"[bold red]audit: group {name}: unusable input:[/] {e}", highlight=False)
                    return EXIT_INPUT
                console.print(f"[bold]group {name}[/bold]: {'passed' if report.ok else 'FAILED'}")
                render_table(report, console)
                if args.report:
                    write_reports(report, os.path.join(args.report, name))
                if not report.ok:
                    worst = EXIT_VIOLATIONS
    finally:
        if started:
            spark.stop()
    console.print(
        f"cluster: {len(groups)} groups, {'all passed' if worst == EXIT_OK else 'violations found'}"
    )
    return worst


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=False)
    err = Console(stderr=True)
    try:
        clusters = [cluster_groups(d) for d in args.dirs]
        if any(c is not None for c in clusters):
            if len(args.dirs) != 1:
                raise AuditInputError("a cluster directory is audited on its own: pass only it")
            if args.ack_log is not None and not os.path.isfile(args.ack_log):
                raise AuditInputError(f"{args.ack_log}: ack log not found (a file of JSON lines is expected)")
            return main_cluster(args, clusters[0])
        discover(args.dirs)  # fail fast on bad input, before starting a JVM
        if args.ack_log is not None and not os.path.isfile(args.ack_log):
            raise AuditInputError(f"{args.ack_log}: ack log not found (a file of JSON lines is expected)")
    except AuditInputError as e:
        err.print(f"[bold red]audit: unusable input:[/] {e}", highlight=False, soft_wrap=True)
        return EXIT_INPUT
    started = SparkSession.getActiveSession() is None
    t = time.perf_counter()
    spark = session.build_session(args.master)
    startup = time.perf_counter() - t
    try:
        report = run_audit(spark, args.dirs, args.ack_log)
    except AuditInputError as e:
        err.print(f"[bold red]audit: unusable input:[/] {e}", highlight=False, soft_wrap=True)
        return EXIT_INPUT
    except (PySparkException, Py4JJavaError) as e:
        why = _input_failure(e)
        if why is None:
            raise
        err.print(f"[bold red]audit: unusable input:[/] {why}", highlight=False, soft_wrap=True)
        return EXIT_INPUT
    finally:
        if started:
            spark.stop()
    report.timings["spark_startup_s"] = startup
    render_table(report, console)
    if args.report:
        json_path, html_path = write_reports(report, args.report)
        console.print(f"reports: {json_path} {html_path}")
    return EXIT_OK if report.ok else EXIT_VIOLATIONS


if __name__ == "__main__":
    sys.exit(main())
