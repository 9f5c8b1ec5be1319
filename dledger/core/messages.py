"""Messages between Raft cores and the ``Ready`` contract between the core and its runtime.

Names follow the Raft paper (``prev_log_index``, ``leader_commit``, ``match_index``). Every message carries
``term``, ``src`` and ``dst`` (node ids). Entries travel as raw encoded frames (``storage.codec``): one
``bytes`` holding consecutive entries, so a follower validates and stores them without re-encoding.

This module is the contract shared by the pure core (``dledger.core.raft``), the simulator (``tests/sim``)
and the gRPC transport (``dledger.transport.convert``). Fields may be added with defaults; none is renamed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from dledger.core.membership import Configuration
from storage.api import HardState


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What a snapshot covers: entries up to ``index`` (inclusive); the log resumes at ``end_pos``; ``conf`` is the
    group's configuration as of ``index`` (None from a sender that does not know it: the receiver keeps its own)."""

    index: int
    term: int
    chain_crc: int
    end_pos: int
    conf: Configuration | None = None


@dataclass(frozen=True, slots=True)
class RequestVote:
    """A (pre-)vote request. ``pre_vote`` requests use term + 1 without changing anyone's term (thesis 9.6);
    ``transfer`` marks a campaign started by TimeoutNow, which may override a follower's leader lease."""

    term: int
    src: str
    dst: str
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class RequestVoteResponse:
    term: int
    src: str
    dst: str
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """Replication. ``frames`` holds consecutive encoded entries starting at ``prev_log_index + 1`` (may be empty
    for a probe). ``prev_chain_crc`` is the leader's chain value at ``prev_log_index`` when it knows it."""

    term: int
    src: str
    dst: str
    prev_log_index: int
    prev_log_term: int
    leader_commit: int
    frames: bytes = b""
    prev_chain_crc: int | None = None


@dataclass(frozen=True, slots=True)
class AppendEntriesResponse:
    """On success ``match_index`` is the last index the follower now holds in agreement with the leader.
    On rejection the follower gives a hint for fast backtracking: ``conflict_term`` (its term at
    ``prev_log_index``, or -1 when its log is shorter) and ``conflict_index`` (the first index it holds of that
    term, or its last index + 1), so the leader skips a whole term per round trip."""

    term: int
    src: str
    dst: str
    success: bool
    match_index: int = -1
    conflict_index: int = -1
    conflict_term: int = -1
    last_log_index: int = -1


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Leader liveness; ``commit`` is min(follower's match, leader commit) so followers never commit past what
    they are known to hold."""

    term: int
    src: str
    dst: str
    commit: int
    context: int = 0  # read-index round (linearizable reads); echoed in the response


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    term: int
    src: str
    dst: str
    context: int = 0
    last_log_index: int = -1


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the target campaigns at once (its log is known to be up to date)."""

    term: int
    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """Leader to follower: you need entries I have compacted; install ``snapshot`` first.

    The runtime moves the snapshot's files (chunked gRPC); once the follower has verified and loaded them, its
    runtime steps this same message into the follower's core, which resets its log to the snapshot and answers
    with an ``AppendEntriesResponse`` whose ``match_index`` is ``snapshot.index``."""

    term: int
    src: str
    dst: str
    snapshot: SnapshotMeta


@dataclass(frozen=True, slots=True)
class SnapshotStatus:
    """Local report from the leader's runtime: sending a snapshot to ``src`` failed (or finished)."""

    term: int
    src: str
    dst: str
    success: bool


Message = (
    RequestVote
    | RequestVoteResponse
    | AppendEntries
    | AppendEntriesResponse
    | Heartbeat
    | HeartbeatResponse
    | TimeoutNow
    | InstallSnapshot
    | SnapshotStatus
)


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state worth showing (metadata, watch); reported in ``Ready`` when it changes."""

    role: Role
    leader: str | None
    term: int


# prepare(index, pos, body) -> body of the same length: fills in what depends on an entry's place (the broker's
# PHYSICALOFFSET) when the leader assigns it; see RaftCore.propose.
Prepare = Callable[[int, int, bytes], bytes]


@dataclass(frozen=True, slots=True)
class Proposed:
    """Where proposed bodies landed: entry ``first_index + i`` is at ``positions[i]``, all in ``term``."""

    first_index: int
    term: int
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Ready:
    """Work the runtime must do, in this order:

    1. persist: save ``hard_state`` (when not None) durably; if ``snapshot`` is set the log restarts after it;
       if ``truncate_from`` is set, ``truncate_suffix(truncate_from)``; then ``append(frames)``;
    2. send ``messages`` (only after step 1 is durable: a vote or an acknowledgement must never outlive a crash
       that forgot what it promised; the one exception is ``split_early``);
    3. apply entries up to ``commit_index`` in order (they are all in storage after step 1);
    4. call ``core.advance(ready)``.
    """

    hard_state: HardState | None = None
    snapshot: SnapshotMeta | None = None
    truncate_from: int | None = None
    frames: bytes = b""
    messages: tuple[Message, ...] = ()
    commit_index: int = -1
    soft_state: SoftState | None = None
    read_states: tuple[tuple[int, int], ...] = field(default=())  # (request context, read index) pairs


def split_early(rd: Ready, role: Role) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """(early, rest): the messages of ``rd`` that may leave before its step 1 completes (Raft thesis 10.2.1),
    and those that must wait for it.

    A leader whose term and vote are already durable may send its AppendEntries and heartbeats while it writes
    the same entries itself: followers write in parallel with the leader, which takes one disk write off every
    commit. It is safe because the runtime acts on a commit index only from a later Ready (taken after this
    one's write completed), so nothing is applied or acknowledged before the leader's own copy is durable, and
    followers learn that commit index no earlier. Votes, answers to other nodes, and a Ready that truncates or
    installs a snapshot always wait for the write."""
    if (
        role is not Role.LEADER
        or not rd.frames
        or rd.hard_state is not None
        or rd.snapshot is not None
        or rd.truncate_from is not None
    ):
        return (), rd.messages
    early = tuple(m for m in rd.messages if isinstance(m, AppendEntries | Heartbeat))
    return early, tuple(m for m in rd.messages if not isinstance(m, AppendEntries | Heartbeat))
