"""The four audit checks of issue 7, over the scanned entries (Spark DataFrames) and the segment summaries.

1. integrity   per node: what ``spark.segment`` found inside each segment, plus what crosses segment
               boundaries (index continuity, chain_crc, terms, files that end early), checked on the driver
               from the segment summaries.
2. agreement   across nodes: a full outer join of the nodes' entries on index. Up to the group's commit index,
               every node holding an index has the same term, pos, body_crc and chain_crc, and a majority holds
               it; beyond it, tails may differ and are reported as warnings.
3. broker      every ConsumeQueue unit equals the unit rebuilt from the node's own committed log (join on
               topic, queue, queue offset), queue offsets are dense, committed messages are in their queues.
4. delivery    with an ack log: every acknowledged entry or message is committed exactly once, as acknowledged,
               and nothing committed was sent by no producer; without one, only duplicates are looked for.

Each check returns a ``CheckResult`` with counts per rule and the first few violations by node, file, offset
and index. Heavy work is Spark's (joins and aggregations); the driver collects counts and a handful of rows.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.broker import BODY_MESSAGE, BODY_RAW
from spark.layout import NodeLayout
from spark.meta import NodeMeta
from spark.report import FAIL, PASS, SKIP, CheckResult, Violation
from spark.segment import _CHAIN, CHECK_BROKER, CHECK_INTEGRITY, CHECKPOINT_EVERY, SAMPLES_PER_RULE
from storage.codec import HEADER_SIZE, MAGIC_NORMAL

WARNING_RULES: Final = frozenset({"torn_tail"})
CHECK_AGREEMENT: Final = "agreement"
CHECK_DELIVERY: Final = "delivery"

ACK_SCHEMA: Final = T.StructType(
    [
        T.StructField("index", T.LongType()),
        T.StructField("pos", T.LongType()),
        T.StructField("body_crc", T.LongType()),
        T.StructField("msg_id", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("queue_offset", T.LongType()),
        T.StructField("commitlog_offset", T.LongType()),
        T.StructField("acked", T.BooleanType()),
    ]
)


@dataclass(frozen=True, slots=True)
class NodeLog:
    """What the segment summaries say about one node's log."""

    node: int
    segments: int
    entries: int
    first_index: int | None
    last_index: int | None


def _status(violations: dict[str, int]) -> str:
    return FAIL if any(violations.values()) else PASS


def _violation(layouts: list[NodeLayout], d: dict[str, Any]) -> Violation:
    node = d.get("node")
    return Violation(
        check=d["check"],
        rule=d["rule"],
        node=layouts[node].name if node is not None else None,
        file=d.get("file"),
        offset=d.get("offset"),
        index=d.get("index"),
        detail=d["detail"],
    )


def _add(counts: dict[str, int], rule: str, n: int = 1) -> None:
    counts[rule] = counts.get(rule, 0) + n


