"""One seeded chaos run: a proxied group of real node processes, workloads, the nemesis, then the checkers.

``run(RunConfig(...))`` does, in order:

1. create a proxied group running the workload's state machine (``dledger.group.create(..., proxied=True)``),
   start the proxy and the nodes (through the fault-injection launcher);
2. start the workload (found by name among the ``dledger.chaos_workloads`` entry points: the broker's
   producers and consumer group, the KV store's register clients) and a status observer that records every
   (leader, term) it sees;
3. run the fault schedule drawn from the seed: inject, hold, heal, wait until the group answers again;
4. heal everything, stop the load, wait until every node holds and has committed the same entries, let the
   workload finish (the broker's consumer group runs to the end of every queue), stop the group (SIGTERM);
5. judge: the workload's checkers on the history and the files; write ``summary.json``, ``history.jsonl`` and
   ``schedule.json`` (and what the workload writes, e.g. the broker's ``acks.jsonl``) to the output directory.

A failing run names its seed and schedule in the summary (``Summary.reproduce``).
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger import group as grp
from dledger.chaos import checkers, powercut
from dledger.chaos.history import FAIL, INFO, OK, History
from dledger.chaos.nemesis import (
    LAUNCHER,
    NEEDS_PROXY,
    POWER_LOSS,
    Nemesis,
    Step,
    schedule,
    wait_converged,
    wait_healthy,
)
from dledger.chaos.proxy import LinkSpec, Network
from dledger.chaos.workload import Judged, Workload, default_workload, load_workload
from dledger.errors import DLedgerError, UnavailableError
from storage import powerloss

MIN_ACKED_WAIT_S = 120.0  # RunConfig.min_acked: the longest the workload runs on after the faults
RAFT = {"election_timeout_min_ms": 300, "election_timeout_max_ms": 600, "heartbeat_interval_ms": 60}


@dataclass(frozen=True, slots=True)
class RunConfig:
    directory: Path
    out: Path
    seed: int = 1
    faults: tuple[str, ...] = ("kill-leader", "pause-leader", "partition-halves")
    steps: int = 0  # faults to inject; 0 = as many as fit in duration_s (at least one of each kind)
    duration_s: float = 0.0  # 0 = run exactly ``steps`` faults
    hold_s: tuple[float, float] = (1.0, 2.5)
    nodes: int = 3
    producers: int = 3
    consumers: int = 2
    queues: int = 4
    body_size: int = 128
    workload: str = ""  # a dledger.chaos_workloads entry point; "": workload.default_workload()
    registers: int = 3  # KV: client threads
    keys: int = 3  # KV: registers
    audit: bool = False  # workloads that have one: run the audit of the final files (starts a JVM)
    proxied: bool = True
    groups: int = 1  # > 1: a cluster of this many groups (a workload that has one, e.g. the broker's)
    secure: bool = False  # TLS and authentication on every group (and name server), certificates from ours
    flush: str = "sync"  # the nodes' flush policy; power cuts show what "async" gives up
    flush_interval_ms: int = 0  # async: the nodes' flush interval (0: the node's default, 10 ms)
    # Keep the workload going after the last heal until this many operations were acknowledged (at most
    # MIN_ACKED_WAIT_S): how much a run gets done then does not depend on how busy the machine is.
    min_acked: int = 0
    power_loss_modes: tuple[str, ...] = (
        "drop",
        "torn",
    )  # what a power cut does to unsynced data, drawn per node

    def __post_init__(self) -> None:
        if not self.workload:  # the schedule and its repro line name the workload that ran
            object.__setattr__(self, "workload", default_workload())

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "seed": self.seed,
            "faults": list(self.faults),
            "steps": self.steps,
            "duration_s": self.duration_s,
            "hold_s": list(self.hold_s),
            "nodes": self.nodes,
            "workload": self.workload,
            "audit": self.audit,
            "groups": self.groups,
            "secure": self.secure,
            "flush": self.flush,
            "flush_interval_ms": self.flush_interval_ms,
            "min_acked": self.min_acked,
        }


@dataclass(slots=True)
class Summary:
    seed: int
    schedule: list[dict[str, Any]]
    faults: dict[str, int]
    operations: dict[str, int]
    verdicts: list[dict[str, Any]]
    leader_changes: int
    longest_unavailability_s: float
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v["ok"] for v in self.verdicts)

    def reproduce(self, cfg: RunConfig) -> str:
        kinds = ",".join(cfg.faults)
        # A duration run draws the same schedule from the seed and duration; how far it gets depends on the pace.
        length = (
            f"--duration {cfg.duration_s:g}"
            if not cfg.steps and cfg.duration_s
            else f"--steps {cfg.steps or len(self.schedule)}"
        )
        return (
            f"dledger chaos --dir DIR --seed {self.seed} --faults {kinds} {length} "
            f"--workload {cfg.workload} --flush {cfg.flush}"
            + (f" --cluster {cfg.groups}" if cfg.groups > 1 else "")
            + (" --secure" if cfg.secure else "")
            + "  # schedule: "
            + "; ".join(f"{s['kind']} {s['hold_s']}s" for s in self.schedule)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seed": self.seed,
            "schedule": self.schedule,
            "faults": self.faults,
            "operations": self.operations,
            "verdicts": self.verdicts,
            "leader_changes": self.leader_changes,
            "longest_unavailability_s": round(self.longest_unavailability_s, 3),
            "elapsed_s": round(self.elapsed_s, 1),
            "notes": self.notes,
        }


class LeaderObserver:
    """Polls the group's status and records each new (leader, term) it sees (``name``: the group's, in a run
    of several groups)."""

    def __init__(self, site: Site, history: History, interval_s: float = 0.2, name: str | None = None):
        self.site = site
        self.name = name
        self.history = history
        self.interval_s = interval_s
        self.changes = 0
        self._stop = threading.Event()
        self._last: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._run, name="observer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            lead = grp.leader_of(grp.status(self.site.current, timeout_s=0.3))
            if lead is not None and (lead.id, lead.term or 0) != self._last:
                if self._last is not None:
                    self.changes += 1
                self._last = (lead.id, lead.term or 0)
                where = {"group": self.name} if self.name else {}
                self.history.add("observer", "observe", "leader", node=lead.id, term=lead.term, **where)
            self._stop.wait(self.interval_s)


def _steps(cfg: RunConfig) -> list[Step]:
    """``--steps N``: exactly N. ``--duration S``: more than can fit (every step holds at least the shortest hold
    time); the run injects them in order until S seconds have passed, so it lasts S seconds whatever the pace."""
    count = cfg.steps or (
        len(cfg.faults) + int(cfg.duration_s / cfg.hold_s[0]) + 1 if cfg.duration_s else len(cfg.faults)
    )
    return schedule(cfg.seed, list(cfg.faults), count, cfg.hold_s)


def _wait_for_ack(history: History, after: float, timeout_s: float, progress: tuple[str, ...]) -> bool:
    """Poll until some ``progress`` operation was acknowledged after ``after`` (the group serves again)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e.type == OK and e.f in progress and e.time > after for e in reversed(history.events[-200:])):
            return True
        time.sleep(0.05)
    return False


