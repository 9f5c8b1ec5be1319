"""The broker's one clock: wall time in ms since the epoch. The leader reads it to stamp deadlines and due
times into log commands; applying a command never reads it (docs/decisions/0018-delivery-state-in-the-log.md)."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
