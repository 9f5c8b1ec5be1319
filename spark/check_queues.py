"""Check 3, broker: every ConsumeQueue unit equals the unit rebuilt from the node's own committed log (join on
topic, queue, queue offset), queue offsets are dense, committed messages are in their queues."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.broker import BODY_MESSAGE
from spark.check_common import (
    add_count,
    status_of,
)
from spark.layout import NodeLayout
from spark.report import SKIP, CheckResult, Violation
from spark.segment import CHECK_BROKER, SAMPLES_PER_RULE
from storage.codec import HEADER_SIZE


def queue_listing_problems(layouts: list[NodeLayout]) -> list[Violation]:
    """What the ConsumeQueue file listing alone shows: partial units and gaps between files."""
    out = []
    for lay in layouts:
        for (topic, qid), files in lay.queues.items():
            for k, f in enumerate(files):
                if f.start % 20:
                    out.append(
                        Violation(
                            CHECK_BROKER,
                            "queue_file",
                            lay.name,
                            f.path,
                            0,
                            None,
                            f"file name {f.start} is not a multiple of the 20-byte unit",
                        )
                    )
                if f.length % 20:
                    out.append(
                        Violation(
                            CHECK_BROKER,
                            "queue_file",
                            lay.name,
                            f.path,
                            f.length - f.length % 20,
                            None,
                            f"{topic}/{qid}: {f.length % 20} bytes of a partial unit at the end",
                        )
                    )
                if k + 1 < len(files) and f.start + f.length != files[k + 1].start:
                    out.append(
                        Violation(
                            CHECK_BROKER,
                            "queue_file",
                            lay.name,
                            f.path,
                            f.length,
                            None,
                            f"{topic}/{qid}: file ends at byte {f.start + f.length} but the next "
                            f"file starts at {files[k + 1].start}",
                        )
                    )
    return out


def broker(
    entries: DataFrame,
    units: DataFrame | None,
    layouts: list[NodeLayout],
    commit: int,
    scan_findings: CheckResult,
    message_count: int,
) -> CheckResult:
    """Check 3: each node's ConsumeQueues against the queues rebuilt from its own committed log."""
    listing = queue_listing_problems(layouts)
    if message_count == 0 and not any(lay.queues for lay in layouts) and not scan_findings.violations:
        return CheckResult(
            CHECK_BROKER,
            "3. broker ConsumeQueues",
            SKIP,
            0,
            "queue units",
            notes=("no broker messages and no ConsumeQueue files: not a broker group",),
        )
    violations = dict(scan_findings.violations)
    warnings: dict[str, int] = {}
    samples = list(scan_findings.samples)
    notes: list[str] = []
    if listing:
        violations["queue_file"] = len(listing)
        samples.extend(listing[:SAMPLES_PER_RULE])
    msgs = entries.filter(F.col("body_kind") == BODY_MESSAGE).select(
        "node",
        "topic",
        "queue_id",
        "queue_offset",
        F.col("index").alias("m_index"),
        F.col("seg").alias("m_seg"),
        (F.col("pos") + HEADER_SIZE).alias("m_clo"),
        (F.col("size") - HEADER_SIZE).alias("m_size"),
        F.col("tags_code").alias("m_tags"),
    )
    committed = msgs.filter(F.col("m_index") <= F.lit(commit))
    # A node whose log was compacted (a snapshot, or retention: docs/broker.md) no longer holds the messages
    # before its first entry: its queues start later, and units pointing before that entry are "compacted".
    compacted = [lay.node for lay in layouts if lay.start is not None and lay.start.first_index > 0]
    starts = entries.groupBy("node").agg(F.min("pos").alias("log_start"))
    # Dense queue offsets in the committed log, per node and queue (from 0 unless the log was compacted).
    from_zero = ~F.col("node").isin(compacted) if compacted else F.lit(True)
    dense = (
        committed.groupBy("node", "topic", "queue_id")
        .agg(
            F.count("*").alias("n"),
            F.countDistinct("queue_offset").alias("distinct"),
            F.min("queue_offset").alias("lo"),
            F.max("queue_offset").alias("hi"),
        )
        .filter(
            (F.col("n") != F.col("distinct"))
            | ((F.col("lo") != 0) & from_zero)
            | (F.col("hi") - F.col("lo") != F.col("n") - 1)
        )
    )
    for r in dense.orderBy("node", "topic", "queue_id").collect():
        rule = "queue_offset_duplicate" if r["n"] != r["distinct"] else "queue_offset_gap"
        add_count(violations, rule)
        samples.append(
            Violation(
                CHECK_BROKER,
                rule,
                layouts[r["node"]].name,
                None,
                None,
                None,
                f"{r['topic']}/{r['queue_id']}: {r['n']} committed messages carry "
                f"{r['distinct']} distinct queue offsets from {r['lo']} to {r['hi']}",
            )
        )
    if units is None:
        units = entries.sparkSession.createDataFrame(
            [],
            "node short, topic string, queue_id int, "
            "queue_offset long, commitlog_offset long, size int, "
            "tags_code long",
        )
    u = units.select(
        "node",
        "topic",
        "queue_id",
        "queue_offset",
        F.col("commitlog_offset").alias("u_clo"),
        F.col("size").alias("u_size"),
        F.col("tags_code").alias("u_tags"),
    )
    qmax = units.groupBy("node", "topic", "queue_id").agg(F.max("queue_offset").alias("qmax"))
    key = ["node", "topic", "queue_id", "queue_offset"]
    j = (
        u.join(msgs, key, "full_outer")
        .join(qmax, ["node", "topic", "queue_id"], "left")
        .join(starts, ["node"], "left")
    )
    has_u, has_m = F.col("u_clo").isNotNull(), F.col("m_clo").isNotNull()
    gone = (
        F.col("node").isin(compacted) & (F.col("u_clo") < F.col("log_start") + HEADER_SIZE)
        if compacted
        else None
    )
    cls = F.when(has_u & ~has_m & gone, "compacted") if gone is not None else F
    cls = (
        cls.when(has_u & ~has_m, "unit_without_message")
        .when(has_u & (F.col("m_index") > commit), "unit_uncommitted")
        .when(
            has_u
            & (
                (F.col("u_clo") != F.col("m_clo"))
                | (F.col("u_size") != F.col("m_size"))
                | (F.col("u_tags") != F.col("m_tags"))
            ),
            "unit_mismatch",
        )
        .when(has_u, "ok")
        .when(F.col("m_index") > commit, "uncommitted")
        .when(F.col("qmax").isNotNull() & (F.col("qmax") > F.col("queue_offset")), "missing_from_queue")
        .otherwise("not_dispatched")
    )
    j = j.withColumn("cls", cls)
    counts = {r["cls"]: r["count"] for r in j.groupBy("cls").count().collect()}
    units_checked = sum(
        n
        for k, n in counts.items()
        if k in ("ok", "unit_mismatch", "unit_uncommitted", "unit_without_message")
    )
    for rule in ("unit_without_message", "unit_uncommitted", "unit_mismatch", "missing_from_queue"):
        if counts.get(rule):
            violations[rule] = counts[rule]
            rows = j.filter(F.col("cls") == rule).orderBy(*key).limit(SAMPLES_PER_RULE).collect()
            samples.extend(_unit_violation(r, rule, layouts) for r in rows)
    if counts.get("compacted"):
        notes.append(
            f"{counts['compacted']} units point before their node's compacted log start (retention or a "
            "snapshot deleted those messages)"
        )
    if counts.get("not_dispatched"):
        warnings["not_dispatched"] = counts["not_dispatched"]
        notes.append(
            f"{counts['not_dispatched']} committed messages at the ends of their queues are not "
            "dispatched yet"
        )
    return CheckResult(
        name=CHECK_BROKER,
        title="3. broker ConsumeQueues",
        status=status_of(violations),
        checked=units_checked,
        checked_what="queue units",
        violations=violations,
        warnings=warnings,
        samples=tuple(samples),
        notes=tuple(notes),
    )