def _wait_for_acked(history: History, count: int, timeout_s: float, progress: tuple[str, ...]) -> bool:
    """Poll until ``count`` ``progress`` operations were acknowledged since the run began."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(1 for e in history.events if e.type == OK and e.f in progress) >= count:
            return True
        time.sleep(0.1)
    return False


@dataclass(slots=True)
class Site:
    """One group of the run with its own proxy network, nemesis and leader observer."""

    name: str
    directory: Path
    group: grp.GroupSpec
    network: Network | None = None
    nemesis: Nemesis | None = None
    observer: LeaderObserver | None = None
    commit_index: int = -1

    @property
    def current(self) -> grp.GroupSpec:
        """The group as it is now (membership faults change it)."""
        return self.nemesis.group if self.nemesis is not None else self.group


def _events_of(events: list[Any], name: str, sites: int) -> list[Any]:
    """The events about one group of a run of several (those naming it, and the faults of its nemesis)."""
    if sites == 1:
        return events
    return [e for e in events if e.value.get("group", name) == name]


def run(cfg: RunConfig, log=print) -> Summary:
    """Run one chaos run; every process started here is stopped before this returns (or raises)."""
    t_start = time.monotonic()
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    steps = _steps(cfg)
    (out / "schedule.json").write_text(
        json.dumps({"config": cfg.to_json(), "schedule": [s.to_json() for s in steps]}, indent=2) + "\n"
    )
    needs_proxy = any(s.kind in NEEDS_PROXY for s in steps)
    if needs_proxy and not cfg.proxied:
        raise ValueError("partition and one-way faults need a proxied group")
    make_workload = load_workload(cfg.workload)
    history = History(out / "history.jsonl")
    workload: Workload = make_workload(cfg, history)
    topology = workload.topology(cfg, RAFT)
    sites = [Site(g.name, d, g) for d, g in topology.groups]
    several = len(sites) > 1
    for site in sites:
        if cfg.flush_interval_ms:
            for spec in site.group.nodes:
                _set_top_level(Path(spec.config), "flush_interval_ms", cfg.flush_interval_ms)
        if any(s.kind in POWER_LOSS for s in steps):
            for spec in site.group.nodes:  # the launcher journals what each node has not synced
                powerloss.enable(spec.data_dir)
        if site.group.links:
            site.network = Network(
                [LinkSpec(a, b, p, site.group.node(b).address) for a, b, p in site.group.links],
                seed=cfg.seed + len(site.name),
            )
        site.observer = LeaderObserver(site, history, name=site.name if several else None)
    pick = random.Random(cfg.seed ^ 0x6C05)  # which group each fault hits (a cluster run)
    notes: list[str] = []
    t_work = t_end = 0.0
    injected: list[Step] = []
    started = False
    try:
        for site in sites:
            if site.network is not None:
                site.network.start()
        topology.start()
        started = True
        for site in sites:
            for spec in site.group.nodes:
                grp.start_node(spec, LAUNCHER)
        for site in sites:
            if not wait_healthy(site.group, 60):
                raise DLedgerError(f"the group in {site.directory} did not elect a leader within 60 s")
        for site in sites:
            assert site.observer is not None
            site.observer.start()
        t_work = history.now()
        workload.start(topology.entry)
        for site in sites:
            site.nemesis = Nemesis(
                site.group,
                history,
                site.network,
                cfg.seed + sites.index(site),
                election_timeout_s=RAFT["election_timeout_max_ms"] / 1000,
                power_loss_modes=cfg.power_loss_modes,
                directory=site.directory,
                before_join=workload.before_join,
                name=site.name if several else None,
            )
        _wait_for_ack(history, t_work, 30.0, workload.progress)
        deadline = t_start + cfg.duration_s if cfg.duration_s else None
        for i, step in enumerate(steps):
            if deadline is not None and time.monotonic() > deadline and i >= len(cfg.faults):
                break
            site = sites[pick.randrange(len(sites))]
            nemesis = site.nemesis
            assert nemesis is not None
            injected.append(step)
            act = nemesis.inject(step)
            planned = f"{i + 1}/{len(steps)}" if deadline is None else f"{i + 1}"
            where = f"{site.name}: " if several else ""
            log(f"[{history.now():7.1f}s] fault {planned}: {where}{step.kind} {act.detail}")
            nemesis.hold(act)
            nemesis.heal(act)
            healed_at = history.now()
            if not wait_healthy(site.current, 60):
                notes.append(f"after {step.kind}: {where}no leader within 60 s of the heal")
            if not _wait_for_ack(history, healed_at, 60.0, workload.progress):
                notes.append(f"after {step.kind}: {where}no acknowledged operation within 60 s of the heal")
        for site in sites:
            assert site.nemesis is not None
            restarted = site.nemesis.heal_all()
            if restarted:
                notes.append(f"nodes restarted at the end: {site.name if several else ''} {restarted}")
        if cfg.min_acked and not _wait_for_acked(history, cfg.min_acked, MIN_ACKED_WAIT_S, workload.progress):
            notes.append(
                f"fewer than {cfg.min_acked} operations acknowledged {MIN_ACKED_WAIT_S:g} s after the faults"
            )
        t_end = history.now()
        workload.quiesce()
        for site in sites:
            try:
                rows = wait_converged(site.current, 90)
            except UnavailableError as e:
                # Judge anyway, up to the leader's commit index: a node that stays behind (under async, a
                # follower that lost entries it had acknowledged) is then named by the checkers.
                notes.append(f"{site.name}: {e}" if several else str(e))
                rows = grp.status(site.current, timeout_s=1.5)
            site.commit_index = max((r.commit_index or -1 for r in rows), default=-1)
        workload.finish(topology.entry, notes)
        for site in sites:
            assert site.observer is not None
            site.observer.stop()
        for w in workload.workers:
            if w.crashes:
                notes.append(f"workload crashed: {w.crashes}")
    finally:
        notes.extend(workload.stop(5.0))
        for site in sites:
            if site.observer is not None:
                site.observer.stop()
            if site.nemesis is not None:
                site.nemesis.stop()
            for spec in site.current.nodes:  # a paused node cannot take SIGTERM: resume first
                grp.signal_node(spec, signal.SIGCONT)
            grp.stop_group(site.current)
        if started:
            topology.stop()
        for site in sites:
            if site.network is not None:
                site.network.stop()
        history.close()
    events = History.load(out / "history.jsonl")
    judged = [Judged(s.name, s.directory, s.current, s.commit_index) for s in sites]
    verdicts, ops = workload.judge(events, judged)
    for n in notes:
        verdicts.append(checkers.Verdict("liveness", [n], 1))
    per_group: dict[str, dict[str, Any]] = {}
    for site in sites:
        mine = _events_of(events, site.name, len(sites))
        nemesis = site.nemesis
        if nemesis is not None and (nemesis.marks or nemesis.refusals):
            pl = powercut.check_power_loss(
                nemesis.marks, nemesis.refusals, site.current, cfg.flush, site.commit_index, mine
            )
            if several:
                pl.name = f"power_loss {site.name}"
            verdicts.append(pl)
            if cfg.flush != "sync" and pl.stats["committed_entries_lost"]:
                notes.append(  # a fact of the policy, reported, not a failure of this checker
                    f"flush {cfg.flush}: power cuts lost {pl.stats['committed_entries_lost']} committed entries "
                    f"(at most {pl.stats['most_lost_in_one_cut']} in one cut)"
                )
        gap, gap_at = checkers.longest_unavailability(mine, t_work, t_end or t_work, workload.progress)
        per_group[site.name] = {
            "faults": dict(nemesis.counts) if nemesis else {},
            "leader_changes": site.observer.changes if site.observer else 0,
            "failovers_s": failovers(mine),
            "longest_unavailability_s": round(gap, 3),
            "longest_unavailability_from_s": round(gap_at, 3),
            "members": [n.id for n in site.current.nodes],
            "commit_index": site.commit_index,
        }
    faults: dict[str, int] = {}
    for g in per_group.values():
        for k, n in g["faults"].items():
            faults[k] = faults.get(k, 0) + n
    gap, gap_at = max(
        ((g["longest_unavailability_s"], g["longest_unavailability_from_s"]) for g in per_group.values()),
        default=(0.0, 0.0),
    )
    summary = Summary(
        cfg.seed,
        [s.to_json() for s in injected],
        faults,
        ops,
        [v.to_json() for v in verdicts],
        sum(g["leader_changes"] for g in per_group.values()),
        gap,
        time.monotonic() - t_start,
        notes,
    )
    doc = summary.to_json()
    doc["longest_unavailability_from_s"] = gap_at
    doc["commit_index"] = max(s.commit_index for s in sites)
    doc["groups"] = per_group
    doc["operations_by_kind"] = operations_by_kind(events)
    if not summary.ok:
        doc["reproduce"] = summary.reproduce(cfg)
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    return summary


def operations_by_kind(events: Sequence[Any]) -> dict[str, dict[str, int]]:
    """Every client operation of the history by what it was and how it ended (ok, fail, info; a consume is
    recorded as it arrives, ok only): ``{"send": {"ok": 9968, "info": 2}, ...}``."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        if e.type in (OK, FAIL, INFO):
            kind = out.setdefault(e.f, {})
            kind[e.type] = kind.get(e.type, 0) + 1
    return dict(sorted(out.items()))


