"""RaftCore: the pure Raft state machine (Follower, PreCandidate, Candidate, Leader) stepped by ticks and messages.

Model: etcd-io/raft ``raft.go``. The core does no I/O, reads no clock and owns no thread: ``tick()`` advances
logical time by one ``config.tick_ms``, ``step(msg)`` handles a message, ``propose()`` appends client bodies on a
leader. What must happen as a result is collected and handed out as a ``Ready`` (see its docstring in
``messages.py`` for the order the runtime must follow: persist, then send, then apply, then ``advance``).

Roles swap two bound methods, ``_step`` and ``_tick``; only the ``_become_*`` methods assign the role, each checks
that the transition is legal and logs one line in the same shape ("n2 became leader at term 7"). ``step()``
compares terms once for every role (a newer term makes us a follower, an older one is answered or ignored), then
delegates to the role's step function.

Rules from the Raft paper and thesis, and where they live:

- Election timeout drawn uniformly from ``config.election_ticks`` at every reset (§5.2): ``_reset_election_timer``.
- One vote per term, durable before it is granted (§5.1): the vote goes into ``Ready.hard_state`` and the grant
  into ``Ready.messages``, which the runtime sends only after persisting.
- A vote needs a log at least as up to date (§5.4.1): ``RaftLog.is_up_to_date``.
- Pre-vote (thesis §9.6): a node whose timer fires first asks "would you vote for me at term + 1?" without
  changing anyone's term, so a node that was partitioned away cannot force a new election when it returns.
- Check-quorum (thesis §6.2): a leader that has not heard from a quorum within an election timeout steps down;
  followers that heard from a leader within the minimum timeout ignore (pre-)votes (the leader lease), unless
  the campaign comes from a leadership transfer.
- Commit only entries of the leader's own term by counting replicas (§5.4.2): ``_maybe_commit``; a new leader
  appends a no-op (magic 2) so earlier entries commit without waiting for a client write.
- Fast log backtracking: a rejection carries the follower's conflicting term and its first index.
- Leadership transfer (thesis §3.10): the target is caught up, then told ``TimeoutNow``; proposals are refused
  meanwhile; the transfer is abandoned after an election timeout.
- Linearizable reads (thesis §6.4, ReadIndex): the commit index is confirmed by a heartbeat round to a quorum.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from dledger.core.config import RaftConfig
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
from dledger.core.progress import Progress, ProgressState
from dledger.core.quorum import VoteResult, committed_index, quorum_size, vote_result
from dledger.core.raft_log import LogConflictError, RaftLog
from dledger.errors import InvalidRequestError, NotLeaderError
from storage import codec
from storage.api import HardState, LogStore
from storage.errors import IndexOutOfRange

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
    """A snapshot of the core's state for metadata and ``watch``; ``match`` is filled on the leader only."""

    id: str
    role: Role
    term: int
    leader: str | None
    last_index: int
    commit_index: int
    applied: int
    match: dict[str, int]


class _ReadRequest:
    __slots__ = ("acks", "context", "index", "seq")

    def __init__(self, seq: int, context: int, index: int, self_id: str):
        self.seq = seq
        self.context = context
        self.index = index
        self.acks = {self_id}