# -- 1. integrity ----------------------------------------------------------------------------------------------
def integrity(
    layouts: list[NodeLayout], summaries: list[dict[str, Any]]
) -> tuple[CheckResult, dict[str, CheckResult], list[NodeLog]]:
    """Check 1 from the segment summaries; also returns the broker findings the scan made and each node's range."""
    by_node: dict[int, list[dict[str, Any]]] = {lay.node: [] for lay in layouts}
    for s in summaries:
        by_node[s["node"]].append(s)
    violations: dict[str, int] = {}
    warnings: dict[str, int] = {}
    samples: list[dict[str, Any]] = []
    broker_counts: dict[str, int] = {}
    broker_samples: list[dict[str, Any]] = []
    notes: list[str] = []
    logs = []
    total = 0
    for lay in layouts:
        segs = sorted(by_node[lay.node], key=lambda s: s["start"])
        prev: dict[str, Any] | None = None
        first_index = last_index = None
        entries = 0
        for s in segs:
            entries += s["entries"]
            for d in s["samples"]:
                (broker_samples if d["check"] == CHECK_BROKER else samples).append(d)
            for rule, n in s["counts"].items():
                if rule in ("bad_message", "physical_offset"):
                    _add(broker_counts, rule, n)
                elif rule in WARNING_RULES:
                    _add(warnings, rule, n)
                else:
                    _add(violations, rule, n)
            first = s["first"]
            if first is None:
                continue
            if first_index is None:
                first_index = first["index"]
                prev_chain = None
                if first["index"] == 0:
                    prev_chain = 0
                elif lay.start is not None and lay.start.first_index == first["index"]:
                    prev_chain = lay.start.prev_chain_crc
                if prev_chain is None:
                    notes.append(
                        f"{lay.name}: log starts at index {first['index']} with no start record for it; its "
                        "first chain_crc is taken on trust"
                    )
                else:
                    want = zlib.crc32(
                        _CHAIN.pack(first["index"], first["term"], first["body_crc"]), prev_chain
                    )
                    if want != first["chain_crc"]:
                        _flag_boundary(
                            samples,
                            violations,
                            lay,
                            s,
                            "chain_crc",
                            f"first entry's chain_crc {first['chain_crc']:#010x}, expected {want:#010x}",
                        )
            elif prev is not None:
                last = prev["final"]
                if first["index"] != last["index"] + 1:
                    _flag_boundary(
                        samples,
                        violations,
                        lay,
                        s,
                        "index_continuity",
                        f"segment starts at index {first['index']}, the previous segment ends at "
                        f"index {last['index']}",
                    )
                want = zlib.crc32(
                    _CHAIN.pack(first["index"], first["term"], first["body_crc"]), last["chain_crc"]
                )
                if want != first["chain_crc"]:
                    _flag_boundary(
                        samples,
                        violations,
                        lay,
                        s,
                        "chain_crc",
                        f"header chain_crc {first['chain_crc']:#010x}, expected {want:#010x} from the "
                        "previous segment's last entry",
                    )
                if first["term"] < last["term"]:
                    _flag_boundary(
                        samples,
                        violations,
                        lay,
                        s,
                        "term_decrease",
                        f"term {first['term']} after term {last['term']} at the end of the previous segment",
                    )
                if first["offset"] != 0:
                    _flag_boundary(
                        samples,
                        violations,
                        lay,
                        s,
                        "pos_mismatch",
                        f"the segment's first entry is at offset {first['offset']}, not 0",
                    )
            prev = s
            last_index = s["final"]["index"]
        total += entries
        logs.append(NodeLog(lay.node, len(segs), entries, first_index, last_index))
        if lay.ignored:
            notes.append(
                f"{lay.name}: ignored {len(lay.ignored)} files that are not named as segments, e.g. "
                f"{lay.ignored[0]}"
            )
    for s in summaries:
        if s["tail"] == "torn":
            notes.append(f"{layouts[s['node']].name}: torn tail at {s['file']} offset {s.get('tail_offset')}")
    ordered = sorted(samples, key=lambda d: (d["node"], d["file"] or "", d["offset"] if d["offset"] else -1))
    result = CheckResult(
        name=CHECK_INTEGRITY,
        title="1. per-node integrity",
        status=_status(violations),
        checked=total,
        checked_what="entries",
        violations=violations,
        warnings=warnings,
        samples=tuple(_violation(layouts, d) for d in _first_per_rule(ordered, violations)),
        notes=tuple(notes),
    )
    scan_broker = CheckResult(
        name=CHECK_BROKER,
        title="",
        status=_status(broker_counts),
        checked=0,
        checked_what="",
        violations=broker_counts,
        samples=tuple(_violation(layouts, d) for d in broker_samples[:SAMPLES_PER_RULE]),
    )
    return result, {CHECK_BROKER: scan_broker}, logs


def _flag_boundary(samples, violations, lay: NodeLayout, s, rule: str, detail: str) -> None:
    _add(violations, rule)
    samples.append(
        {
            "check": CHECK_INTEGRITY,
            "rule": rule,
            "node": lay.node,
            "file": s["file"],
            "offset": s["first"]["offset"],
            "index": s["first"]["index"],
            "detail": detail,
        }
    )


