"""The nemesis: faults injected into a running local group of node processes, each with its own heal.

Fault kinds (``FAULT_KINDS``), as in Jepsen's and DLedger's suites:

==========================  ==========================================================================
kill-leader, kill-random    SIGKILL the node; healed by starting it again (it recovers from its files)
pause-leader, pause-random  SIGSTOP, held past the election timeout (until another node leads); SIGCONT
partition-halves            two random halves cannot exchange messages
partition-isolate-leader    the leader alone on one side
partition-ring              a majorities ring: every node hears from a majority, no two the same majority
partition-bridge            two halves that share one node (the bridge), which hears from everyone
oneway-loss                 messages from one node to another break their connection with probability p
oneway-latency              messages from one node (the leader when known) to the others are delayed
disk-full                   the log store of one node answers ENOSPC to every write (faultnode launcher)
torn-tail                   a follower is killed and the tail of its last segment gets a partial frame
                            (a write cut short by the crash), then it is restarted
powerloss-one               one node loses power: SIGKILL, then its directory loses what it had not
                            synced (storage/powerloss.py: dropped, or torn at a random byte); restarted
powerloss-minority          the same for a minority of the nodes at once (the leader among them half the
                            time)
powerloss-all               every node loses power at once, then all restart
powerloss-partition         the group is cut into random halves; while cut, every node loses power; the
                            nodes restart still cut, then the network heals
powerloss-pause             a node (the leader when known) is paused until another leads; then every node,
                            the paused one too, loses power; all restart
member-add                  a new node joins as a learner, catches up and is promoted (``member add``,
                            ``member promote``); healed by removing a member (the leader half the time),
                            back to the group's first size
member-remove               a member (the leader half the time) is removed (``member remove``: its process
                            stops, its directory stays); healed by adding and promoting a new node
member-replace              a node's machine is gone (SIGKILL, never restarted); ``group replace-node``
                            adds a new node, lets it catch up, promotes it and removes the dead one
==========================  ==========================================================================

Membership changes go through ``dledger.group_members`` (the commands' own code), so group.json follows: the
nemesis reloads the group after each, and a new member of a proxied group gets its proxy links. Node ids are
never reused; a removed node's directory stays where it was (the checkers and the audit read the members').

Before each power cut the nemesis takes a *mark* (``dledger.chaos.powercut``): the commit index and the chain
of every entry up to it; the ``power_loss`` checker later holds the final files to it.

Every injection and heal is recorded in the history as a ``nemesis`` event with what exactly was done (nodes,
pairs, pids, bytes), so a failing run's schedule can be read back and replayed from its seed.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger import group as grp
from dledger import group_members
from dledger.chaos import powercut
from dledger.chaos.faultnode import control_path
from dledger.chaos.history import History
from dledger.chaos.proxy import LinkSpec, Network
from dledger.errors import DLedgerError, UnavailableError
from storage import powerloss
from storage.segments import list_segments

FAULT_KINDS = (
    "kill-leader",
    "kill-random",
    "pause-leader",
    "pause-random",
    "partition-halves",
    "partition-isolate-leader",
    "partition-ring",
    "partition-bridge",
    "oneway-loss",
    "oneway-latency",
    "disk-full",
    "torn-tail",
    "powerloss-one",
    "powerloss-minority",
    "powerloss-all",
    "powerloss-partition",
    "powerloss-pause",
    "member-add",
    "member-remove",
    "member-replace",
)
MEMBERSHIP = frozenset(k for k in FAULT_KINDS if k.startswith("member-"))
NEEDS_PROXY = frozenset(
    k for k in FAULT_KINDS if k.startswith(("partition", "oneway")) or k == "powerloss-partition"
)
POWER_LOSS = frozenset(k for k in FAULT_KINDS if k.startswith("powerloss"))
LAUNCHER = "dledger.chaos.faultnode"


@dataclass(frozen=True, slots=True)
class Step:
    """One scheduled fault: inject, hold ``hold_s`` (at least until ``until`` holds, when given), heal."""

    kind: str
    hold_s: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "hold_s": round(self.hold_s, 3)}


def schedule(seed: int, kinds: list[str], count: int, hold_s: tuple[float, float] = (1.0, 3.0)) -> list[Step]:
    """A reproducible fault schedule: every kind once (shuffled), then random kinds, ``count`` steps in all."""
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad:
        raise ValueError(f"unknown fault kinds {bad}; known: {', '.join(FAULT_KINDS)}")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    while len(order) < count:
        order.append(rng.choice(kinds))
    return [Step(k, rng.uniform(*hold_s)) for k in order[:count]]


@dataclass(slots=True)
class Active:
    """A fault in effect, with what its heal needs."""

    step: Step
    detail: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0


class Nemesis:
    def __init__(
        self,
        group: grp.GroupSpec,
        history: History,
        network: Network | None,
        seed: int,
        *,
        launcher: str = LAUNCHER,
        election_timeout_s: float = 0.3,
        power_loss_modes: tuple[str, ...] = ("drop", "torn"),
        directory: Path | None = None,
        before_join: Callable[[grp.GroupSpec, str], None] | None = None,
        name: str | None = None,
    ):
        """``directory``: the group's (membership faults change its group.json); ``before_join(group, id)``:
        called before a node ``id`` joins (a secure cluster issues its certificate there)."""
        self.group = group
        self.where = {"group": name} if name else {}  # in the events of a run of several groups
        self.directory = directory
        self.before_join = before_join
        self.members_seen = {n.id for n in group.nodes}
        self.size = len(group.nodes)  # what membership faults return the group to
        self.history = history
        self.network = network
        self.rng = random.Random(seed ^ 0x5EED)
        self.launcher = launcher
        self.election_timeout_s = election_timeout_s
        self.power_loss_modes = power_loss_modes
        self.paused: set[str] = set()
        self.counts: dict[str, int] = {}
        self.marks: list[powercut.Mark] = []  # what was committed before each power cut
        self.refusals: list[tuple[int, str, str]] = []  # (cut number, node, its log's last lines)
        self._stop = threading.Event()

    # -- observing -----------------------------------------------------------------------------------------------

    def leader(self) -> str | None:
        lead = grp.leader_of(grp.status(self.group, timeout_s=0.3))
        return lead.id if lead is not None else None

    def _ids(self) -> list[str]:
        return [n.id for n in self.group.nodes]

    def _pick(self, prefer_leader: bool) -> str:
        if prefer_leader:
            lead = self.leader()
            if lead is not None:
                return lead
        return self.rng.choice(self._ids())

    def _follower(self) -> str:
        lead = self.leader()
        return self.rng.choice([i for i in self._ids() if i != lead])

    def _wait_new_leader(self, old: str | None, max_s: float) -> str | None:
        """Poll until a node other than ``old`` leads (the sign an election timeout passed), up to ``max_s``."""
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline and not self._stop.is_set():
            rows = grp.status(self.group, timeout_s=0.3)
            lead = grp.leader_of([r for r in rows if r.id != old])
            if lead is not None:
                return lead.id
            self._stop.wait(0.05)
        return None

    # -- faults --------------------------------------------------------------------------------------------------

    def inject(self, step: Step) -> Active:
        if step.kind in NEEDS_PROXY and self.network is None:
            raise ValueError(f"fault {step.kind} needs a proxied group (a Network)")
        act = Active(step, started=time.monotonic())
        kind = step.kind
        if kind in ("kill-leader", "kill-random"):
            node = self._pick(kind == "kill-leader")
            pid = grp.kill_node(self.group.node(node))
            act.detail = {"node": node, "pid": pid}
        elif kind in ("pause-leader", "pause-random"):
            node = self._pick(kind == "pause-leader")
            pid = grp.signal_node(self.group.node(node), signal.SIGSTOP)
            if pid is not None:
                self.paused.add(node)
            act.detail = {"node": node, "pid": pid}
        elif kind.startswith("partition-"):
            act.detail = self._partition(kind)
        elif kind == "oneway-loss":
            src, dst = self.rng.sample(self._ids(), 2)
            p = round(self.rng.uniform(0.05, 0.4), 3)
            self.network.loss(src, dst, p)
            act.detail = {"from": src, "to": dst, "reset_probability": p}
        elif kind == "oneway-latency":
            src = self._pick(True)
            delay = round(self.rng.uniform(0.05, 0.25), 3)
            for dst in self._ids():
                if dst != src:
                    self.network.delay(src, dst, delay)
            act.detail = {"from": src, "delay_s": delay}
        elif kind == "disk-full":
            node = self._pick(self.rng.random() < 0.5)
            control_path(self.group.node(node).data_dir).write_text("injected by the nemesis\n")
            act.detail = {"node": node}
        elif kind in POWER_LOSS:
            act.detail = self._power_cut(kind)
        elif kind in MEMBERSHIP:
            act.detail = self._membership(kind)
        elif kind == "torn-tail":
            node = self._follower()
            pid = grp.kill_node(self.group.node(node))
            act.detail = {
                "node": node,
                "pid": pid,
                **tear_tail(Path(self.group.node(node).data_dir), self.rng),
            }
            grp.start_node(self.group.node(node), self.launcher)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.history.add("nemesis", "nemesis", kind, phase="start", **act.detail, **self.where)
        return act

    def _power_cut(self, kind: str) -> dict[str, Any]:
        ids = self._ids()
        lead = self.leader()
        detail: dict[str, Any] = {}
        if kind == "powerloss-one":
            nodes = [self._pick(self.rng.random() < 0.5)]
        elif kind == "powerloss-minority":
            k = max(1, (len(ids) - 1) // 2)
            others = [i for i in ids if i != lead]
            nodes = self.rng.sample(others, min(k, len(others)))
            if lead is not None and self.rng.random() < 0.5:
                nodes[0] = lead
        else:
            nodes = list(ids)
        if kind == "powerloss-partition":
            detail.update(self._partition("partition-halves"))
            self._stop.wait(self.rng.uniform(0.3, 0.8))  # each side runs (and writes) on its own for a while
        elif kind == "powerloss-pause":
            paused = self._pick(True)
            detail["paused"] = paused
            detail["paused_pid"] = grp.signal_node(self.group.node(paused), signal.SIGSTOP)
            self._wait_new_leader(paused, 3 * self.election_timeout_s + 1.0)
        number = len(self.marks) + 1
        mark, cut = powercut.cut_power(
            self.group, nodes, self.rng, number, self.history.now, kind, self.power_loss_modes
        )
        if mark is not None:
            self.marks.append(mark)
        detail.update(cut)
        self.paused.difference_update(nodes)  # a killed process is no longer paused
        detail.update(
            number=number, nodes=nodes, commit_index=mark.commit_index if mark is not None else None
        )
        return detail

    def _partition(self, kind: str) -> dict[str, Any]:
        ids = self._ids()
        self.rng.shuffle(ids)
        n = len(ids)
        if kind == "partition-halves":
            sides = [ids[: n // 2], ids[n // 2 :]]
            cut = self.network.partition(sides)
        elif kind == "partition-isolate-leader":
            lead = self._pick(True)
            sides = [[lead], [i for i in ids if i != lead]]
            cut = self.network.partition(sides)
        elif kind == "partition-bridge":
            bridge = ids[0]
            rest = ids[1:]
            sides = [[bridge, *rest[: len(rest) // 2]], [bridge, *rest[len(rest) // 2 :]]]
            cut = self.network.partition(sides)
        elif kind == "partition-ring":
            # Node ids[k] hears only from the majority-1 nodes before it on the ring (one-way cuts): every
            # node's view is a majority, and no two views are the same majority.
            m = n // 2 + 1
            hears = {ids[k]: {ids[(k - d) % n] for d in range(1, m)} for k in range(n)}
            cut = [(src, dst) for dst in ids for src in ids if src != dst and src not in hears[dst]]
            self.network.cut_pairs(cut)
            sides = [[dst, *sorted(hears[dst])] for dst in ids]
        else:
            raise ValueError(kind)
        return {"sides": sides, "cut": [f"{a}->{b}" for a, b in cut]}

    def hold(self, act: Active) -> None:
        """Keep the fault in effect for its hold time; kills and pauses of a leader also last until another
        node leads (so a pause is longer than the election timeout), bounded by 4 x the hold time."""
        kind = act.step.kind
        deadline = act.started + act.step.hold_s
        if kind in ("pause-leader", "pause-random", "kill-leader", "kill-random"):
            self._wait_new_leader(
                act.detail.get("node"), max(act.step.hold_s * 4, 3 * self.election_timeout_s)
            )
        remaining = deadline - time.monotonic()
        if remaining > 0:
            self._stop.wait(remaining)  # the fault's own duration, drawn from the seed

    def heal(self, act: Active) -> None:
        kind = act.step.kind
        d = act.detail
        if kind in ("kill-leader", "kill-random"):
            grp.start_node(self.group.node(d["node"]), self.launcher)
        elif kind in POWER_LOSS:
            for nid in d["nodes"]:
                grp.start_node(self.group.node(nid), self.launcher)
            for nid, why in powercut.refused_to_start(self.group, d["nodes"]).items():
                self.refusals.append((d["number"], nid, why))
            if kind == "powerloss-partition":
                self.network.heal()
        elif kind in ("pause-leader", "pause-random"):
            self._resume(d["node"])
        elif kind.startswith(("partition-", "oneway-")):
            self.network.heal()
        elif kind == "disk-full":
            control_path(self.group.node(d["node"]).data_dir).unlink(missing_ok=True)
        elif kind in MEMBERSHIP:
            d["heal"] = self._resize()
        restarted = self.ensure_running()
        done = {"heal": d["heal"]} if "heal" in d else {}  # a membership fault's heal is a change too
        self.history.add("nemesis", "nemesis", kind, phase="heal", restarted=restarted, **done, **self.where)

    # -- membership ----------------------------------------------------------------------------------------------

    def _membership(self, kind: str) -> dict[str, Any]:
        if self.directory is None:
            raise ValueError(f"fault {kind} needs the group's directory (Nemesis(directory=...))")
        if kind == "member-add":
            return self._add()
        if kind == "member-remove":
            return self._remove(self._pick(self.rng.random() < 0.5))
        dead = self._pick(self.rng.random() < 0.5)
        pid = grp.kill_node(self.group.node(dead))
        t0 = time.monotonic()
        self._wait_new_leader(dead, 30.0)  # as an operator would: replace once the others lead again
        node = self._next_id()
        self._joining(node)
        try:
            r = group_members.replace_node(
                self.directory,
                dead,
                timeout_s=60.0,
                module=self.launcher,
                node_id=node,
                on_recorded=self._reload,  # its links listen before the members dial it (their [dial])
            )
        except DLedgerError as e:
            # As an operator would after a failed replace-node: see what the configuration says, then finish
            # the job (the new node promoted by the settling, the dead one removed).
            out = {"dead": dead, "pid": pid, "node": node, **self._settle(f"replace-node {dead}: {e}")}
            if node in (out["settled"] or ()):
                out["finish"] = self._remove(dead)
            out["completed"] = node in self._ids() and dead not in self._ids()
            return out
        finally:
            self._reload()
        return {
            "dead": dead,
            "pid": pid,
            "node": r.new,
            "caught_up": r.caught_up_index,
            "seconds": round(time.monotonic() - t0, 3),
            "completed": True,
        }

    def _resize(self) -> list[dict[str, Any]]:
        """Back to the group's first size: a member removed (the leader half the time) while there are more,
        a new one added while there are fewer (an add or remove that failed under faults leaves it as it is)."""
        done: list[dict[str, Any]] = []
        for _ in range(3):
            n = len(self.group.nodes)
            if n == self.size:
                break
            done.append(self._remove(self._pick(self.rng.random() < 0.5)) if n > self.size else self._add())
        return done

    def _next_id(self) -> str:
        """The first ``nK`` never used in this group (a removed node's directory stays, with its id)."""
        k = 0
        while f"n{k}" in self.members_seen or (self.directory / f"n{k}").exists():  # type: ignore[operator]
            k += 1
        return f"n{k}"

    def _joining(self, node: str) -> None:
        self.members_seen.add(node)
        if self.before_join is not None:
            self.before_join(self.group, node)

    def _add(self) -> dict[str, Any]:
        """A new node joins, catches up and is promoted; ``{"node": id, ...}`` or what went wrong."""
        assert self.directory is not None
        node = self._next_id()
        self._joining(node)
        t0 = time.monotonic()
        try:
            group_members.add_member(self.directory, node, module=self.launcher, on_recorded=self._reload)
            self._reload()
            group_members.promote_member(self.directory, node, timeout_s=60.0)
        except DLedgerError as e:
            out = {"node": node, **self._settle(f"add {node}: {e}")}
            return {**out, "completed": node in (out["settled"] or ())}
        finally:
            self._reload()
        return {"node": node, "seconds": round(time.monotonic() - t0, 3), "completed": True}

    def _remove(self, node: str) -> dict[str, Any]:
        """``node`` leaves the configuration; a removal whose answer was lost is checked, and asked again
        while the node is still a member (at most three times)."""
        assert self.directory is not None
        out: dict[str, Any] = {"removed": node}
        for _ in range(3):
            try:
                group_members.remove_member(self.directory, node)
            except DLedgerError as e:
                out.update(self._settle(f"remove {node}: {e}"))
                if node in (out["settled"] or (node,)):
                    continue
            finally:
                self._reload()
            break
        out["completed"] = node not in self._ids()
        return out

    def _reload(self) -> None:
        """Follow group.json after a membership change: the new nodes' proxy links listen, new nodes journal
        for power cuts when the others do."""
        assert self.directory is not None
        group = grp.load(self.directory)
        assert group is not None
        if self.network is not None:
            self.network.add_links(
                LinkSpec(a, b, p, group.node(b).address)
                for a, b, p in group.links
                if b in {n.id for n in group.nodes}
            )
        journaling = any(powerloss.enabled(n.data_dir) for n in self.group.nodes)
        for n in group.nodes:
            if journaling and not powerloss.enabled(n.data_dir):
                powerloss.enable(n.data_dir)  # from its next start (a node journals what it writes then)
        self.group = group

    def _settle(self, failure: str) -> dict[str, Any]:
        """A membership change that failed under the faults of the moment: make group.json say what the leader's
        configuration says (a node it does not know is stopped and dropped; a learner left behind is promoted)
        and report it (a note, not a violation: the change's outcome was not acknowledged)."""
        self.history.add("nemesis", "nemesis", "membership-failed", error=failure[:300], **self.where)
        assert self.directory is not None
        deadline = time.monotonic() + 60.0
        self._stop.wait(1.0)  # a change whose answer was lost may still commit: let it settle first
        while time.monotonic() < deadline:
            self._reload()  # the change may have written group.json before it failed
            conf = grp.configuration(self.group, timeout_s=1.0)
            if conf is None:
                time.sleep(0.2)
                continue
            members = set(conf.voters) | set(conf.learners)
            try:
                for n in list(self.group.nodes):
                    if n.id not in members:
                        grp.stop_node(n)
                        group_members.forget_member(self.directory, n.id)
                for learner in conf.learners:
                    group_members.promote_member(self.directory, learner, timeout_s=30.0)
            except DLedgerError:
                time.sleep(0.2)
                continue
            finally:
                self._reload()
            return {"failed": failure[:300], "settled": sorted(members)}
        return {"failed": failure[:300], "settled": None}

    def _resume(self, node: str) -> None:
        grp.signal_node(self.group.node(node), signal.SIGCONT)
        self.paused.discard(node)

    def ensure_running(self) -> list[str]:
        """Start any node that is not running (killed, or died of a fault): the ids started."""
        started = []
        for spec in self.group.nodes:
            if not grp.is_running(spec):
                grp.start_node(spec, self.launcher)
                started.append(spec.id)
        return started

    def heal_all(self) -> list[str]:
        """Undo every fault: resume paused nodes, heal the network, free the disks, start stopped nodes."""
        for node in list(self.paused):
            self._resume(node)
        if self.network is not None:
            self.network.heal()
        for spec in self.group.nodes:
            control_path(spec.data_dir).unlink(missing_ok=True)
        return self.ensure_running()

    def stop(self) -> None:
        self._stop.set()


def tear_tail(data_dir: Path, rng: random.Random) -> dict[str, Any]:
    """Append a partial entry frame to the last data segment of a stopped node: the bytes a crash leaves
    when it interrupts a write that was never acknowledged (a header that claims more body than follows)."""
    segs = list_segments(str(data_dir / "data"))
    if not segs:
        return {"torn": 0}
    _base, path = segs[-1]
    size = os.path.getsize(path)
    import struct

    body_len = rng.randint(64, 4096)
    header = struct.pack(">iiqqqiIIi", 1, 48 + body_len, 1 << 40, 1 << 30, size, 0, 0, 0, body_len)
    garbage = header[: rng.randint(8, 48)] if rng.random() < 0.3 else header + rng.randbytes(body_len // 2)
    with open(path, "ab") as f:
        f.write(garbage)
    return {"segment": os.path.basename(path), "at": size, "torn": len(garbage)}


def wait_healthy(group: grp.GroupSpec, timeout_s: float, stop: threading.Event | None = None) -> bool:
    """Poll until every node answers and one of them leads."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # A generous status timeout: on a loaded machine (CI runs Spark beside this) a node that just restarted
        # can take longer than a fraction of a second to answer, which is not the unavailability we measure.
        rows = grp.status(group, timeout_s=1.5)
        if all(r.role != "down" for r in rows) and grp.leader_of(rows) is not None:
            return True
        if stop is not None and stop.is_set():
            return False
        time.sleep(0.05)
    return False


def wait_converged(group: grp.GroupSpec, timeout_s: float) -> list[grp.NodeStatus]:
    """Poll until every node is up and all report the same last index and commit index (nothing in flight)."""
    deadline = time.monotonic() + timeout_s
    rows = grp.status(group, timeout_s=1.5)
    while time.monotonic() < deadline:
        ok = all(r.role != "down" for r in rows) and grp.leader_of(rows) is not None
        if ok and len({(r.last_index, r.commit_index) for r in rows}) == 1:
            return rows
        time.sleep(0.1)
        rows = grp.status(group, timeout_s=1.5)
    raise UnavailableError(
        "the group did not converge within "
        f"{timeout_s} s: "
        + ", ".join(f"{r.id} {r.role} t{r.term} last {r.last_index} commit {r.commit_index}" for r in rows)
    )
