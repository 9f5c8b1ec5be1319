"""Check 1, integrity, per node: what ``spark.segment`` found inside each segment, plus what crosses segment
boundaries (index continuity, chain_crc, terms, files that end early), checked on the driver from the segment
summaries."""

from __future__ import annotations

import zlib
from typing import Any

from spark.check_common import (
    WARNING_RULES,
    NodeLog,
    add_count,
    status_of,
    violation_of,
)
from spark.layout import NodeLayout
from spark.report import CheckResult
from spark.segment import CHAIN, CHECK_BROKER, CHECK_INTEGRITY, SAMPLES_PER_RULE


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
                    add_count(broker_counts, rule, n)
                elif rule in WARNING_RULES:
                    add_count(warnings, rule, n)
                else:
                    add_count(violations, rule, n)
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
                        CHAIN.pack(first["index"], first["term"], first["body_crc"]), prev_chain
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
                    CHAIN.pack(first["index"], first["term"], first["body_crc"]), last["chain_crc"]
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
        status=status_of(violations),
        checked=total,
        checked_what="entries",
        violations=violations,
        warnings=warnings,
        samples=tuple(violation_of(layouts, d) for d in _first_per_rule(ordered, violations)),
        notes=tuple(notes),
    )
    scan_broker = CheckResult(
        name=CHECK_BROKER,
        title="",
        status=status_of(broker_counts),
        checked=0,
        checked_what="",
        violations=broker_counts,
        samples=tuple(violation_of(layouts, d) for d in broker_samples[:SAMPLES_PER_RULE]),
    )
    return result, {CHECK_BROKER: scan_broker}, logs


def _flag_boundary(samples, violations, lay: NodeLayout, s, rule: str, detail: str) -> None:
    add_count(violations, rule)
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