def _first_per_rule(samples: list[dict[str, Any]], counts: dict[str, int]) -> list[dict[str, Any]]:
    """The first few violations of each rule on each node, in file order (warnings after violations)."""
    seen: dict[tuple[str, int], int] = {}
    out = []
    for d in samples:
        key = (d["rule"], d["node"])
        n = seen.get(key, 0)
        if n < SAMPLES_PER_RULE:
            out.append(d)
            seen[key] = n + 1
    return sorted(
        out,
        key=lambda d: (
            d["rule"] not in counts,
            d["node"],
            d["file"] or "",
            d["offset"] if d["offset"] else -1,
        ),
    )


# -- 2. agreement ----------------------------------------------------------------------------------------------
def _wide(entries: DataFrame, nodes: list[int]) -> DataFrame:
    """One row per index with every node's term/pos/body_crc/chain_crc/segment side by side (full outer joins)."""
    wide: DataFrame | None = None
    for k in nodes:
        side = entries.filter(F.col("node") == k).select(
            "index",
            F.col("term").alias(f"t{k}"),
            F.col("pos").alias(f"p{k}"),
            F.col("body_crc").alias(f"b{k}"),
            F.col("chain_crc").alias(f"c{k}"),
            F.col("seg").alias(f"s{k}"),
        )
        wide = side if wide is None else wide.join(side, "index", "full_outer")
    assert wide is not None
    return wide


def _differs(j: int, k: int) -> Column:
    both = F.col(f"c{j}").isNotNull() & F.col(f"c{k}").isNotNull()
    diff = F.lit(False)
    for f in ("t", "p", "b", "c"):
        diff = diff | (F.col(f"{f}{j}") != F.col(f"{f}{k}"))
    return both & diff


