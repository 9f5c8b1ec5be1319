"""Check 2, agreement, across nodes: a full outer join of the nodes' entries on index. Up to the group's commit
index, every node holding an index has the same term, pos, body_crc and chain_crc, and a majority holds it;
beyond it, tails may differ and are reported as warnings."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.check_common import (
    CHECK_AGREEMENT,
    NodeLog,
    add_count,
    status_of,
)
from spark.layout import NodeLayout
from spark.meta import NodeMeta
from spark.report import CheckResult, Violation
from spark.segment import CHECKPOINT_EVERY, SAMPLES_PER_RULE


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
            add_count(violations, "commit_beyond_log")
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
        status=status_of(violations),
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
