"""What a chaos run drives while the nemesis injects faults: the generic workload and the registry of workloads.

A workload is found by name (``dledger chaos --workload NAME``) among the entry points of the group
``dledger.chaos_workloads`` (pyproject.toml): each names a factory ``(RunConfig, History) -> Workload``. The
runner knows only this interface, so the workloads of the layers above the log (the broker's producers and
consumer group) live with those layers and the runner imports none of them. Built in: ``kv`` (registers of the
KV store, ``dledger.chaos.register``) and ``broker`` (``broker_adapter.chaos.workload``).

A workload's clients run in threads (``Workers``: the clients are synchronous), bounded by ``stop()`` and by
their deadlines; every outcome is recorded in the run's ``History``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dledger.chaos.checkers import Verdict
from dledger.chaos.history import Event

if TYPE_CHECKING:
    from dledger import group as grp

ENTRY_POINTS = "dledger.chaos_workloads"


class Workers:
    """Threads that loop until ``stop()``; a crash of a worker is recorded, not swallowed."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.crashes: list[str] = []

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as e:  # a bug in the workload must fail the run, loudly
                self.crashes.append(f"{name}: {type(e).__name__}: {e}")
                raise

        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"workload threads did not stop within {timeout_s} s: {alive}")


@dataclass(slots=True)
class Topology:
    """What a run starts: its groups (each with its own directory, proxy network and nemesis) and what the
    workload's clients are given to find them (``entry``: the one group's addresses, or a tenant's discovery
    service, e.g. the broker's name servers). ``start``/``stop`` run the services beside the groups."""

    groups: list[tuple[Path, grp.GroupSpec]]
    entry: list[str] = field(default_factory=list)
    security: str = ""  # the clients' settings file of a secure run (dledger.security.config.ClientSecurity)
    start: Callable[[], None] = lambda: None
    stop: Callable[[], None] = lambda: None


@dataclass(frozen=True, slots=True)
class Judged:
    """A group as the checkers see it at the end: its members then, and the commit index they converged to."""

    name: str
    directory: Path
    group: grp.GroupSpec
    commit_index: int


class Workload:
    """One run's clients, from the first request to the verdicts; subclasses fill in what is theirs.

    The runner calls, in order: ``topology(raft)`` to create the groups (one by default; a workload may bring
    a cluster of them); ``start(servers)`` once every group has a leader; ``quiesce()`` once the faults
    are over (the load stops, so the group can converge); ``finish(servers, notes)`` once every node holds
    the same entries (e.g. let consumers run to the end); ``stop(timeout_s)`` always, on the way out; then
    ``judge(events, groups)``."""

    state_machine: str = ""  # the node plugin the group runs (``dledger.plugins``)
    progress: tuple[str, ...] = ()  # operations whose acknowledgement shows that the group serves
    # Called before a node joins a group (a membership fault): e.g. a secure cluster issues its certificate.
    before_join: Callable[[grp.GroupSpec, str], None] | None = None

    def __init__(self) -> None:
        self.workers: list[Workers] = []  # the first is the load that quiesce() stops

    @property
    def crashes(self) -> list[str]:
        return [c for w in self.workers for c in w.crashes]

    def topology(self, cfg: Any, raft: dict[str, int]) -> Topology:
        """One group of ``cfg.nodes`` nodes in ``cfg.directory`` running this workload's state machine."""
        from dledger import group as grp

        g = grp.create(
            cfg.directory,
            cfg.nodes,
            base_port=None,
            proxied=cfg.proxied,
            raft=dict(raft),
            state_machine=self.state_machine,
            flush=cfg.flush,
            secure=cfg.secure,
        )
        return Topology([(cfg.directory, g)], entry=list(g.addresses), security=g.security)

    def start(self, servers: Sequence[str]) -> None:
        for w in self.workers:
            w.start()  # type: ignore[attr-defined]

    def quiesce(self) -> None:
        if self.workers:
            self.workers[0].stop()

    def finish(self, servers: Sequence[str], notes: list[str]) -> None:
        """After convergence: nothing by default."""

    def stop(self, timeout_s: float) -> list[str]:
        """Stop every client; returns what did not stop in time (a note for the summary)."""
        problems = []
        for w in self.workers:
            try:
                w.stop(timeout_s)
            except RuntimeError as e:
                problems.append(str(e))
        return problems

    def judge(
        self, events: Sequence[Event], groups: Sequence[Judged]
    ) -> tuple[list[Verdict], dict[str, int]]:
        """The verdicts of this workload's checkers and its operation counts."""
        raise NotImplementedError


WorkloadFactory = Callable[[Any, Any], Workload]  # (RunConfig, History) -> Workload


def workload_names() -> list[str]:
    """The installed workloads."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINTS)})


def default_workload() -> str:
    """The workload of the tenant installed above the log, if one is: a run exercises what users run; the log's
    own KV registers otherwise."""
    tenants = [n for n in workload_names() if n != "kv"]
    return tenants[0] if tenants else "kv"


def load_workload(name: str) -> WorkloadFactory:
    """The factory of the workload ``name``; ``ValueError`` naming the installed ones if there is none."""
    for ep in entry_points(group=ENTRY_POINTS):
        if ep.name == name:
            return ep.load()
    raise ValueError(f"unknown workload {name!r}; installed: {', '.join(workload_names()) or 'none'}")


__all__ = [
    "ENTRY_POINTS",
    "Judged",
    "Topology",
    "Workers",
    "Workload",
    "default_workload",
    "load_workload",
    "workload_names",
]