class RaftCore:
    """One node's Raft state. Not thread-safe: the runtime calls it from one task (or the simulator's loop)."""

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
    ):
        if node_id not in voters:
            raise InvalidRequestError(f"node {node_id!r} is not one of the voters {voters}")
        if len(set(voters)) != len(voters):
            raise InvalidRequestError(f"voters contain duplicates: {voters}")
        self._id = node_id
        self._voters = tuple(voters)
        self._voter_set = frozenset(voters)
        self._peers = tuple(v for v in voters if v != node_id)
        self._quorum = quorum_size(len(voters))
        self._config = config
        self._rng = rng
        self._log_event = log_event if log_event is not None else _logger.info
        self._raft_log = RaftLog(log, config.segment_size)
        self._leader_cache_bytes = config.max_inflight * config.max_append_bytes
        self._election_min, self._election_max = config.election_ticks
        self._heartbeat_ticks = config.heartbeat_ticks
        self._max_append_bytes = config.max_append_bytes

        self._term = hard_state.term
        self._vote = hard_state.vote
        self._persisted_hs = hard_state
        self._role = Role.FOLLOWER
        self._leader: str | None = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = self._election_min
        self._votes: dict[str, bool] = {}
        self._prs: dict[str, Progress] = {}
        self._lead_transferee: str | None = None
        self._msgs: list[Message] = []
        self._read_states: list[tuple[int, int]] = []
        self._read_requests: list[_ReadRequest] = []
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
        if m.src not in self._voter_set:
            # Not a member (a misconfigured or removed node): it must neither win votes nor move our term.
            self._event(f"{self._id} ignored {type(m).__name__} from non-member {m.src} at term {m.term}")
            return
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
            t = type(m)
            if t is AppendEntries or t is Heartbeat:
                # A stale leader (e.g. back from a partition): tell it our term so it steps down. With pre-vote
                # and check-quorum this is the only way it learns, since our votes never reach it.
                self._send(AppendEntriesResponse(self._term, self._id, m.src, False))
            elif t is RequestVote and m.pre_vote:
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
        if self._role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self._leader)
        if self._lead_transferee is not None:
            raise NotLeaderError(
                leader_hint=self._lead_transferee,
                message=f"leadership is being transferred to {self._lead_transferee}; retry there",
            )
        if not bodies:
            raise InvalidRequestError("propose needs at least one body")
        if magic not in codec.ENTRY_MAGICS:
            raise InvalidRequestError(f"magic {magic} is not an entry magic (1 normal, 2 no-op, 3 config)")
        try:
            first, positions = self._raft_log.append_new(bodies, self._term, magic, prepare)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from e
        if not self._peers:
            self._maybe_commit()
        else:
            for p in self._peers:
                self._send_append(p, False)
        return Proposed(first, self._term, tuple(positions))

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to ``target`` once its log is caught up (TimeoutNow); abandoned after an election
        timeout. Raises ``NotLeaderError`` on a non-leader, ``InvalidRequestError`` for an unknown target."""
        if self._role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self._leader)
        if target not in self._voters:
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
        if not self._peers:
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
        self._event(f"{self._id} became leader at term {self._term}")
        # The no-op: commits every earlier entry once a quorum holds it (§5.4.2, §8).
        log.append_new([b""], self._term, codec.MAGIC_NOOP)
        if not self._peers:
            self._maybe_commit()

    # -- ticks ---------------------------------------------------------------------------------------------------

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._campaign(transfer=False)

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._election_min:
            self._election_elapsed = 0
            active = self._take_recent_active()
            if self._config.check_quorum and len(active) + 1 < self._quorum:
                self._event(
                    f"{self._id} stepped down at term {self._term}: no quorum heard within an election timeout"
                )
                self._become_follower(self._term, None)
                return
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
        if pref is None or pref == self._id or pref not in active or self._lead_transferee is not None:
            return
        if self._prs[pref].match_index >= self._raft_log.committed:
            self._event(f"{self._id} hands leadership back to preferred leader {pref}")
            self.transfer_leadership(pref)

    # -- elections ---------------------------------------------------------------------------------------------------

    def _campaign(self, transfer: bool) -> None:
        """Start a pre-vote round (the default), or a real election when pre-vote is off or on TimeoutNow."""
        if self._role is Role.LEADER:
            return
        if self._config.pre_vote and not transfer:
            self._become_pre_candidate()
            self._votes[self._id] = True
            if self._poll() is not VoteResult.PENDING:
                return
            log = self._raft_log
            term = self._term + 1  # the term we would campaign at; nobody adopts it yet
            for p in self._peers:
                self._send(RequestVote(term, self._id, p, log.last_index, log.last_term, pre_vote=True))
        else:
            self._campaign_election(transfer)

    def _campaign_election(self, transfer: bool) -> None:
        self._become_candidate()
        self._votes[self._id] = True
        if self._poll() is not VoteResult.PENDING:
            return
        log = self._raft_log
        for p in self._peers:
            self._send(RequestVote(self._term, self._id, p, log.last_index, log.last_term, transfer=transfer))

    def _poll(self) -> VoteResult:
        """Count votes and act on the outcome: a won pre-vote starts the real election, a won election makes us
        leader, a lost one a follower."""
        result = vote_result(self._votes, self._voters)
        if result is VoteResult.WON:
            if self._role is Role.PRE_CANDIDATE:
                self._campaign_election(False)
            else:
                self._become_leader()
                for p in self._peers:
                    self._send_append(p, True)
        elif result is VoteResult.LOST:
            self._become_follower(self._term, None)
        return result

    def _on_request_vote(self, m: RequestVote) -> None:
        can_vote = (
            self._vote == m.src
            or (self._vote is None and self._leader is None)
            or (m.pre_vote and m.term > self._term)
        )
        kind = "pre-vote" if m.pre_vote else "vote"
        if can_vote and self._raft_log.is_up_to_date(m.last_log_index, m.last_log_term):
            self._event(f"{self._id} granted {kind} to {m.src} at term {m.term}")
            self._send(RequestVoteResponse(m.term, self._id, m.src, True, pre_vote=m.pre_vote))
            if not m.pre_vote:
                self._election_elapsed = 0
                self._vote = m.src
        else:
            self._event(f"{self._id} rejected {kind} from {m.src} at term {m.term}")
            self._send(RequestVoteResponse(self._term, self._id, m.src, False, pre_vote=m.pre_vote))

    # -- role step functions ---------------------------------------------------------------------------------------

    def _step_follower(self, m: Message) -> None:
        t = type(m)
        if t is AppendEntries:
            self._election_elapsed = 0
            self._leader = m.src
            self._on_append_entries(m)
        elif t is Heartbeat:
            self._election_elapsed = 0
            self._leader = m.src
            self._on_heartbeat(m)
        elif t is InstallSnapshot:
            self._election_elapsed = 0
            self._leader = m.src
            self._on_install_snapshot(m)
        elif t is TimeoutNow:
            self._event(f"{self._id} received TimeoutNow from {m.src} at term {self._term}: campaigning")
            self._campaign(transfer=True)

    def _step_candidate(self, m: Message) -> None:
        t = type(m)
        if t is AppendEntries or t is Heartbeat or t is InstallSnapshot:
            self._become_follower(m.term, m.src)
            self._step_follower(m)
        elif t is RequestVoteResponse:
            if m.pre_vote != (self._role is Role.PRE_CANDIDATE):
                return
            self._votes.setdefault(m.src, m.granted)
            self._poll()

    def _step_leader(self, m: Message) -> None:
        t = type(m)
        if t is AppendEntriesResponse:
            self._on_append_response(m)
        elif t is HeartbeatResponse:
            self._on_heartbeat_response(m)

    # -- follower handlers ------------------------------------------------------------------------------------------

    def _on_append_entries(self, m: AppendEntries) -> None:
        log = self._raft_log
        committed = log.committed
        if m.prev_log_index < committed:
            # Everything up to our commit index agrees with any leader's log (leader completeness).
            self._send(AppendEntriesResponse(self._term, self._id, m.src, True, match_index=committed))
            return
        if m.prev_chain_crc is not None and log.match_term(m.prev_log_index, m.prev_log_term):
            mine = log.chain_at(m.prev_log_index)
            if mine is not None and mine != m.prev_chain_crc:
                raise LogConflictError(
                    f"{self._id}: chain_crc at index {m.prev_log_index} is {mine:#010x}, leader {m.src} has "
                    f"{m.prev_chain_crc:#010x} with the same term {m.prev_log_term}: the logs diverged "
                    "(storage corruption)"
                )
        try:
            last_new = log.maybe_append(m.prev_log_index, m.prev_log_term, m.frames)
        except codec.FrameError as e:
            self._event(f"{self._id} rejected malformed frames from {m.src}: {e}")
            self._send(
                AppendEntriesResponse(
                    self._term,
                    self._id,
                    m.src,
                    False,
                    conflict_index=m.prev_log_index + 1,
                    last_log_index=log.last_index,
                )
            )
            return
        if last_new is not None:
            log.commit_to(min(m.leader_commit, last_new))
            self._send(AppendEntriesResponse(self._term, self._id, m.src, True, match_index=last_new))
            return
        # Rejected: give the leader a hint to skip a whole term per round trip.
        last = log.last_index
        if m.prev_log_index > last:
            hint_term, hint_index = -1, last + 1
        else:
            hint_term = log.term(m.prev_log_index)
            floor = max(log.committed + 1, log.first_index)
            hint_index = log.first_index_of_term(hint_term, floor, m.prev_log_index)
        self._send(
            AppendEntriesResponse(
                self._term,
                self._id,
                m.src,
                False,
                conflict_index=hint_index,
                conflict_term=hint_term,
                last_log_index=last,
            )
        )

    def _on_heartbeat(self, m: Heartbeat) -> None:
        log = self._raft_log
        log.commit_to(min(m.commit, log.last_index))
        self._send(HeartbeatResponse(self._term, self._id, m.src, m.context, log.last_index))

    def _on_install_snapshot(self, m: InstallSnapshot) -> None:
        log = self._raft_log
        s = m.snapshot
        if s.index <= log.committed:
            self._send(AppendEntriesResponse(self._term, self._id, m.src, True, match_index=log.committed))
            return
        if log.match_term(s.index, s.term):
            # We already hold the snapshot's last entry: just learn that it is committed.
            log.commit_to(s.index)
        else:
            self._event(f"{self._id} installed snapshot at index {s.index} term {s.term} from {m.src}")
            log.restore(s)
            self._applied = max(self._applied, s.index)
        self._send(AppendEntriesResponse(self._term, self._id, m.src, True, match_index=s.index))

    # -- leader handlers --------------------------------------------------------------------------------------------

    def _on_append_response(self, m: AppendEntriesResponse) -> None:
        pr = self._prs.get(m.src)
        if pr is None:
            return
        pr.recent_active = True
        if not m.success:
            if m.conflict_index < 0:
                return  # an answer to a stale-term message carries no hint (our term was current)
            if pr.maybe_decrease_to(self._hint_next(pr, m)):
                self._send_append(m.src, True)
            return
        log = self._raft_log
        if pr.maybe_update(m.match_index) or (
            pr.match_index == m.match_index and pr.state is ProgressState.PROBE
        ):
            if pr.state is ProgressState.PROBE:
                pr.become_replicate()
            elif pr.state is ProgressState.SNAPSHOT:
                if pr.match_index >= pr.pending_snapshot:
                    pr.become_probe()
                    pr.become_replicate()
            else:
                pr.inflights.free_le(pr.match_index)
            if self._maybe_commit():
                for p in self._peers:  # tell everyone the new commit index
                    self._send_append(p, True)
            while self._send_append(m.src, False):
                pass
            if m.src == self._lead_transferee and pr.match_index == log.last_index:
                self._event(f"{self._id} sends TimeoutNow to {m.src}: its log is caught up")
                self._send(TimeoutNow(self._term, self._id, m.src))

    def _hint_next(self, pr: Progress, m: AppendEntriesResponse) -> int:
        if m.conflict_term < 0:
            return m.conflict_index
        log = self._raft_log
        j = log.last_index_with_term_at_most(m.conflict_term, pr.next_index - 1)
        try:
            if j >= log.first_index and log.term(j) == m.conflict_term:
                return j + 1
        except IndexOutOfRange:
            pass  # compacted meanwhile: fall back to the follower's own hint
        return m.conflict_index

    def _on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self._prs.get(m.src)
        if pr is None:
            return
        pr.recent_active = True
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and pr.inflights.full:
            # Appends in the window may have been lost: let one more through; if the follower lacks its prefix,
            # the rejection moves it back to probing.
            pr.inflights.free_first()
        if pr.match_index < self._raft_log.last_index:
            self._send_append(m.src, True)
        if m.context and self._read_requests:
            self._ack_read(m.src, m.context)

    def _on_snapshot_status(self, m: SnapshotStatus) -> None:
        pr = self._prs.get(m.src)
        if pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if not m.success:
            pr.pending_snapshot = -1
        pr.become_probe()
        pr.probe_sent = True  # wait for the follower's answer (or the next heartbeat) before probing
        self._event(f"{self._id} snapshot to {m.src} {'succeeded' if m.success else 'failed'}: probing")

    # -- sending ------------------------------------------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _send_append(self, to: str, send_if_empty: bool) -> bool:
        """Send ``to`` the entries it needs next, within flow control; a snapshot when they are compacted."""
        pr = self._prs[to]
        if pr.is_paused:
            return False
        log = self._raft_log
        nxt = pr.next_index
        prev = nxt - 1
        try:
            prev_term = log.term(prev)
            if nxt <= log.last_index:
                frames, last = log.frames_from(nxt, self._max_append_bytes)
            elif not send_if_empty:
                return False
            else:
                frames, last = b"", prev
        except IndexOutOfRange:  # Compacted: the follower needs a snapshot
            return self._send_snapshot(to, pr)
        msg = AppendEntries(
            self._term, self._id, to, prev, prev_term, log.committed, frames, log.chain_at(prev)
        )
        if frames:
            pr.sent_entries(last)
        self._msgs.append(msg)
        return True

    def _send_snapshot(self, to: str, pr: Progress) -> bool:
        if not pr.recent_active:
            return False
        meta = self._raft_log.snapshot_meta()
        if meta is None:
            raise LogConflictError(
                f"{self._id}: follower {to} needs index {pr.next_index}, which is compacted, and the log cannot "
                "describe its compaction point"
            )
        self._event(f"{self._id} sends snapshot at index {meta.index} to {to} (it needs {pr.next_index})")
        pr.become_snapshot(meta.index)
        self._msgs.append(InstallSnapshot(self._term, self._id, to, meta))
        return True

    def _bcast_heartbeat(self, context: int) -> None:
        commit = self._raft_log.committed
        for p, pr in self._prs.items():
            self._msgs.append(Heartbeat(self._term, self._id, p, min(pr.match_index, commit), context))

    # -- commit and reads ------------------------------------------------------------------------------------------

    def _maybe_commit(self) -> bool:
        log = self._raft_log
        if self._peers:
            match = {p: pr.match_index for p, pr in self._prs.items()}
            match[self._id] = log.last_index
            c = committed_index(match, self._voters)
        else:
            c = log.last_index
        if c > log.committed and log.term(c) == self._term:
            first_in_term = not self._committed_in_term()
            log.commit_to(c)
            if first_in_term and self._pending_reads:
                pending, self._pending_reads = self._pending_reads, []
                for ctx in pending:
                    self._start_read(ctx)
            return True
        return False

    def _committed_in_term(self) -> bool:
        log = self._raft_log
        return log.committed >= 0 and log.match_term(log.committed, self._term)

    def _start_read(self, context: int) -> None:
        self._read_seq += 1
        self._read_requests.append(_ReadRequest(self._read_seq, context, self._raft_log.committed, self._id))
        self._bcast_heartbeat(self._read_seq)

    def _ack_read(self, peer: str, seq: int) -> None:
        reqs = self._read_requests
        ready_upto = -1
        for i, r in enumerate(reqs):
            if r.seq > seq:
                break
            r.acks.add(peer)
            if len(r.acks) >= self._quorum:
                ready_upto = i
        if ready_upto >= 0:
            for r in reqs[: ready_upto + 1]:
                self._read_states.append((r.context, r.index))
            del reqs[: ready_upto + 1]

    # -- logging ------------------------------------------------------------------------------------------------------

    def _event(self, line: str) -> None:
        self._log_event(line)
