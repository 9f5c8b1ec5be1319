"""Check 4, delivery: with an ack log, every acknowledged entry or message is committed exactly once, as
acknowledged, and nothing committed was sent by no producer; without one, only duplicates are looked for.

An ack log judges raw entries only if it records raw appends. On a broker group the producers' ack log records
messages, and a raw entry there is no message: the dispatcher skips it and no consumer receives it (for example
the append that ``dledger kill-leader`` times the failover with). Such entries are counted in a note."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark.broker import BODY_MESSAGE, BODY_RAW
from spark.check_common import (
    ACK_SCHEMA,
    CHECK_DELIVERY,
    status_of,
)
from spark.report import CheckResult, Violation
from spark.segment import SAMPLES_PER_RULE
from storage.codec import HEADER_SIZE, MAGIC_NORMAL


def canonical_log(entries: DataFrame, commit: int, agreed: bool) -> DataFrame:
    """The committed log as the group holds it. When check 2 found the nodes in agreement any holder's copy of an
    index will do; otherwise, per index, the version most nodes have."""
    committed = entries.filter(F.col("index") <= F.lit(commit))
    if agreed:
        return committed.dropDuplicates(["index"])
    cols = [
        "term",
        "pos",
        "size",
        "magic",
        "body_crc",
        "chain_crc",
        "body_kind",
        "topic",
        "queue_id",
        "queue_offset",
        "msg_id",
    ]
    versions = committed.groupBy("index", *cols).agg(F.count("*").alias("holders"))
    best = versions.groupBy("index").agg(F.max_by(F.struct(*cols), F.col("holders")).alias("e"))
    return best.select("index", *[F.col(f"e.{c}").alias(c) for c in cols])


def delivery(
    entries: DataFrame,
    commit: int,
    acks: DataFrame | None,
    ack_path: str | None,
    ack_records: int = 0,
    agreed: bool = True,
) -> CheckResult:
    """Check 4: exactly-once delivery of what producers were told was stored, and nothing else."""
    log = canonical_log(entries, commit, agreed).persist()
    try:
        return _delivery(log, acks, ack_path, ack_records, commit)
    finally:
        log.unpersist()


def _delivery(
    log: DataFrame, acks: DataFrame | None, ack_path: str | None, ack_records: int, commit: int
) -> CheckResult:
    msgs = log.filter((F.col("body_kind") == BODY_MESSAGE) & F.col("msg_id").isNotNull())
    per_id = msgs.groupBy("msg_id").agg(
        F.count("*").alias("copies"),
        F.sort_array(F.collect_list("index")).alias("indexes"),
        F.first("topic").alias("l_topic"),
        F.first("queue_id").alias("l_queue_id"),
        F.first("queue_offset").alias("l_queue_offset"),
        F.first(F.col("pos") + HEADER_SIZE).alias("l_clo"),
    )
    violations: dict[str, int] = {}
    warnings: dict[str, int] = {}
    samples: list[Violation] = []
    notes: list[str] = []

    def flag(rule: str, df: DataFrame, order: str, describe) -> None:
        n = df.count()
        if n:
            violations[rule] = n
            samples.extend(describe(r) for r in df.orderBy(order).limit(SAMPLES_PER_RULE).collect())

    stats = (
        log.filter(F.col("body_kind") == BODY_MESSAGE)
        .agg(
            F.count("*").alias("messages"),
            F.count("msg_id").alias("identified"),
            F.countDistinct("msg_id").alias("distinct"),
        )
        .collect()[0]
    )
    if stats["identified"] != stats["distinct"]:
        dups = per_id.filter(F.col("copies") > 1)
        violations["duplicate"] = dups.count()
        for r in dups.orderBy("msg_id").limit(SAMPLES_PER_RULE).collect():
            samples.append(
                Violation(
                    CHECK_DELIVERY,
                    "duplicate",
                    None,
                    None,
                    None,
                    r["indexes"][1],
                    f"message {r['msg_id']} is in the committed log {r['copies']} times, at indexes "
                    f"{r['indexes']}",
                )
            )
    unidentified = stats["messages"] - stats["identified"]
    if unidentified:
        warnings["unidentified_message"] = unidentified
        notes.append(
            f"{unidentified} committed messages carry no message id (UNIQ key or producer id + "
            "sequence) and cannot be matched"
        )
    if acks is None:
        notes.append("no --ack-log: checked only that no message is committed twice")
        return CheckResult(
            CHECK_DELIVERY,
            "4. delivery (ack log)",
            status_of(violations),
            stats["identified"],
            "committed messages",
            violations,
            warnings,
            tuple(samples),
            tuple(notes),
        )
    raw_judged = _records_raw_appends(acks)
    if not raw_judged:
        raw = log.filter(_raw_entry()).count()
        if raw:
            notes.append(
                f"{raw} committed raw entries (not messages) were not judged: the ack log records no raw append"
            )
    problems = _ack_problems(log, msgs, per_id, acks, commit, raw_judged)
    counts = {r["rule"]: r["count"] for r in problems.groupBy("rule").count().collect()}
    violations.update(counts)
    if counts:
        rank = F.row_number().over(Window.partitionBy("rule").orderBy("index", "msg_id"))
        rows = problems.withColumn("rank", rank).filter(F.col("rank") <= SAMPLES_PER_RULE).collect()
        for r in sorted(rows, key=lambda r: (r["rule"], r["rank"])):
            file = ack_path if r["rule"] in ("acked_missing", "ack_mismatch") else None
            samples.append(Violation(CHECK_DELIVERY, r["rule"], None, file, None, r["index"], r["detail"]))
    return CheckResult(
        CHECK_DELIVERY,
        "4. delivery (ack log)",
        status_of(violations),
        ack_records,
        "ack log records",
        violations,
        warnings,
        tuple(samples),
        tuple(notes),
    )


def _raw_entry() -> Column:
    return (F.col("body_kind") == BODY_RAW) & (F.col("magic") == MAGIC_NORMAL)


def _records_raw_appends(acks: DataFrame) -> bool:
    """Whether the ack log holds a raw append (acknowledged, or an attempt known by its body_crc only)."""
    raw = F.col("index").isNotNull() | (F.col("msg_id").isNull() & F.col("body_crc").isNotNull())
    return bool(acks.filter(raw).limit(1).count())


def _ack_problems(
    log: DataFrame, msgs: DataFrame, per_id: DataFrame, acks: DataFrame, commit: int, raw_judged: bool
) -> DataFrame:
    """Every disagreement between the ack log and the committed log, as rows (rule, index, msg_id, detail).
    Committed raw entries count as unsent only when ``raw_judged`` (the ack log records raw appends)."""
    acked = acks.filter(F.coalesce(F.col("acked"), F.lit(True)))
    raw_acks = acked.filter(F.col("index").isNotNull())
    msg_acks = acked.filter(F.col("msg_id").isNotNull())
    fmt = F.format_string

    def rows(df: DataFrame, rule: str, index: Column, msg_id: Column, detail: Column) -> DataFrame:
        return df.select(
            F.lit(rule).alias("rule"),
            index.cast("long").alias("index"),
            msg_id.cast("string").alias("msg_id"),
            detail.alias("detail"),
        )

    no_id = F.lit(None).cast("string")
    parts = [
        rows(
            raw_acks.join(log.select("index"), "index", "left_anti"),
            "acked_missing",
            F.col("index"),
            no_id,
            fmt(
                "append acknowledged at index %d is not in the committed log (commit index %d)",
                "index",
                F.lit(commit),
            ),
        ),
        rows(
            raw_acks.alias("a")
            .join(log.alias("l"), "index")
            .filter((F.col("a.pos") != F.col("l.pos")) | (F.col("a.body_crc") != F.col("l.body_crc"))),
            "ack_mismatch",
            F.col("index"),
            no_id,
            fmt(
                "acknowledged as pos %d body_crc %d, committed as pos %d body_crc %d",
                "a.pos",
                "a.body_crc",
                "l.pos",
                "l.body_crc",
            ),
        ),
        rows(
            msg_acks.join(per_id.select("msg_id"), "msg_id", "left_anti"),
            "acked_missing",
            F.lit(None),
            F.col("msg_id"),
            fmt(
                "message %s (%s/%d offset %d) was acknowledged but is not in the committed log",
                "msg_id",
                "topic",
                "queue_id",
                "queue_offset",
            ),
        ),
    ]
    # An acknowledgement matches when some committed copy of the message is where it says (a duplicate's other
    # copies are the duplicate rule's business).
    copies = msgs.select(
        "msg_id", "topic", "queue_id", "queue_offset", (F.col("pos") + HEADER_SIZE).alias("commitlog_offset")
    )
    mismatch = msg_acks.join(
        copies, ["msg_id", "topic", "queue_id", "queue_offset", "commitlog_offset"], "left_anti"
    ).join(per_id, "msg_id")
    parts.append(
        rows(
            mismatch,
            "ack_mismatch",
            F.col("indexes")[0],
            F.col("msg_id"),
            fmt(
                "message %s acknowledged as %s/%d offset %d at %d, committed as %s/%d offset %d at %d",
                "msg_id",
                "topic",
                "queue_id",
                "queue_offset",
                "commitlog_offset",
                "l_topic",
                "l_queue_id",
                "l_queue_offset",
                "l_clo",
            ),
        )
    )
    # Nothing committed that no producer sent (an attempt whose outcome the producer does not know counts as sent).
    sent_ids = acks.filter(F.col("msg_id").isNotNull()).select("msg_id")
    parts.append(
        rows(
            msgs.join(sent_ids, "msg_id", "left_anti"),
            "unsent",
            F.col("index"),
            F.col("msg_id"),
            fmt("committed message %s (%s/%d) is in no producer's ack log", "msg_id", "topic", "queue_id"),
        )
    )
    if raw_judged:
        raw_log = log.filter(_raw_entry())
        attempts = acks.filter(F.col("index").isNull() & F.col("body_crc").isNotNull()).select("body_crc")
        parts.append(
            rows(
                raw_log.join(raw_acks.select("index"), "index", "left_anti").join(
                    attempts, "body_crc", "left_anti"
                ),
                "unsent",
                F.col("index"),
                no_id,
                fmt(
                    "committed entry %d (pos %d, body_crc %d) is in no producer's ack log",
                    "index",
                    "pos",
                    "body_crc",
                ),
            )
        )
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def read_acks(spark: SparkSession, path: str) -> DataFrame:
    """The ack log as a DataFrame (JSON lines, ``ACK_SCHEMA``); malformed lines fail the read (exit 2)."""
    return spark.read.schema(ACK_SCHEMA).option("mode", "FAILFAST").json(path)


def invalid_acks(acks: DataFrame) -> tuple[int, int, list[Any]]:
    """(records, bad records, first bad ones): a bad record is neither a complete raw append nor an identified
    message (or a send attempt, ``"acked": false``, with a message id or a body_crc)."""
    raw_ok = F.col("index").isNotNull() & F.col("pos").isNotNull() & F.col("body_crc").isNotNull()
    attempt_ok = (F.col("acked") == F.lit(False)) & (
        F.col("msg_id").isNotNull() | F.col("body_crc").isNotNull()
    )
    msg_ok = (
        F.col("msg_id").isNotNull()
        & F.col("topic").isNotNull()
        & F.col("queue_id").isNotNull()
        & F.col("queue_offset").isNotNull()
        & F.col("commitlog_offset").isNotNull()
    )
    ok = (
        F.coalesce(raw_ok, F.lit(False))
        | F.coalesce(attempt_ok, F.lit(False))
        | F.coalesce(msg_ok, F.lit(False))
    )
    row = acks.agg(F.count("*").alias("n"), F.count(F.when(~ok, 1)).alias("bad")).collect()[0]
    first = acks.filter(~ok).limit(3).collect() if row["bad"] else []
    return row["n"], row["bad"], first
