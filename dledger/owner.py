"""Stop with the process that owns this one.

A node started by ``dledger group up`` (or a test, or a supervisor) runs in a session of its own so that it
outlives the command that started it (``dledger.group._spawn_detached``). When whatever owns the group is killed
instead of stopping it (a test run ended by its time limit, a crashed pytest worker, a supervisor's ``kill -9``),
its nodes and name servers ran on unowned, holding ports, CPU and files on the machine. An owner that wants them
gone with it puts its pid in ``DLEDGER_OWNER_PID`` (the test suite does, tests/conftest.py); every ``dledger``
process started with it checks twice a second that the owner lives, and when it is gone stops itself as SIGTERM
would (a clean stop: the node flushes and releases its lock), then exits hard if that stop has not ended it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

OWNER_ENV = "DLEDGER_OWNER_PID"
POLL_S = 0.5
GRACE_S = 10.0  # after the SIGTERM, how long the clean stop may take before the process exits hard

log = logging.getLogger(__name__)


def alive(pid: int) -> bool:
    """True while ``pid`` runs: neither gone nor a zombie its parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return ") Z" not in stat


def watch(environ: Mapping[str, str] = os.environ) -> threading.Thread | None:
    """Start watching the owner ``environ`` names, if any; a value that is not a pid is refused at once."""
    raw = environ.get(OWNER_ENV, "").strip()
    if not raw:
        return None
    try:
        pid = int(raw)
    except ValueError:
        raise SystemExit(f"{OWNER_ENV}={raw!r} is not a process id") from None
    thread = threading.Thread(target=_watch, args=(pid,), name="owner-watch", daemon=True)
    thread.start()
    return thread


def _watch(pid: int) -> None:
    while alive(pid):
        time.sleep(POLL_S)
    log.warning("the process that owns this one (pid %d, %s) is gone: stopping", pid, OWNER_ENV)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)
