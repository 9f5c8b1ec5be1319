"""The broker's own topics, named in one place: the system topics where delayed and transactional messages wait
(``%SYS%...``, never read or written by clients) and each consumer group's retry and dead-letter topics
(``%RETRY%<group>``, ``%DLQ%<group>``: written by the broker, readable like any topic). docs/rocketmq.md,
Delivery."""

from __future__ import annotations

from typing import Final

SYSTEM_PREFIX: Final = "%SYS%"
TIMER_TOPIC: Final = SYSTEM_PREFIX + "TIMER"  # delayed messages until due (broker_adapter/core/timer.py)
HALF_TOPIC: Final = (
    SYSTEM_PREFIX + "HALF"
)  # transactional messages until ended (broker_adapter/core/transactions.py)
DLQ_PREFIX: Final = "%DLQ%"
RETRY_PREFIX: Final = "%RETRY%"


def dlq_topic(group: str) -> str:
    """Where a consumer group's messages go once they used up their delivery attempts."""
    return DLQ_PREFIX + group


def retry_topic(group: str) -> str:
    """Where our own Consumer's ``later`` schedules a group's messages again."""
    return RETRY_PREFIX + group
