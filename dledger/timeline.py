"""An opt-in timeline of a write's hops across every process of a group (docs/send-budget.md, "Hop by hop").

A profile says where a process spends its CPU, not where one write waits: between processes, in gRPC, behind
another task. With ``DLEDGER_TIMELINE=DIR`` in a process's environment, each ``mark(name)`` records the machine's
monotonic clock (``CLOCK_MONOTONIC``, the same in every process) and the process appends its records to
``DIR/<pid>.tl``, so the client's and every node's records line up; ``bench/timeline.py`` runs sends and reads
them back hop by hop. Unset (the default) a mark is one test of a module global.

The marks sit where a write crosses from one step to the next: a client stream's request, answer and caller
(``dledger/batch_stream.py``), a node stream's request and answer (``answer_each``, ``queued_answers``: a
producer session's, an append stream's, a follower's Pipe answer), the Ready, the persist and the commit
(``runtime/ready_loop.py``), the leader's writes to each peer and its acknowledgements (``runtime/peers.py``) and
a follower's Pipe request (``transport/grpc.py``). The layers below (the state machine, the broker's core) have
none: what they do between two marks is charged to the step around it.

The records are process-wide, as ``logging``'s handlers are: what is measured is a process, and passing a
recorder through every constructor on the write path would cost more than the mark itself.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from typing import Final

ENV: Final = "DLEDGER_TIMELINE"
SUFFIX: Final = ".tl"
FLUSH_EVERY: Final = 4096  # records kept in memory before they are appended to the file
# Records one process writes at most (about 30 bytes each): a timeline left on under load stops at ~60 MB a
# process rather than filling the disk the log lives on.
MAX_RECORDS: Final = 2_000_000

log = logging.getLogger(__name__)
_dir: str | None = os.environ.get(ENV) or None
_records: list[tuple[int, str]] = []
_written = 0  # records this process has written so far


def mark(name: str, of: str = "") -> None:
    """Record that this process reached ``name`` now, ``name.of`` when given (e.g. the peer a leader writes to:
    named only when the timeline is on). Nothing when it is off."""
    if _dir is not None:
        _records.append((time.monotonic_ns(), f"{name}.{of}" if of else name))
        if len(_records) >= FLUSH_EVERY:
            flush()


def record_to(directory: str | None) -> None:
    """Start recording into ``directory`` (a process that turns the timeline on after it started, such as a
    benchmark), or stop (None) after writing what was kept."""
    global _dir, _written
    flush()
    _dir = directory
    _written = 0


def flush() -> None:
    """Append the records kept so far to this process's file (also at exit). A file that cannot be written
    (no such directory, a full disk) turns the timeline off with a warning: a measurement never stops a node."""
    global _dir, _written
    if _dir is None or not _records:
        return
    lines = [f"{t} {name}\n" for t, name in _records[: max(0, MAX_RECORDS - _written)]]
    _records.clear()
    path = os.path.join(_dir, f"{os.getpid()}{SUFFIX}")
    try:
        with open(path, "a", encoding="ascii") as f:
            f.writelines(lines)
    except OSError as e:
        _dir = None
        log.warning("timeline: cannot write %s (%s); marks are off from now on", path, e)
        return
    _written += len(lines)
    if _written >= MAX_RECORDS:
        _dir = None
        log.warning(
            "timeline: %s holds %d records, the most a process writes; marks are off from now on",
            path,
            _written,
        )


atexit.register(flush)