def _unit_violation(r, rule: str, layouts: list[NodeLayout]) -> Violation:
    lay = layouts[r["node"]]
    q = f"{r['topic']}/{r['queue_id']} offset {r['queue_offset']}"
    cq_file = f"{lay.root}/consumequeue/{r['topic']}/{r['queue_id']}"
    offset = r["queue_offset"] * 20
    if rule == "unit_without_message":
        detail = (
            f"{q}: unit points at {r['u_clo']} (size {r['u_size']}) but no message in the log has that "
            "queue offset"
        )
        return Violation(CHECK_BROKER, rule, lay.name, cq_file, offset, None, detail)
    if rule == "unit_uncommitted":
        detail = f"{q}: unit for the message of entry {r['m_index']}, which is beyond the commit index"
        return Violation(CHECK_BROKER, rule, lay.name, cq_file, offset, r["m_index"], detail)
    if rule == "unit_mismatch":
        detail = (
            f"{q}: unit points at {r['u_clo']} (size {r['u_size']}, tags {r['u_tags']}) but the message is "
            f"at {r['m_clo']} (size {r['m_size']}, tags {r['m_tags']}) in entry {r['m_index']}"
        )
        return Violation(CHECK_BROKER, rule, lay.name, cq_file, offset, r["m_index"], detail)
    detail = f"{q}: committed message of entry {r['m_index']} (at {r['m_clo']}) has no unit in its queue"
    return Violation(CHECK_BROKER, rule, lay.name, cq_file, offset, r["m_index"], detail)
