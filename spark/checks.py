"""The four audit checks of issue 7, over the scanned entries (Spark DataFrames) and the segment summaries.

1. integrity   per node, inside and across segments (``spark.check_integrity``).
2. agreement   across nodes, joined on index (``spark.check_agreement``).
3. broker      each node's ConsumeQueues against its own committed log (``spark.check_queues``).
4. delivery    the ack log against the committed log (``spark.check_delivery``).

Each check returns a ``CheckResult`` with counts per rule and the first few violations by node, file, offset
and index. Heavy work is Spark's (joins and aggregations); the driver collects counts and a handful of rows.
This module is the one the audit driver imports: the checks in the order they run.
"""

from __future__ import annotations

from spark.check_agreement import agreement
from spark.check_common import CHECK_AGREEMENT, CHECK_DELIVERY, NodeLog
from spark.check_delivery import canonical_log, delivery, invalid_acks, read_acks
from spark.check_integrity import integrity
from spark.check_queues import broker, queue_listing_problems
from spark.report import FAIL, PASS, SKIP, CheckResult, Violation
from spark.segment import CHECK_BROKER, CHECK_INTEGRITY

__all__ = [
    "CHECK_AGREEMENT",
    "CHECK_BROKER",
    "CHECK_DELIVERY",
    "CHECK_INTEGRITY",
    "FAIL",
    "PASS",
    "SKIP",
    "CheckResult",
    "NodeLog",
    "Violation",
    "agreement",
    "broker",
    "canonical_log",
    "delivery",
    "integrity",
    "invalid_acks",
    "queue_listing_problems",
    "read_acks",
]
