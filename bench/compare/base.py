"""What a system under test offers the workloads, and the bookkeeping of the processes the harness starts.

Each system (ours, etcd, PySyncObj) is a 3-member group of separate processes on 127.0.0.1. The workloads only
see this interface: open a load client, ask who leads, kill the leader with SIGKILL, restart the killed member.
Keeping the workloads ignorant of the systems is what makes "the same workload" literally the same code.

Every process the harness starts is registered in a ``ProcessRegistry`` and stopped by its pid: SIGTERM, a
bounded wait, then SIGKILL. The registry also runs at interpreter exit (``atexit``), so an exception or a
Ctrl-C in the middle of a run leaves nothing behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LeaderView:
    """Who leads, as one poll of the members saw it (``term`` as the system counts terms)."""

    leader: str
    term: int


class LoadClient(Protocol):
    """One client object shared by all the concurrent writers of a workload (as each system's own client
    library is meant to be used). ``put`` writes one 1 KiB value; ``put_batch`` is the system's best batched
    path. Both return once the write is acknowledged at the system's durability, and raise on failure."""

    async def put(self, value: bytes) -> None: ...

    async def put_batch(self, values: list[bytes]) -> None: ...

    async def close(self) -> None: ...


class System(Protocol):
    name: str  # short id used in tables and JSON, e.g. "ours-sync"
    durability: str  # what an acknowledgement means on disk, printed next to every figure
    client_kind: str  # what the load client is (its cost matters for a fair comparison)
    batch_size: int  # values per put_batch in the batched workload (each system's best batch)
    batch_path: str  # what put_batch does

    async def start(self, workdir: Path) -> None: ...

    async def stop(self) -> None: ...

    async def client(self, *, failover: bool = False) -> LoadClient: ...

    async def leader(self) -> LeaderView | None: ...

    async def kill_leader(self) -> tuple[str, float]:
        """SIGKILL the leader's process; returns its member id and the ``time.monotonic()`` of the kill."""
        ...

    async def restart(self, member: str) -> None:
        """Start the killed member again and return once it has caught up with the group."""
        ...

    async def leader_pid(self) -> int | None:
        """The leader's process id (for profiling it)."""
        ...


class ProcessRegistry:
    """The processes this run started, stopped by pid (never by name), also at interpreter exit."""

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}
        self._cleanups: list = []
        atexit.register(self.stop_all)

    def on_stop(self, fn) -> None:
        """Also call ``fn()`` in ``stop_all`` (for processes started by other code, e.g. ``dledger.group``)."""
        self._cleanups.append(fn)

    def spawn(self, argv: list[str], log: Path, **kwargs) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                **kwargs,
            )
        self._procs[proc.pid] = proc
        return proc

    def kill(self, pid: int) -> None:
        """SIGKILL (kill -9) and reap."""
        proc = self._procs.pop(pid, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=10)

    def stop(self, pid: int, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL."""
        proc = self._procs.pop(pid, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        while self._cleanups:
            self._cleanups.pop()()
        pids = list(self._procs)
        for pid in pids:  # SIGTERM everything first so the members shut down in parallel
            proc = self._procs[pid]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid in pids:
            proc = self._procs.pop(pid)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def alive(self, pid: int) -> bool:
        proc = self._procs.get(pid)
        return proc is not None and proc.poll() is None


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports on 127.0.0.1 that were free a moment ago (the OS picks them)."""
    from dledger.group import free_ports as _free_ports

    return _free_ports(n)


async def poll_until(predicate, timeout_s: float, what: str, interval_s: float = 0.02):
    """Await ``predicate()`` until it returns a truthy value; raise ``TimeoutError`` naming ``what``."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = await predicate()
            if value:
                return value
        except Exception as e:  # the system is still coming up: keep the last reason for the message
            last_exc = e
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} not reached within {timeout_s} s (last error: {last_exc!r})")