def agreement(
    spark: SparkSession,
    entries: DataFrame,
    layouts: list[NodeLayout],
    metas: list[NodeMeta],
    logs: list[NodeLog],
    exact: bool = True,
) -> tuple[CheckResult, int, str]:
    """Check 2; returns the result, the group commit index and where that index came from.

    ``exact``: ``entries`` holds every entry. Otherwise it holds checkpoints (every ``CHECKPOINT_EVERY`` indexes
    and the commit index) and the tails from the commit index on: equal chain_crc at a checkpoint proves equal
    index, term and body_crc for the whole prefix, entry by entry (check 1 verifies each node's chain), so the
    checkpoints cover every committed index. If they show any difference the caller rescans with every entry
    (``needs_rows``) so that the first divergence is named exactly.
    """
    nodes = [lay.node for lay in layouts]
    n = len(nodes)
    majority = n // 2 + 1
    if not exact:  # a few rows per segment: fewer, fuller partitions make the joins cheaper
        entries = entries.coalesce(spark.sparkContext.defaultParallelism)
    wide = _wide(entries, nodes)
    holders = sum((F.col(f"c{k}").isNotNull().cast("int") for k in nodes), F.lit(0))
    divergent = F.lit(False)
    for a in range(n):
        for b in range(a + 1, n):
            divergent = divergent | _differs(nodes[a], nodes[b])
    agree = [
        sum((F.coalesce((F.col(f"c{j}") == F.col(f"c{k}")).cast("int"), F.lit(0)) for j in nodes), F.lit(0))
        for k in nodes
    ]
    best = F.greatest(*[F.coalesce(a, F.lit(0)) for a in agree]) if n > 1 else F.coalesce(agree[0], F.lit(0))
    # Compacted prefixes are not under-replication: count only from where a majority of nodes start.
    firsts = sorted(log.first_index if log.first_index is not None else 1 << 62 for log in logs)
    covered_from = firsts[majority - 1]

    known = [m.commit_index for m in metas if m.commit_index is not None]
    notes: list[str] = []
    if known:
        commit = max(known)
        holder = [lay.name for lay, m in zip(layouts, metas, strict=True) if m.commit_index == commit]
        source = f"commit checkpoint in the LMDB meta of {', '.join(holder)}"
        missing = [lay.name for lay, m in zip(layouts, metas, strict=True) if m.commit_index is None]
        if missing:
            notes.append(f"no commit checkpoint in the meta of {', '.join(missing)}")
    else:
        row = wide.agg(F.max(F.when(best >= majority, F.col("index"))).alias("m")).collect()[0]
        commit = row["m"] if row["m"] is not None else -1
        source = "no commit key in any node's meta: highest index held by a majority with agreeing chain_crc"
        notes.append(source)

    c = F.col("index") <= F.lit(commit)
    under = c & (holders < majority) & (F.col("index") >= F.lit(covered_from))
    agg = wide.agg(
        F.count(F.when(c, 1)).alias("committed"),
        F.count(F.when(c & divergent, 1)).alias("div"),
        F.count(F.when(~c & divergent, 1)).alias("tail_div"),
        F.min(F.when(~c & divergent, F.col("index"))).alias("first_tail_div"),
        F.count(F.when(under, 1)).alias("under"),
        F.max(F.when(best >= majority, F.col("index"))).alias("majority_index"),
    ).collect()[0]
    violations: dict[str, int] = {}
    warnings: dict[str, int] = {}
    samples: list[Violation] = []
    if agg["div"]:
        violations["divergence"] = agg["div"]
        rows = wide.filter(c & divergent).orderBy("index").limit(SAMPLES_PER_RULE).collect()
        samples.extend(_divergence(r, layouts, "divergence") for r in rows)
    if agg["under"]:
        violations["under_replicated"] = agg["under"]
        rows = wide.filter(under).orderBy("index").limit(SAMPLES_PER_RULE).collect()
        for r in rows:
            have = [lay.name for lay in layouts if r[f"c{lay.node}"] is not None]
            samples.append(
                Violation(
                    CHECK_AGREEMENT,
                    "under_replicated",
                    None,
                    None,
                    None,
                    r["index"],
                    f"committed index {r['index']} is held by {len(have)} of {n} nodes "
                    f"({', '.join(have) or 'none'}); a majority is {majority}",
                )
            )
    if agg["tail_div"]:
        warnings["uncommitted_divergence"] = agg["tail_div"]
        notes.append(
            f"uncommitted tails differ at {agg['tail_div']} indexes from index {agg['first_tail_div']} "
            "(allowed: a new leader overwrites them)"
        )
    for lay, m, log in zip(layouts, metas, logs, strict=True):
        if m.commit_index is not None and (log.last_index is None or m.commit_index > log.last_index):
            _add(violations, "commit_beyond_log")
            samples.append(
                Violation(
                    CHECK_AGREEMENT,
                    "commit_beyond_log",
                    lay.name,
                    None,
                    None,
                    m.commit_index,
                    f"the node's commit checkpoint is {m.commit_index} but its log ends at "
                    f"{log.last_index}: committed entries were lost",
                )
            )
        elif log.last_index is not None and log.last_index > commit:
            notes.append(
                f"{lay.name}: {log.last_index - commit} entries beyond the commit index (uncommitted tail)"
            )
    if agg["majority_index"] is not None and agg["majority_index"] < commit:
        notes.append(
            f"only indexes up to {agg['majority_index']} are held by a majority with agreeing chain_crc"
        )
    checked = agg["committed"]
    if not exact:
        firsts_known = [log.first_index for log in logs if log.first_index is not None]
        checked = max(0, commit + 1 - min(firsts_known)) if firsts_known else 0
        notes.append(
            f"compared chain_crc, term, pos and body_crc at {agg['committed']} checkpoints (every "
            f"{CHECKPOINT_EVERY} indexes and the commit index); a chain_crc covers every entry before it"
        )
    result = CheckResult(
        name=CHECK_AGREEMENT,
        title="2. cross-node agreement",
        status=_status(violations),
        checked=checked,
        checked_what="committed indexes",
        violations=violations,
        warnings=warnings,
        samples=tuple(samples),
        notes=tuple(notes),
    )
    return result, commit, source


