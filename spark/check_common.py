"""What the audit checks share: their names, the ack log's schema, each node's range from the segment summaries,
and how a rule's counts and samples become a ``CheckResult``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import types as T

from spark.layout import NodeLayout
from spark.report import FAIL, PASS, Violation

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


def status_of(violations: dict[str, int]) -> str:
    return FAIL if any(violations.values()) else PASS


def violation_of(layouts: list[NodeLayout], d: dict[str, Any]) -> Violation:
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


def add_count(counts: dict[str, int], rule: str, n: int = 1) -> None:
    counts[rule] = counts.get(rule, 0) + n
