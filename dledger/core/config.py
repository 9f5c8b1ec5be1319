"""Raft timing and flow-control settings, validated at construction so bad values fail at start."""

from __future__ import annotations

from dataclasses import dataclass

from dledger.errors import ConfigError
from storage.codec import DEFAULT_SEGMENT_SIZE


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Times are in milliseconds; the core counts ticks of ``tick_ms`` (it never reads a clock).

    The election timeout is drawn uniformly from [election_timeout_min_ms, election_timeout_max_ms] afresh at
    every reset; the heartbeat must be well below the minimum so one lost heartbeat does not start an election.
    """

    tick_ms: int = 10
    election_timeout_min_ms: int = 150
    election_timeout_max_ms: int = 300
    heartbeat_interval_ms: int = 50
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 8  # AppendEntries in flight per follower (pipelining window)
    max_append_bytes: int = 1024 * 1024  # frames carried by one AppendEntries
    segment_size: int = DEFAULT_SEGMENT_SIZE  # must be equal on every node: pos is replicated state
    preferred_leader: str | None = None  # as DLedger's preferredLeaderIds: gets leadership back when healthy
    # A new commit index reaches followers with the next AppendEntries, or within two leader ticks, instead of
    # an empty AppendEntries to every follower at each commit (which, for one entry at a time, doubles the
    # replication messages and follower turns). Off here (the simulator's transcripts are of the eager rule);
    # the node runtime turns it on (dledger/runtime/node.py, docs/send-budget.md).
    commit_at_tick: bool = False
    # check_quorum: a leader steps down after this many election-minimum periods in a row without hearing from a
    # quorum. None: one period (the thesis' rule, as etcd; the simulator's transcripts are of it). The node runtime
    # uses two (dledger/runtime/node.py): a shared disk whose fdatasync stalls for 150 ms or more silences every
    # follower at once under ``sync``, and one period turned that pause into an election (docs/raft.md).
    check_quorum_periods: int | None = None

    def __post_init__(self) -> None:
        if self.tick_ms <= 0:
            raise ConfigError(f"tick_ms must be positive, got {self.tick_ms}")
        if not 0 < self.election_timeout_min_ms <= self.election_timeout_max_ms:
            raise ConfigError(
                "election timeout range must satisfy 0 < min <= max, got "
                f"{self.election_timeout_min_ms}..{self.election_timeout_max_ms} ms"
            )
        if self.election_timeout_min_ms < 2 * self.tick_ms:
            raise ConfigError(
                f"election_timeout_min_ms ({self.election_timeout_min_ms}) must be at least two ticks "
                f"({2 * self.tick_ms} ms)"
            )
        if not self.tick_ms <= self.heartbeat_interval_ms <= self.election_timeout_min_ms // 2:
            raise ConfigError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be between one tick "
                f"({self.tick_ms} ms) and half the minimum election timeout ({self.election_timeout_min_ms // 2} ms)"
            )
        if self.max_inflight < 1:
            raise ConfigError(f"max_inflight must be at least 1, got {self.max_inflight}")
        if self.max_append_bytes < 1024:
            raise ConfigError(f"max_append_bytes must be at least 1024, got {self.max_append_bytes}")
        if self.segment_size < 4096:
            raise ConfigError(f"segment_size must be at least 4096 bytes, got {self.segment_size}")
        n = self.check_quorum_periods
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10):
            raise ConfigError(f"check_quorum_periods must be an integer in 1..10, got {n!r}")

    @property
    def election_ticks(self) -> tuple[int, int]:
        """The election timeout range in ticks (inclusive), e.g. (15, 30) for 150-300 ms at 10 ms ticks."""
        return self.election_timeout_min_ms // self.tick_ms, self.election_timeout_max_ms // self.tick_ms

    @property
    def heartbeat_ticks(self) -> int:
        return max(1, self.heartbeat_interval_ms // self.tick_ms)
