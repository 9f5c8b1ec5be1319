"""CPU seconds processes have used, from ``/proc/PID/stat`` (user + system, every thread): the benchmarks that
report CPU per message or per call read node processes with it, since CPU moves far less with a shared
machine's load than rates do."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _stat_seconds(stat: Path) -> float:
    """utime + stime of one ``stat`` file, in seconds (0 for a process or thread that is gone)."""
    try:
        fields = stat.read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15 of stat


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds the processes used so far (0 for a process that is gone)."""
    return sum(_stat_seconds(Path(f"/proc/{pid}/stat")) for pid in pids)


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds each thread of a process used so far, by thread id (``/proc/PID/task/TID/stat``: the
    top-level ``/proc/TID/stat`` of a thread gives its whole process's figures)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return {}
    return {t: _stat_seconds(Path(f"/proc/{pid}/task/{t}/stat")) for t in tids}
