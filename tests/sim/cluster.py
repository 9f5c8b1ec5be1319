"""A deterministic in-memory cluster of RaftCores: virtual clock, explicit network verbs, crash and restart.

This is the runtime's job done in a few lines, with every source of nondeterminism made an input: each node has a
``MemoryLogStore`` and ``MemoryMetaStore`` (its "disk"), each core gets its own ``random.Random`` derived from the
cluster seed, and messages sit in one visible queue until a verb delivers, drops, delays, duplicates or reorders
them. Handling a ``Ready`` follows the contract in ``dledger.core.messages.Ready``: persist (hard state, snapshot,
truncation, frames), then send, then apply, then advance. ``crash(n, stage)`` can stop a node part-way through
that sequence, losing everything not yet persisted, which is exactly what a kill -9 of the runtime loses.
``hold(n)`` takes a node's next Ready and leaves it unwritten (a slow disk) until ``release(n)``: meanwhile the
node keeps stepping what arrives and ticking, as the runtime's loop does while its I/O thread writes, and its
heartbeats and answers to heartbeats leave at once (``RaftCore.take_heartbeats``, as the node's ticker and
``Peers.handle_batch`` send them).

Safety is checked by ``check_invariants()`` (the property tests call it after every step):

- election safety: at most one leader per term, over the whole history;
- log matching: entries with the same index and term have the same chain_crc (hence identical prefixes),
  checked on every durable append;
- state machine safety: an index, once committed anywhere, always commits the same entry, and no node ever
  truncates or loses an entry it had as committed;
- leader completeness: every leader whose term is newer than a commit holds the committed entry;
- commit monotonicity: a core's commit index never decreases and never passes its last index;
- membership (``dledger/core/membership.py``): every config entry a node stores changes at most one voter from
  the configuration before it in that log, so no two majorities of consecutive configurations are disjoint, and
  the config entry before it was committed (one change at a time); only a voter campaigns or wins an election.

Membership verbs: ``add_node`` starts an empty node that knows no configuration (it joins when the leader's log or
snapshot reaches it), ``change(leader, ConfChange)`` proposes a configuration change on a leader. A compaction
records the configuration at its index with the node's "snapshot" (meta key ``snapshot_conf``), as the runtime
records it in the snapshot's metadata, so a restart recomputes the configuration from snapshot + log.

Every verb appends one readable line to ``transcript`` (as do the cores: "n2 became leader at term 7"), so a
failing schedule reads like a story.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dledger.core.config import RaftConfig
from dledger.core.membership import ConfChange, Configuration, majorities_overlap
from dledger.core.messages import InstallSnapshot, Message, Ready, Role, SnapshotStatus, split_early
from dledger.core.raft import RaftCore
from storage import codec
from storage.errors import IndexOutOfRange
from storage.memory import MemoryLogStore, MemoryMetaStore


class InvariantViolation(AssertionError):
    pass


@dataclass
class Envelope:
    msg: Message
    deliver_at: int  # virtual tick at or after which deliver_all() may deliver it


@dataclass
class SimNode:
    id: str
    store: MemoryLogStore
    meta: MemoryMetaStore
    core: RaftCore | None = None
    applied: int = -1
    last_commit: int = -1  # highest commit index this incarnation reported (monotonicity check)
    crashes: int = 0
    applied_entries: list[tuple[int, int]] = field(default_factory=list)  # (index, chain_crc) in apply order
    read_states: list[tuple[int, int]] = field(
        default_factory=list
    )  # (context, read index) as Ready gave them
    initial_voters: tuple[str, ...] = ()  # the members it was started with (empty: a node joining the group)
    acked: int = -1  # highest index a leader handed on as committed when stepping an answer (commit_acked)
    stalled: bool = False  # its disk is slow (``hold``): the next Ready it takes stays unwritten
    held: tuple[Ready, tuple[Message, ...]] | None = (
        None  # that Ready, and the messages waiting for its write
    )

    @property
    def alive(self) -> bool:
        return self.core is not None


CRASH_STAGES = ("before-ready", "after-hard-state", "after-truncate", "after-frames", "after-early-send")


class Cluster:
    """N cores wired through an explicit message queue, driven by verbs."""

    def __init__(
        self,
        n: int = 3,
        seed: int = 0,
        config: RaftConfig | None = None,
        segment_size: int = 4096,
        ids: list[str] | None = None,
        echo: Callable[[str], None] | None = None,
        check_logs: bool = True,
    ):
        self.ids = ids or [f"n{i + 1}" for i in range(n)]
        self.config = config or RaftConfig(segment_size=segment_size)
        if self.config.segment_size != segment_size and config is None:
            self.config = replace(self.config, segment_size=segment_size)
        self.seed = seed
        self._seeder = random.Random(seed)
        self.now = 0
        self.queue: list[Envelope] = []
        self.cuts: set[frozenset[str]] = set()
        self._drop_next: list[Callable[[Message], bool]] = []
        self.transcript: list[str] = []
        self._echo = echo
        self.check_logs = check_logs
        self.nodes: dict[str, SimNode] = {}
        # History for the invariants.
        self.leaders_by_term: dict[int, str] = {}
        self.committed: dict[int, tuple[int, int]] = {}  # index -> (term, chain_crc), as first reported
        self.commit_term: dict[int, int] = {}  # index -> highest term known when it was reported committed
        self.max_committed = -1
        self.delivered = 0
        self.truncations = 0  # Ready.truncate_from handled (a follower dropping a conflicting suffix)
        self.early_heartbeats = 0  # heartbeats and answers sent while their node's write was held (``hold``)
        self._chains: dict[tuple[int, int], int] = {}  # (index, term) -> chain_crc, over every durable append
        self._completeness_checked: dict[
            tuple[str, int], int
        ] = {}  # (leader, term) -> committed index checked
        self.conf_changes = 0  # config entries proposed
        for nid in self.ids:
            node = SimNode(
                nid,
                MemoryLogStore(self.config.segment_size),
                MemoryMetaStore(),
                initial_voters=tuple(self.ids),
            )
            self.nodes[nid] = node
            self._boot(node)

    # -- transcript ------------------------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        line = f"t={self.now} {line}"
        self.transcript.append(line)
        if self._echo is not None:
            self._echo(line)

    def dump(self, last: int = 200) -> str:
        return "\n".join(self.transcript[-last:])

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def _boot(self, node: SimNode) -> None:
        hs = node.meta.load_hard_state()
        raw = node.meta.get("applied")
        applied = int(raw) if raw is not None else -1
        applied = max(applied, node.store.first_index - 1)
        node.applied = applied
        node.last_commit = applied
        rng = random.Random(self._seeder.getrandbits(64))
        raw_conf = node.meta.get("snapshot_conf")
        conf = Configuration.decode(raw_conf) if raw_conf is not None else None
        node.core = RaftCore(
            node.id,
            list(node.initial_voters),
            node.store,
            hs,
            self.config,
            rng,
            applied,
            log_event=self.say,
            conf=conf,
        )

    def crash(self, nid: str, stage: str = "before-ready") -> None:
        """Kill ``nid``; with a ``stage`` other than before-ready it dies part-way through handling a Ready."""
        node = self.nodes[nid]
        if not node.alive:
            return
        core = node.core
        assert core is not None
        held, node.held, node.stalled = node.held, None, False
        if held is not None:  # it dies during the slow write: the stage says how far the write got
            if stage not in ("before-ready", "after-early-send"):
                self._persist(node, held[0], stop_after=stage)
        elif stage == "after-early-send" and core.has_ready():
            # A leader sent its AppendEntries (split_early) and died before its own write of them.
            rd = core.ready()
            early, _ = split_early(rd, core.role)
            self._send(early)
        elif stage != "before-ready" and core.has_ready():
            rd = core.ready()
            self._persist(node, rd, stop_after=stage)
        node.core = None
        node.crashes += 1
        self.say(f"crash {nid} ({stage})")

    def restart(self, nid: str) -> None:
        node = self.nodes[nid]
        if node.alive:
            return
        self._boot(node)
        self.say(f"restart {nid} at term {node.core.term} with log up to {node.store.last_index}")

    def add_node(self, nid: str) -> None:
        """Start a new, empty node: it knows no configuration, never campaigns, and joins once a leader that has
        it in its configuration replicates to it (``change(leader, ConfChange(ADD_LEARNER, nid))``)."""
        if nid in self.nodes:
            raise ValueError(f"node {nid} exists")
        node = SimNode(nid, MemoryLogStore(self.config.segment_size), MemoryMetaStore())
        self.nodes[nid] = node
        self.ids.append(nid)
        self._boot(node)
        self.say(f"add node {nid} (empty, knows no configuration)")

    def change(self, nid: str, change: ConfChange):
        """Propose ``change`` on leader ``nid`` (raises what ``RaftCore.propose_conf_change`` raises)."""
        core = self.nodes[nid].core
        assert core is not None
        p = core.propose_conf_change(change)
        self.conf_changes += 1
        self.say(f"change on {nid}: {change} at index {p.first_index}")
        self.process(nid)
        return p

    def members(self) -> tuple[str, ...]:
        """Voters and learners of the configuration of the live leader (all nodes when there is none)."""
        leader = self.leader()
        if leader is None:
            return tuple(self.ids)
        return self.nodes[leader].core.configuration.members

    # -- network verbs ----------------------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        self.cuts.add(frozenset((a, b)))
        self.say(f"cut {a}-{b}")

    def isolate(self, nid: str) -> None:
        for other in self.ids:
            if other != nid:
                self.cuts.add(frozenset((nid, other)))
        self.say(f"isolate {nid}")

    def partition(self, *groups: set[str]) -> None:
        """Only nodes in the same group can talk (nodes in no group are isolated)."""
        self.cuts.clear()
        where = {n: i for i, g in enumerate(groups) for n in g}
        for a in self.ids:
            for b in self.ids:
                if a < b and (a not in where or where.get(a) != where.get(b)):
                    self.cuts.add(frozenset((a, b)))
        self.say("partition " + " | ".join(",".join(sorted(g)) for g in groups))

    def heal(self) -> None:
        self.cuts.clear()
        self.say("heal")

    def connected(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cuts

    def drop(self, i: int) -> None:
        env = self.queue.pop(i)
        self.say(f"drop {_describe(env.msg)}")
        self._snapshot_fate(env.msg, False)

    def duplicate(self, i: int) -> None:
        env = self.queue[i]
        self.queue.append(Envelope(env.msg, env.deliver_at))
        self.say(f"duplicate {_describe(env.msg)}")

    def delay(self, i: int, ticks: int) -> None:
        env = self.queue[i]
        env.deliver_at = self.now + ticks
        self.say(f"delay {_describe(env.msg)} by {ticks}")

    def reorder(self, i: int) -> None:
        """Move message ``i`` to the back of the queue (everything else overtakes it)."""
        self.queue.append(self.queue.pop(i))

    def deliver(self, i: int = 0) -> bool:
        """Deliver message ``i`` of the queue (whatever its delivery time); False if it was lost on the way."""
        env = self.queue.pop(i)
        return self._deliver(env.msg)

    def deliver_where(self, pred: Callable[[Message], bool]) -> int:
        """Deliver (in queue order) the queued messages ``pred`` selects, leaving the others queued."""
        picked = [e for e in self.queue if pred(e.msg)]
        self.queue = [e for e in self.queue if not pred(e.msg)]
        return sum(1 for e in picked if self._deliver(e.msg))

    def drop_where(self, pred: Callable[[Message], bool]) -> int:
        picked = [e for e in self.queue if pred(e.msg)]
        self.queue = [e for e in self.queue if not pred(e.msg)]
        for e in picked:
            self.say(f"drop {_describe(e.msg)}")
            self._snapshot_fate(e.msg, False)
        return len(picked)

    def deliver_all(self, max_rounds: int = 1000) -> int:
        """Deliver every due message, including the ones their handling produces, up to ``max_rounds`` rounds."""
        n = 0
        for _ in range(max_rounds):
            self.process_all()
            due = [e for e in self.queue if e.deliver_at <= self.now]
            if not due:
                return n
            self.queue = [e for e in self.queue if e.deliver_at > self.now]
            for env in due:
                self._deliver(env.msg)
                n += 1
        raise RuntimeError(f"deliver_all did not settle in {max_rounds} rounds")

    def drop_next(self, pred: Callable[[Message], bool]) -> None:
        """Lose the next message ``pred`` selects, whenever it is delivered (a one-shot network fault)."""
        self._drop_next.append(pred)

    def _deliver(self, m: Message) -> bool:
        node = self.nodes[m.dst]
        for i, pred in enumerate(self._drop_next):
            if pred(m):
                del self._drop_next[i]
                self.say(f"drop {_describe(m)}")
                self._snapshot_fate(m, False)
                return False
        if not node.alive or not self.connected(m.src, m.dst):
            self._snapshot_fate(m, False)
            return False
        self.delivered += 1
        core = node.core
        assert core is not None
        core.step(m)
        self._send_heartbeats(node)
        self._commit_acked(node)
        if type(m) is InstallSnapshot:
            self._snapshot_fate(m, True)
        self.process(m.dst)
        return True

    def _send_heartbeats(self, node: SimNode) -> None:
        """While ``node``'s write is held, its heartbeats and answers to heartbeats leave at once."""
        if node.held is not None and node.core is not None:
            early = tuple(node.core.take_heartbeats())
            self.early_heartbeats += len(early)
            self._send(early)

    def _commit_acked(self, node: SimNode) -> None:
        """What ``ReadyLoop.commit_acked`` does in the node: a leader hands on its core's commit index, bounded by
        what its store holds, as soon as an answer is stepped (before any Ready). The entries it reads from its
        store are recorded as committed, so state machine safety checks them (docs/send-budget.md, fix 3)."""
        core = node.core
        if core is None or core.role is not Role.LEADER:
            return
        c = min(core.commit_index, node.store.last_index)
        store = node.store
        for i in range(max(node.acked + 1, store.first_index), c + 1):
            self._record_commit(node, i, store.term(i), store.entry(i).header.chain_crc)
        node.acked = max(node.acked, c)

    def _snapshot_fate(self, m: Message, success: bool) -> None:
        """The leader's runtime learns whether shipping a snapshot worked (it streamed the files itself)."""
        if type(m) is not InstallSnapshot:
            return
        leader = self.nodes[m.src]
        if leader.alive and leader.core.term == m.term:
            leader.core.step(SnapshotStatus(m.term, m.dst, m.src, success))

    # -- time ---------------------------------------------------------------------------------------------------

    def tick(self, n: int = 1, nodes: list[str] | None = None) -> None:
        """Advance the virtual clock ``n`` ticks; every live node (or only ``nodes``) ticks each time."""
        for _ in range(n):
            self.now += 1
            for nid in nodes or self.ids:
                node = self.nodes[nid]
                if node.alive:
                    node.core.tick()
                    self._send_heartbeats(node)
            self.process_all()

    def campaign(self, nid: str, max_ticks: int = 1000) -> None:
        """Tick only ``nid`` until its election timer fires (it becomes pre-candidate or candidate)."""
        core = self.nodes[nid].core
        assert core is not None
        for _ in range(max_ticks):
            if core.role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
                return
            self.tick(nodes=[nid])
        raise AssertionError(f"{nid} did not campaign within {max_ticks} ticks")

    def run(self, ticks: int) -> None:
        """Tick and deliver everything due, ``ticks`` times: the network is then reliable and instant."""
        for _ in range(ticks):
            self.tick()
            self.deliver_all()

    def run_until(self, cond: Callable[[], bool], max_ticks: int = 2000) -> int:
        """Run until ``cond()`` holds; returns the ticks it took. Raises with the transcript tail if it never does."""
        for t in range(max_ticks + 1):
            self.deliver_all()
            if cond():
                return t
            self.tick()
        raise AssertionError(
            f"condition not reached within {max_ticks} ticks (seed {self.seed})\n{self.dump(60)}"
        )

    def stabilize(self) -> None:
        self.deliver_all()

    # -- clients -------------------------------------------------------------------------------------------------

    def leader(self) -> str | None:
        """The live leader with the highest term, if any."""
        best = None
        for node in self.nodes.values():
            if (
                node.alive
                and node.core.role is Role.LEADER
                and (best is None or node.core.term > self.nodes[best].core.term)
            ):
                best = node.id
        return best

    def propose(self, nid: str, bodies: list[bytes]):
        core = self.nodes[nid].core
        assert core is not None
        p = core.propose(bodies)
        self.say(
            f"propose {len(bodies)} on {nid}: indexes {p.first_index}..{p.first_index + len(bodies) - 1}"
        )
        self.process(nid)
        return p

    def compact(self, nid: str, upto: int) -> None:
        """The runtime took a snapshot at ``upto`` (applied) and compacts the log before it."""
        node = self.nodes[nid]
        upto = min(upto, node.applied)
        if upto < node.store.first_index or node.core is None or node.held is not None:
            return  # (the runtime's snapshot waits for its single writer, the I/O thread)
        # The snapshot records the configuration at its index; the log before it goes.
        node.meta.put("snapshot_conf", node.core.configuration_at(upto).encode())
        node.store.compact_prefix(upto + 1)
        self.say(f"compact {nid} up to {upto}")

    # -- the runtime's Ready handling -------------------------------------------------------------------------------

    def process_all(self) -> None:
        for nid in self.ids:
            self.process(nid)

    def process(self, nid: str) -> None:
        node = self.nodes[nid]
        core = node.core
        if core is None or node.held is not None:
            return
        while core.has_ready():
            rd = core.ready()
            early, rest = split_early(rd, core.role)
            self._send(early)  # a leader's replication leaves before its own write, as in the node
            if node.stalled:
                node.held = (rd, rest)
                self.say(f"hold {node.id}: its write of {len(rd.frames)} bytes stalls")
                return
            self._finish(node, rd, rest)

    def _finish(self, node: SimNode, rd: Ready, rest: tuple[Message, ...]) -> None:
        core = node.core
        assert core is not None
        self._persist(node, rd)
        self._send(rest)
        self._apply(node, rd)
        node.read_states.extend(rd.read_states)
        core.advance(rd)
        self._observe(node)

    def hold(self, nid: str) -> None:
        """``nid``'s disk stalls: the next Ready it takes (now, or when it has one) is left unwritten until
        ``release``; a leader's early messages still leave."""
        node = self.nodes[nid]
        if node.core is None or node.stalled:
            return
        node.stalled = True
        self.process(nid)

    def release(self, nid: str) -> None:
        """The stalled write completes: the held Ready is persisted, sent, applied and advanced."""
        node = self.nodes[nid]
        if not node.stalled:
            return
        node.stalled = False
        if node.held is not None:
            (rd, rest), node.held = node.held, None
            self.say(f"release {nid}")
            self._finish(node, rd, rest)
        self.process(nid)

    def release_all(self) -> None:
        for nid in self.ids:
            self.release(nid)

    def _send(self, messages: tuple[Message, ...]) -> None:
        for m in messages:
            self.queue.append(Envelope(m, self.now))

    def _persist(self, node: SimNode, rd: Ready, stop_after: str | None = None) -> None:
        if rd.hard_state is not None:
            node.meta.save_hard_state(rd.hard_state)
        if stop_after == "after-hard-state":
            return
        if rd.snapshot is not None:
            s = rd.snapshot
            if s.conf is not None:
                node.meta.put("snapshot_conf", s.conf.encode())
            node.store.reset_to_snapshot(s.index, s.term, s.chain_crc, s.end_pos)
            node.applied = max(node.applied, s.index)
            node.meta.put("applied", str(node.applied).encode())
        if rd.truncate_from is not None:
            self.truncations += 1
            self._check_truncate(node, rd.truncate_from)
            node.store.truncate_suffix(rd.truncate_from)
        if stop_after == "after-truncate":
            return
        if rd.frames:
            node.store.append(rd.frames)
            if self.check_logs:
                self._check_appended(node, rd.frames)
            self._check_conf_entries(node, rd.frames)

    def _apply(self, node: SimNode, rd: Ready) -> None:
        store = node.store
        for i in range(node.applied + 1, rd.commit_index + 1):
            chain = store.entry(i).header.chain_crc
            node.applied_entries.append((i, chain))
            self._record_commit(node, i, store.term(i), chain)
        if rd.commit_index > node.applied:
            self.say(f"{node.id} applied up to {rd.commit_index}")
            node.applied = rd.commit_index
            node.meta.put("applied", str(node.applied).encode())

    # -- invariants ------------------------------------------------------------------------------------------------

    def _record_commit(self, node: SimNode, index: int, term: int, chain: int) -> None:
        known = self.committed.get(index)
        if known is None:
            self.committed[index] = (term, chain)
            self.commit_term[index] = node.core.term if node.core is not None else term
            if index > self.max_committed:
                self.max_committed = index
        elif known != (term, chain):
            raise InvariantViolation(
                f"state machine safety: {node.id} applied index {index} as (term {term}, chain {chain:#x}) but "
                f"it was committed as (term {known[0]}, chain {known[1]:#x}) (seed {self.seed})"
            )

    def _check_truncate(self, node: SimNode, frm: int) -> None:
        store = node.store
        for i in range(max(frm, store.first_index), store.last_index + 1):
            known = self.committed.get(i)
            if known is not None and (store.term(i), store.entry(i).header.chain_crc) == known:
                raise InvariantViolation(
                    f"{node.id} truncates committed entry {i} (truncate_from {frm}) (seed {self.seed})"
                )

    def _check_conf_entries(self, node: SimNode, frames: bytes) -> None:
        """Membership safety, on every durable append of a config entry: it differs from the configuration before
        it in this log by one voter at most (so their majorities overlap), and that earlier config entry was
        committed when this one was proposed (one change at a time)."""
        for off, h in codec.iter_headers(frames):
            if h.magic != codec.MAGIC_CONFIG:
                continue
            new = Configuration.decode(frames[off + codec.HEADER_SIZE : off + h.size])
            prev_index, prev = node.core.raft_log.conf_before(h.index)
            if not prev.voters:
                continue  # a joining node's empty start says nothing; the leader's own append was checked
            if not majorities_overlap(prev, new):
                raise InvariantViolation(
                    f"membership: {node.id} stores config entry {h.index} ({new.describe()}) after "
                    f"{prev.describe()}: two disjoint majorities could exist (seed {self.seed})"
                )
            if len(set(prev.voters) ^ set(new.voters)) > 1:
                raise InvariantViolation(
                    f"membership: config entry {h.index} changes more than one voter ({prev.describe()} -> "
                    f"{new.describe()}) (seed {self.seed})"
                )
            if prev_index >= node.store.first_index and prev_index not in self.committed:
                raise InvariantViolation(
                    f"membership: config entry {h.index} was proposed while config entry {prev_index} was "
                    f"uncommitted (seed {self.seed})"
                )

    def _observe(self, node: SimNode) -> None:
        core = node.core
        if core.role in (Role.PRE_CANDIDATE, Role.CANDIDATE) and not _may_lead(node.id, core):
            raise InvariantViolation(
                f"membership: {node.id} campaigns but is not a voter of {core.configuration.describe()} "
                f"(seed {self.seed})"
            )
        if core.role is Role.LEADER:
            if core.term not in self.leaders_by_term and not _may_lead(node.id, core):
                # (a leader may later lead outside its configuration: after removing itself, until that commits)
                raise InvariantViolation(
                    f"membership: non-voter {node.id} won term {core.term} (seed {self.seed})"
                )
            prev = self.leaders_by_term.setdefault(core.term, node.id)
            if prev != node.id:
                raise InvariantViolation(
                    f"election safety: {prev} and {node.id} both led term {core.term} (seed {self.seed})"
                )
        c = core.commit_index
        if c < node.last_commit:
            raise InvariantViolation(
                f"{node.id} commit index fell from {node.last_commit} to {c} (seed {self.seed})"
            )
        if c > core.last_index:
            raise InvariantViolation(f"{node.id} commit index {c} is past its last index {core.last_index}")
        node.last_commit = c

    def check_invariants(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                self._observe(node)
        if not self.check_logs:
            return
        # Leader completeness: a leader of a newer term holds every committed entry. Committed indexes form one
        # range from 0 and a leader never drops entries, so each (leader, term) is checked once per new index.
        for node in self.nodes.values():
            core = node.core
            if core is None or core.role is not Role.LEADER:
                continue
            key = (node.id, core.term)
            view = core.raft_log
            start = self._completeness_checked.get(key, -1) + 1
            for index in range(start, self.max_committed + 1):
                known = self.committed.get(index)
                if known is None or core.term <= self.commit_term[index]:
                    continue
                term, chain = known
                try:
                    t = view.term(index)
                except IndexOutOfRange:
                    if index < view.first_index:
                        continue  # compacted: covered by the snapshot
                    raise InvariantViolation(
                        f"leader completeness: leader {node.id} (term {core.term}) lacks committed entry {index} "
                        f"(seed {self.seed})"
                    ) from None
                if t != term or view.chain_at(index) not in (None, chain):
                    raise InvariantViolation(
                        f"leader completeness: leader {node.id} (term {core.term}) holds a different entry at "
                        f"committed index {index} (seed {self.seed})"
                    )
            self._completeness_checked[key] = self.max_committed

    def _check_appended(self, node: SimNode, frames: bytes) -> None:
        """Log matching, checked on every durable append: one (index, term) pair has one chain_crc on every node
        (hence one prefix), and a committed index is never written with the same term but other content."""
        for _, h in codec.iter_headers(frames):
            key = (h.index, h.term)
            chain = self._chains.setdefault(key, h.chain_crc)
            if chain != h.chain_crc:
                raise InvariantViolation(
                    f"log matching: {node.id} stores index {h.index} term {h.term} with chain {h.chain_crc:#x}, "
                    f"another node with {chain:#x} (seed {self.seed})"
                )
            known = self.committed.get(h.index)
            if known is not None and known[0] == h.term and known[1] != h.chain_crc:
                raise InvariantViolation(f"committed entry {h.index} differs on {node.id} (seed {self.seed})")


def _may_lead(nid: str, core: RaftCore) -> bool:
    """A voter of the configuration in effect, or of the one before while the change removing it is uncommitted
    (thesis §4.2.2); never a learner or a node outside the group."""
    log = core.raft_log
    if nid in log.configuration.voters:
        return True
    return log.conf_index > log.committed and nid in log.conf_before(log.conf_index)[1].voters


def _describe(m: Message) -> str:
    name = type(m).__name__
    return f"{name} {m.src}->{m.dst} term {m.term}"