def failovers(events: Sequence[Any]) -> list[float]:
    """For each fault that took the leader away (a kill, pause, isolation, power cut, removal or replacement of
    the node that led), seconds from the fault to the first leader the observer saw on another node; for a
    partition or a pause only if it saw one before the heal (the old leader may simply lead on after it)."""
    out = []
    leader: str | None = None
    pending: tuple[float, str, str] | None = None  # (fault time, the leader it hit, the fault)
    for e in events:
        if e.f == "leader" and e.type == "observe":
            if pending is not None and e.value.get("node") != pending[1]:
                out.append(round(e.time - pending[0], 3))
                pending = None
            leader = e.value.get("node")
        elif (
            e.type == "nemesis"
            and pending is not None
            and e.f == pending[2]
            and e.f.startswith(("partition", "pause"))
            and e.value.get("phase") == "heal"
        ):
            pending = None  # the old leader is back (a dead one is not: its group's next leader counts)
        elif e.type == "nemesis" and e.value.get("phase") == "start" and leader is not None:
            d = e.value
            hit = {d.get("node"), d.get("dead"), d.get("removed"), d.get("paused"), *(d.get("nodes") or [])}
            isolated = e.f == "partition-isolate-leader" or (
                e.f.startswith("partition")
                and all(leader not in side or len(side) == 1 for side in d.get("sides", []))
            )
            if leader in hit or isolated:
                pending = (e.time, leader, e.f)
    return out


def _set_top_level(config: Path, key: str, value: int) -> None:
    """Add ``key = value`` to a node.toml written by ``dledger.group.create`` (before its first table)."""
    lines = config.read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    lines.insert(at, f"{key} = {value}")
    config.write_text("\n".join(lines) + "\n")


__all__ = ["RunConfig", "Summary", "run"]
