"""CPU seconds processes have used, from ``/proc/PID/stat`` (user + system, every thread): the benchmarks that
report CPU per message or per call read node processes with it, since CPU moves far less with a shared
machine's load than rates do."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds the processes used so far (0 for a process that is gone)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")
