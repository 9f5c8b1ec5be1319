"""RaftCore: the pure Raft state machine (Follower, PreCandidate, Candidate, Leader) stepped by ticks and messages.

Model: etcd-io/raft ``raft.go``. The core does no I/O, reads no clock and owns no thread: ``tick()`` advances
logical time by one ``config.tick_ms``, ``step(msg)`` handles a message, ``propose()`` appends client bodies on a
leader. What must happen as a result is collected and handed out as a ``Ready`` (see its docstring in
``messages.py`` for the order the runtime must follow: persist, then send, then apply, then ``advance``).

Roles swap two bound methods, ``_step`` and ``_tick``; only the ``_become_*`` methods assign the role, each checks
that the transition is legal and logs one line in the same shape ("n2 became leader at term 7"). ``step()``
compares terms once for every role (a newer term makes us a follower, an older one is answered or ignored), then
delegates to the role's step function.

The handlers are split by concept into mixins of ``RaftCore``, so a call costs what a method call on one
class costs: ``election.py`` (campaigns and votes), ``replication.py`` (appends, heartbeats, snapshots, commit),
``read_index.py`` (linearizable reads), ``reconfiguration.py`` (membership changes). This module keeps the state,
the inputs, the Ready cycle and the roles.

Rules from the Raft paper and thesis, and where they live:

- Election timeout drawn uniformly from ``config.election_ticks`` at every reset (§5.2): ``_reset_election_timer``.
- One vote per term, durable before it is granted (§5.1): the vote goes into ``Ready.hard_state`` and the grant
  into ``Ready.messages``, which the runtime sends only after persisting.
- A vote needs a log at least as up to date (§5.4.1): ``RaftLog.is_up_to_date``.
- Pre-vote (thesis §9.6): a node whose timer fires first asks "would you vote for me at term + 1?" without
  changing anyone's term, so a node that was partitioned away cannot force a new election when it returns
  (``election.py``).
- Check-quorum (thesis §6.2): a leader that has not heard from a quorum within an election timeout steps down;
  followers that heard from a leader within the minimum timeout ignore (pre-)votes (the leader lease), unless
  the campaign comes from a leadership transfer.
- Commit only entries of the leader's own term by counting replicas (§5.4.2): ``replication.py``; a new leader
  appends a no-op (magic 2) so earlier entries commit without waiting for a client write.
- Fast log backtracking: a rejection carries the follower's conflicting term and its first index
  (``replication.py``).
- Leadership transfer (thesis §3.10): the target is caught up, then told ``TimeoutNow``; proposals are refused
  meanwhile; the transfer is abandoned after an election timeout.
- Linearizable reads (thesis §6.4, ReadIndex): the commit index is confirmed by a heartbeat round to a quorum
  (``read_index.py``).
- Membership (thesis chapter 4, single-server changes; ``membership.py``, ``reconfiguration.py``,
  docs/decisions/0017-membership.md): a configuration takes effect once its entry is in the log
  (``_on_conf_changed``); one change at a time, and only after the leader committed an entry of its own term
  (``propose_conf_change``); learners replicate but never vote, campaign or count toward a quorum; a leader that
  removed itself leads until that change commits, then hands over (``_step_down_if_removed``). Messages are handled whoever sends them (thesis §4.1): a node that
  does not yet know a new member must still take its AppendEntries and vote requests.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from dledger.core.config import RaftConfig
from dledger.core.election import Election
from dledger.core.membership import ConfCheckpoint, Configuration
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    Prepare,
    Proposed,
    Ready,
    RequestVote,
    RequestVoteResponse,
    Role,
    SnapshotStatus,
    SoftState,
    TimeoutNow,
)
from dledger.core.progress import Progress
from dledger.core.raft_log import LogConflictError, RaftLog
from dledger.core.read_index import ReadIndex, ReadRequest
from dledger.core.reconfiguration import Reconfiguration
from dledger.core.replication import Replication
from dledger.errors import InvalidRequestError, NotLeaderError
from storage import codec
from storage.api import HardState, LogStore

__all__ = ["InvalidTransitionError", "LogConflictError", "RaftCore", "Status"]

_logger = logging.getLogger("dledger.core")

# Legal role transitions: the roles each role may be entered from (etcd-io/raft panics on the others; so do we).
_ALLOWED_FROM: dict[Role, frozenset[Role]] = {
    Role.FOLLOWER: frozenset(Role),
    Role.PRE_CANDIDATE: frozenset((Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE)),
    Role.CANDIDATE: frozenset((Role.FOLLOWER, Role.PRE_CANDIDATE, Role.CANDIDATE)),
    Role.LEADER: frozenset((Role.CANDIDATE,)),
}


class InvalidTransitionError(RuntimeError):
    """A role change Raft does not allow (e.g. follower -> leader without an election): a bug in the core."""


@dataclass(frozen=True, slots=True)
class Status:
    """A snapshot of the core's state for metadata and ``watch``; ``match`` is filled on the leader only (learners
    included); ``voters``/``learners`` are the configuration in effect, carried by the entry at ``conf_index``."""

    id: str
    role: Role
    term: int
    leader: str | None
    last_index: int
    commit_index: int
    applied: int
    match: dict[str, int]
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    conf_index: int = -1


class RaftCore(Election, Replication, ReadIndex, Reconfiguration):
    """One node's Raft state. Not thread-safe: the runtime calls it from one task (or the simulator's loop).

    The handlers of each concept live in a mixin next to this module (``election.py``, ``replication.py``,
    ``read_index.py``, ``reconfiguration.py``); this class holds the state, the public inputs, the Ready cycle, the role transitions and
    the role step and tick functions that dispatch to those handlers.
    """

    def __init__(
        self,
        node_id: str,
        voters: list[str],
        log: LogStore,
        hard_state: HardState,
        config: RaftConfig,
        rng: random.Random,
        applied: int = -1,
        *,
        log_event: Callable[[str], None] | None = None,
        conf: Configuration | None = None,
        conf_checkpoint: ConfCheckpoint | None = None,
    ):
        """``voters`` are the group's initial members; ``conf``, when given, is the configuration as of the
        store's snapshot point (a snapshot records it) and replaces them. Config entries in the log apply on top
        (those up to ``conf_checkpoint``'s index are taken from it when the log holds its entry).
        A node in neither (one joining the group) starts as a non-member: it never campaigns, and learns the
        configuration from the leader's log or snapshot."""
        if len(set(voters)) != len(voters):
            raise InvalidRequestError(f"voters contain duplicates: {voters}")
        self._id = node_id
        self._config = config
        self._rng = rng
        self._log_event = log_event if log_event is not None else _logger.info
        base = conf if conf is not None else Configuration(tuple(voters))
        self._raft_log = RaftLog(log, config.segment_size, base_conf=base, checkpoint=conf_checkpoint)
        self._set_conf(self._raft_log.configuration)
        self._leader_cache_bytes = config.max_inflight * config.max_append_bytes
        self._election_min, self._election_max = config.election_ticks
        self._heartbeat_ticks = config.heartbeat_ticks
        self._max_append_bytes = config.max_append_bytes
        self._check_periods = config.check_quorum_periods or 1
        self._quorum_missed = 0  # check_quorum periods in a row without a quorum heard (a leader's)

        self._term = hard_state.term
        self._vote = hard_state.vote
        self._persisted_hs = hard_state
        self._role = Role.FOLLOWER
        self._leader: str | None = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._commit_at_last_tick = -1  # commit_at_tick: the commit index at the leader's previous tick
        self._randomized_timeout = self._election_min
        self._votes: dict[str, bool] = {}
        self._prs: dict[str, Progress] = {}
        self._lead_transferee: str | None = None
        self._msgs: list[Message] = []
        self._read_states: list[tuple[int, int]] = []
        self._read_requests: list[ReadRequest] = []
        self._pending_reads: list[int] = []  # before the leader's first commit in its term
        self._read_seq = 0
        self._outstanding: Ready | None = None
        self._ready_commit = self._raft_log.committed
        self._ready_soft = SoftState(Role.FOLLOWER, None, self._term)
        if applied > self._raft_log.last_index:
            raise InvalidRequestError(
                f"applied index {applied} is past the last log index {self._raft_log.last_index}"
            )
        self._applied = max(applied, self._raft_log.committed)
        self._raft_log.committed = self._applied
        self._ready_commit = self._applied
        self._step = self._step_follower
        self._tick = self._tick_election
        self._reset_election_timer()

    # -- read-only properties ------------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def leader_id(self) -> str | None:
        return self._leader

    @property
    def commit_index(self) -> int:
        return self._raft_log.committed

    @property
    def last_index(self) -> int:
        return self._raft_log.last_index

    @property
    def raft_log(self) -> RaftLog:
        """The core's log view (store + not-yet-persisted tail). Read it; never mutate it."""
        return self._raft_log

    @property
    def voters(self) -> tuple[str, ...]:
        return self._voters

    @property
    def configuration(self) -> Configuration:
        """The configuration in effect (its entry may not be committed yet: thesis §4.1)."""
        return self._conf

    def configuration_at(self, index: int) -> Configuration:
        """The configuration in effect at ``index``: what a snapshot taken there must record."""
        return self._raft_log.conf_at(index)

    def status(self) -> Status:
        match: dict[str, int] = {}
        if self._role is Role.LEADER:
            match = {p: pr.match_index for p, pr in self._prs.items()}
            match[self._id] = self._raft_log.last_index
        return Status(
            id=self._id,
            role=self._role,
            term=self._term,
            leader=self._leader,
            last_index=self._raft_log.last_index,
            commit_index=self._raft_log.committed,
            applied=self._applied,
            match=match,
            voters=self._conf.voters,
            learners=self._conf.learners,
            conf_index=self._raft_log.conf_index,
        )

    def progress(self, peer: str) -> Progress | None:
        """The leader's replication progress for ``peer`` (None on a non-leader); for tests and metrics."""
        return self._prs.get(peer)

    # -- inputs ----------------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """One tick of ``config.tick_ms`` of logical time."""
        self._tick()

    def step(self, m: Message) -> None:
        """Handle one message addressed to this node (or a local ``SnapshotStatus`` report)."""
        if m.dst != self._id:
            raise InvalidRequestError(f"message for {m.dst!r} stepped into node {self._id!r}: {m!r}")
        if type(m) is SnapshotStatus:
            if self._role is Role.LEADER:
                self._on_snapshot_status(m)
            return
        self._step_message(m)
        if self._raft_log.configuration is not self._conf:
            self._on_conf_changed()  # an AppendEntries or a snapshot brought (or a truncation dropped) a config
        if self._role is Role.LEADER and self._id not in self._voter_set:
            self._step_down_if_removed()

    def _step_message(self, m: Message) -> None:
        term = m.term
        if term > self._term:
            if type(m) is RequestVote:
                in_lease = (
                    self._config.check_quorum
                    and self._leader is not None
                    and self._election_elapsed < self._election_min
                )
                if in_lease and not m.transfer:
                    self._event(
                        f"{self._id} ignored {'pre-vote' if m.pre_vote else 'vote'} from {m.src} at term "
                        f"{term}: leader {self._leader} is within its lease"
                    )
                    return
                if not m.pre_vote:
                    self._become_follower(term, None)
            elif type(m) is RequestVoteResponse and m.pre_vote and m.granted:
                pass  # the pre-candidate adopts term + 1 only once a quorum granted
            elif type(m) in (AppendEntries, Heartbeat, InstallSnapshot):
                self._become_follower(term, m.src)
            else:
                self._become_follower(term, None)
        elif term < self._term:
            t = type(m)  # `type(m) is X` where m's attributes are read: mypy narrows the Message union on it
            if t is AppendEntries or t is Heartbeat:
                # A stale leader (e.g. back from a partition): tell it our term so it steps down. With pre-vote
                # and check-quorum this is the only way it learns, since our votes never reach it.
                self._send(AppendEntriesResponse(self._term, self._id, m.src, False))
            elif type(m) is RequestVote and m.pre_vote:
                self._send(RequestVoteResponse(self._term, self._id, m.src, False, pre_vote=True))
            return
        if type(m) is RequestVote:
            self._on_request_vote(m)
        else:
            self._step(m)

    def propose(
        self, bodies: list[bytes], magic: int = codec.MAGIC_NORMAL, prepare: Prepare | None = None
    ) -> Proposed:
        """Append ``bodies`` as new entries of this leader's term; raises ``NotLeaderError`` elsewhere.

        ``prepare(index, pos, body) -> body`` (same length) may fill in what depends on the entry's place
        (see ``RaftLog.append_new``); it must be pure, like everything the core calls.

        The entries are not committed yet: they commit once a quorum holds them (watch ``Ready.commit_index``).
        """
        self._check_proposing()
        if not bodies:
            raise InvalidRequestError("propose needs at least one body")
        if magic not in codec.ENTRY_MAGICS:
            raise InvalidRequestError(f"magic {magic} is not an entry magic (1 normal, 2 no-op, 3 config)")
        if magic == codec.MAGIC_CONFIG:
            raise InvalidRequestError(
                "configuration entries change the group's members: propose them with propose_conf_change"
            )
        try:
            first, positions = self._raft_log.append_new(bodies, self._term, magic, prepare)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from e
        for p in self._peers:
            self._send_append(p, False)
        if not self._voter_peers:
            self._maybe_commit()
        return Proposed(first, self._term, tuple(positions))

    def _check_proposing(self) -> None:
        """Only a leader that is not handing over takes proposals; the error names whom to ask instead."""
        if self._role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self._leader)
        if self._lead_transferee is not None:
            raise NotLeaderError(
                leader_hint=self._lead_transferee,
                message=f"leadership is being transferred to {self._lead_transferee}; retry there",
            )

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to ``target`` once its log is caught up (TimeoutNow); abandoned after an election
        timeout. Raises ``NotLeaderError`` on a non-leader, ``InvalidRequestError`` for an unknown target."""
        if self._role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self._leader)
        if target not in self._voter_set:
            raise InvalidRequestError(
                f"cannot transfer leadership to {target!r}: not a voter of {self._voters}"
            )
        if target == self._id or target == self._lead_transferee:
            return
        self._event(f"{self._id} transferring leadership to {target} at term {self._term}")
        self._lead_transferee = target
        self._election_elapsed = 0
        pr = self._prs[target]
        if pr.match_index == self._raft_log.last_index:
            self._send(TimeoutNow(self._term, self._id, target))
        else:
            self._send_append(target, True)

    def read_index(self, context: int) -> None:
        """Ask for a linearizable read point: a later ``Ready.read_states`` holds ``(context, index)``; serve the
        read once entries up to ``index`` are applied. Raises ``NotLeaderError`` on a non-leader. Requests still
        pending when leadership is lost never complete: the runtime fails them on the role change."""
        if self._role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self._leader)
        if self._voters == (self._id,):
            self._read_states.append((context, self._raft_log.committed))
            return
        if not self._committed_in_term():
            self._pending_reads.append(context)
            return
        self._start_read(context)

    # -- Ready / advance ---------------------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        log = self._raft_log
        return bool(
            self._msgs
            or log.has_unstable
            or log.committed != self._ready_commit
            or self._read_states
            or self._term != self._persisted_hs.term
            or self._vote != self._persisted_hs.vote
            or self._soft_changed()
        )

    def ready(self) -> Ready:
        """Collect the work accumulated since the last Ready. Call ``advance(ready)`` before the next one."""
        if self._outstanding is not None:
            raise RuntimeError("ready() called again before advance() of the previous Ready")
        hs = None
        if self._term != self._persisted_hs.term or self._vote != self._persisted_hs.vote:
            hs = HardState(self._term, self._vote)
        soft = None
        if self._soft_changed():
            soft = SoftState(self._role, self._leader, self._term)
            self._ready_soft = soft
        snapshot, truncate_from, frames = self._raft_log.take_unstable()
        rd = Ready(
            hard_state=hs,
            snapshot=snapshot,
            truncate_from=truncate_from,
            frames=frames,
            messages=tuple(self._msgs),
            commit_index=self._raft_log.committed,
            soft_state=soft,
            read_states=tuple(self._read_states),
        )
        self._msgs = []
        self._read_states = []
        self._ready_commit = rd.commit_index
        self._outstanding = rd
        return rd

    @property
    def writing(self) -> bool:
        """A Ready was taken and not yet advanced: the runtime is writing it (or sending what it holds)."""
        return self._outstanding is not None

    def take_heartbeats(self) -> list[Heartbeat | HeartbeatResponse]:
        """A leader's heartbeats and a follower's answers to them produced since the last Ready, taken out of the
        next one so that they may leave now, while the outstanding Ready is still being written (docs/raft.md,
        "Heartbeats during a write").

        A node whose fdatasync stalls holds its Ready for as long as the disk does. Without this a stalled
        follower answers nothing meanwhile, and a stalled leader sends nothing: with every node on one disk,
        the leader steps down (check-quorum) for a slow disk, not a lost quorum. Neither kind claims an entry
        (a leader takes a follower's match from AppendEntriesResponse alone) or grants a vote, so they may leave
        before the write whenever the term and vote are durable; when the outstanding Ready (or the next)
        carries a new term or vote, nothing is taken. A heartbeat's commit index is capped at the commit index
        of the last Ready done (``advance``): one computed while this leader's own write is in flight must not
        reach a follower before the write is durable (``split_early``)."""
        if self._term != self._persisted_hs.term or self._vote != self._persisted_hs.vote:
            return []
        taken: list[Heartbeat | HeartbeatResponse] = []
        kept: list[Message] = []
        for m in self._msgs:
            if isinstance(m, HeartbeatResponse):
                taken.append(m)
            elif isinstance(m, Heartbeat):
                taken.append(m if m.commit <= self._applied else replace(m, commit=self._applied))
            else:
                kept.append(m)
        if taken:
            self._msgs = kept
        return taken

    def advance(self, rd: Ready) -> None:
        """The runtime finished ``rd`` (persisted, sent, applied up to ``rd.commit_index``)."""
        if rd is not self._outstanding:
            raise RuntimeError("advance() with a Ready that is not the outstanding one")
        self._outstanding = None
        if rd.hard_state is not None:
            self._persisted_hs = rd.hard_state
        self._raft_log.stable()
        if rd.commit_index > self._applied:
            self._applied = rd.commit_index

    def _soft_changed(self) -> bool:
        s = self._ready_soft
        return s.role is not self._role or s.leader != self._leader or s.term != self._term

    # -- role transitions ----------------------------------------------------------------------------------------------

    def _check_transition(self, to: Role) -> None:
        if self._role not in _ALLOWED_FROM[to]:
            raise InvalidTransitionError(
                f"{self._id}: invalid transition {self._role.value} -> {to.value} at term {self._term}"
            )

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._reset_election_timer()
        self._votes = {}
        self._lead_transferee = None
        self._prs = {}
        self._read_requests = []
        self._pending_reads = []

    def _reset_election_timer(self) -> None:
        self._randomized_timeout = self._rng.randint(self._election_min, self._election_max)

    def _become_follower(self, term: int, leader: str | None) -> None:
        self._check_transition(Role.FOLLOWER)
        old = (self._role, self._term, self._leader)
        self._reset(term)
        self._role = Role.FOLLOWER
        self._leader = leader
        self._raft_log.cache_bytes = 0
        self._step = self._step_follower
        self._tick = self._tick_election
        if old != (Role.FOLLOWER, term, leader):
            lead = f" (leader {leader})" if leader else ""
            self._event(f"{self._id} became follower at term {term}{lead}")

    def _become_pre_candidate(self) -> None:
        self._check_transition(Role.PRE_CANDIDATE)
        # Neither term nor vote changes: a pre-vote must not disturb anyone (thesis §9.6).
        self._role = Role.PRE_CANDIDATE
        self._leader = None
        self._votes = {}
        self._election_elapsed = 0
        self._reset_election_timer()
        self._step = self._step_candidate
        self._tick = self._tick_election
        self._event(f"{self._id} became pre-candidate at term {self._term}")

    def _become_candidate(self) -> None:
        self._check_transition(Role.CANDIDATE)
        self._reset(self._term + 1)
        self._vote = self._id
        self._role = Role.CANDIDATE
        self._step = self._step_candidate
        self._tick = self._tick_election
        self._event(f"{self._id} became candidate at term {self._term}")

    def _become_leader(self) -> None:
        self._check_transition(Role.LEADER)
        self._reset(self._term)
        self._role = Role.LEADER
        self._leader = self._id
        self._raft_log.cache_bytes = self._leader_cache_bytes  # followers are served from memory
        self._step = self._step_leader
        self._tick = self._tick_heartbeat
        log = self._raft_log
        nxt = log.last_index + 1
        inflight = self._config.max_inflight
        self._prs = {p: Progress(nxt, inflight) for p in self._peers}
        self._commit_at_last_tick = log.committed
        self._quorum_missed = 0
        self._event(f"{self._id} became leader at term {self._term}")
        # The no-op: commits every earlier entry once a quorum holds it (§5.4.2, §8).
        log.append_new([b""], self._term, codec.MAGIC_NOOP)
        if not self._voter_peers:
            self._maybe_commit()

    # -- ticks ---------------------------------------------------------------------------------------------------

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            if self._may_campaign():
                self._campaign(transfer=False)

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        if self._config.commit_at_tick:
            self._tell_commit()
        self._election_elapsed += 1
        if self._election_elapsed >= self._election_min:
            self._election_elapsed = 0
            active = self._take_recent_active()
            heard = len(active & self._voter_set) + (self._id in self._voter_set)
            if self._config.check_quorum and heard < self._quorum:
                self._quorum_missed += 1
                if self._quorum_missed >= self._check_periods:
                    self._event(
                        f"{self._id} stepped down at term {self._term}: no quorum heard within "
                        + (
                            "an election timeout"
                            if self._check_periods == 1
                            else f"{self._check_periods} election timeouts in a row"
                        )
                    )
                    self._become_follower(self._term, None)
                    return
            else:
                self._quorum_missed = 0
            if self._lead_transferee is not None:
                self._event(f"{self._id} abandoned leadership transfer to {self._lead_transferee}")
                self._lead_transferee = None
            self._maybe_transfer_to_preferred(active)
        if self._heartbeat_elapsed >= self._heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._bcast_heartbeat(self._read_requests[-1].seq if self._read_requests else 0)

    def _take_recent_active(self) -> set[str]:
        """Peers heard from since the last check, and start a new check period."""
        active = set()
        for p, pr in self._prs.items():
            if pr.recent_active:
                active.add(p)
            pr.recent_active = False
        return active

    def _maybe_transfer_to_preferred(self, active: set[str]) -> None:
        """DLedger's preferredLeaderIds: hand leadership to the preferred node once it is healthy (heard from
        within the last election timeout) and holds everything committed."""
        pref = self._config.preferred_leader
        if (
            pref is None
            or pref == self._id
            or pref not in active
            or pref not in self._voter_set
            or self._lead_transferee is not None
        ):
            return
        if self._prs[pref].match_index >= self._raft_log.committed:
            self._event(f"{self._id} hands leadership back to preferred leader {pref}")
            self.transfer_leadership(pref)

    # -- role step functions ---------------------------------------------------------------------------------------

    def _step_follower(self, m: Message) -> None:
        # `type(m) is X` (exact, as before, and cheap: CPython specializes type(x)) narrows the Message union
        if type(m) is AppendEntries:
            self._election_elapsed = 0
            self._leader = m.src
            self._on_append_entries(m)
        elif type(m) is Heartbeat:
            self._election_elapsed = 0
            self._leader = m.src
            self._on_heartbeat(m)
        elif type(m) is InstallSnapshot:
            self._election_elapsed = 0
            self._leader = m.src
            self._on_install_snapshot(m)
        elif type(m) is TimeoutNow:
            if not self._may_campaign():
                self._event(f"{self._id} ignored TimeoutNow from {m.src}: it is not a voter")
                return
            self._event(f"{self._id} received TimeoutNow from {m.src} at term {self._term}: campaigning")
            self._campaign(transfer=True)

    def _step_candidate(self, m: Message) -> None:
        t = type(m)
        if t is AppendEntries or t is Heartbeat or t is InstallSnapshot:
            self._become_follower(m.term, m.src)
            self._step_follower(m)
        elif type(m) is RequestVoteResponse:
            if m.pre_vote != (self._role is Role.PRE_CANDIDATE):
                return
            self._votes.setdefault(m.src, m.granted)
            self._poll()

    def _step_leader(self, m: Message) -> None:
        if type(m) is AppendEntriesResponse:
            self._on_append_response(m)
        elif type(m) is HeartbeatResponse:
            self._on_heartbeat_response(m)

    # -- sending ------------------------------------------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    # -- logging ------------------------------------------------------------------------------------------------------

    def _event(self, line: str) -> None:
        self._log_event(line)