def _divergence(r, layouts: list[NodeLayout], rule: str) -> Violation:
    """Name the nodes that differ from the most common version of the entry at this index."""
    versions: dict[tuple, list[NodeLayout]] = {}
    for lay in layouts:
        k = lay.node
        if r[f"c{k}"] is not None:
            versions.setdefault((r[f"t{k}"], r[f"p{k}"], r[f"b{k}"], r[f"c{k}"]), []).append(lay)
    ranked = sorted(versions.items(), key=lambda kv: -len(kv[1]))
    main = ranked[0]
    odd = [lay for _, group in ranked[1:] for lay in group]
    who = odd[0] if odd else main[1][0]
    desc = "; ".join(
        f"{'/'.join(x.name for x in group)}: term {v[0]}, pos {v[1]}, body_crc {v[2]:#010x}, chain_crc {v[3]:#010x}"
        for v, group in ranked
    )
    seg = r[f"s{who.node}"]
    offset = r[f"p{who.node}"] - seg if seg is not None and r[f"p{who.node}"] is not None else None
    file = f"{who.root}/data/{seg:020d}" if seg is not None else None
    return Violation(
        CHECK_AGREEMENT,
        rule,
        who.name,
        file,
        offset,
        r["index"],
        f"committed entry {r['index']} differs: {desc}",
    )


# -- 3. broker -------------------------------------------------------------------------------------------------
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
    metas: list[NodeMeta],
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
    # Dense queue offsets in the committed log, per node and queue.
    dense = (
        committed.groupBy("node", "topic", "queue_id")
        .agg(
            F.count("*").alias("n"),
            F.countDistinct("queue_offset").alias("distinct"),
            F.min("queue_offset").alias("lo"),
            F.max("queue_offset").alias("hi"),
        )
        .filter((F.col("n") != F.col("distinct")) | (F.col("lo") != 0) | (F.col("hi") != F.col("n") - 1))
    )
    for r in dense.orderBy("node", "topic", "queue_id").collect():
        rule = "queue_offset_duplicate" if r["n"] != r["distinct"] else "queue_offset_gap"
        _add(violations, rule)
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
    applied = {lay.node: m.applied.get("broker") for lay, m in zip(layouts, metas, strict=True)}
    applied_col = F.lit(None).cast("long")
    for node, a in applied.items():
        if a is not None:
            applied_col = F.when(F.col("node") == node, F.lit(a)).otherwise(applied_col)
    key = ["node", "topic", "queue_id", "queue_offset"]
    j = u.join(msgs, key, "full_outer").join(qmax, ["node", "topic", "queue_id"], "left")
    has_u, has_m = F.col("u_clo").isNotNull(), F.col("m_clo").isNotNull()
    cls = (
        F.when(has_u & ~has_m, "unit_without_message")
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
        .when(applied_col.isNotNull() & (F.col("m_index") <= applied_col), "missing_from_queue")
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
    if counts.get("not_dispatched"):
        warnings["not_dispatched"] = counts["not_dispatched"]
        notes.append(
            f"{counts['not_dispatched']} committed messages at the ends of their queues are not "
            "dispatched yet (no applied index in the meta says they should be)"
        )
    return CheckResult(
        name=CHECK_BROKER,
        title="3. broker ConsumeQueues",
        status=_status(violations),
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


# -- 4. delivery -----------------------------------------------------------------------------------------------
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
            _status(violations),
            stats["identified"],
            "committed messages",
            violations,
            warnings,
            tuple(samples),
            tuple(notes),
        )
    problems = _ack_problems(log, msgs, per_id, acks, commit)
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
        _status(violations),
        ack_records,
        "ack log records",
        violations,
        warnings,
        tuple(samples),
        tuple(notes),
    )


def _ack_problems(
    log: DataFrame, msgs: DataFrame, per_id: DataFrame, acks: DataFrame, commit: int
) -> DataFrame:
    """Every disagreement between the ack log and the committed log, as rows (rule, index, msg_id, detail)."""
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
    raw_log = log.filter((F.col("body_kind") == BODY_RAW) & (F.col("magic") == MAGIC_NORMAL))
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
