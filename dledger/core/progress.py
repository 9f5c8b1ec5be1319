"""What the leader knows about each follower's log, and how fast it may send to it (flow control).

A leader keeps one ``Progress`` per peer (etcd-io/raft ``tracker/progress.go``; DLedger keeps the same facts in
``EntryDispatcher``'s ``peerWaterMarks``). ``match_index`` is the highest index known to be replicated on the
follower; ``next_index`` is the next index to send. The state decides how sending proceeds:

                      +--------------------------------------------------------+
                      |                  append rejected (hint)                |
                      v                                                        |
    +-------------+ append accepted +-----------------+                       |
    |    PROBE    | --------------> |    REPLICATE    | ----------------------+
    | one append, | <-------------- | optimistic next,|
    |   then wait |   snapshot ok / | window of       |
    +-------------+   failed        | max_inflight    |
        |    ^                      +-----------------+
        |    |                              |
        |    +--------- SNAPSHOT <----------+  next_index below the leader's first_index
        +---------------> (wait for the runtime to ship the snapshot, then probe again)

PROBE: the leader does not know where the logs diverge. It sends one AppendEntries and pauses until the reply
(or the next heartbeat response) arrives; a rejection moves ``next_index`` back using the follower's hint.

REPLICATE: the logs agree up to ``match_index``. The leader streams entries, advancing ``next_index`` as it
sends, with at most ``max_inflight`` unacknowledged AppendEntries (``Inflights``): a slow follower cannot make
the leader buffer without bound, and one far behind is caught up window by window.

SNAPSHOT: the follower needs entries the leader has compacted. Nothing is sent until the runtime reports the
snapshot's fate (``SnapshotStatus``) or the follower acknowledges an index at or past the snapshot.
"""

from __future__ import annotations

import enum
from collections import deque


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """The last index carried by each AppendEntries sent but not yet acknowledged, oldest first, bounded."""

    __slots__ = ("_capacity", "_queue")

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"inflight capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._queue: deque[int] = deque()

    @property
    def full(self) -> bool:
        return len(self._queue) >= self._capacity

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, last_index: int) -> None:
        if self.full:
            raise OverflowError(f"inflight window of {self._capacity} is full")
        self._queue.append(last_index)

    def free_le(self, index: int) -> None:
        """Forget every message whose last index is at or below ``index`` (they are acknowledged)."""
        q = self._queue
        while q and q[0] <= index:
            q.popleft()

    def free_first(self) -> None:
        if self._queue:
            self._queue.popleft()

    def reset(self) -> None:
        self._queue.clear()


class Progress:
    """One follower's replication state, as the leader sees it. Mutable: the leader updates it on every reply."""

    __slots__ = (
        "commit_sent",
        "inflights",
        "match_index",
        "next_index",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int, match_index: int = -1):
        self.match_index = match_index
        self.next_index = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = -1
        self.recent_active = False
        self.inflights = Inflights(max_inflight)
        self.commit_sent = -1  # the commit index the last AppendEntries to this follower carried

    def __repr__(self) -> str:
        return (
            f"Progress({self.state.value} match={self.match_index} next={self.next_index} "
            f"inflight={len(self.inflights)} active={self.recent_active})"
        )

    # -- state transitions -------------------------------------------------------------------------------

    def _reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = -1
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        """Probe from just after what we know matches (or just after a snapshot that was shipped)."""
        if self.state is ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next_index = max(self.match_index + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next_index = self.match_index + 1

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next_index = self.match_index + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    # -- events --------------------------------------------------------------------------------------------

    @property
    def is_paused(self) -> bool:
        """True when the leader must not send more entries now (flow control)."""
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full
        return True

    def sent_entries(self, last_index: int) -> None:
        """An AppendEntries carrying entries up to ``last_index`` was just sent."""
        if self.state is ProgressState.REPLICATE:
            self.next_index = last_index + 1
            self.inflights.add(last_index)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True
        else:
            raise RuntimeError(f"sending entries in state {self.state.value}")

    def maybe_update(self, match_index: int) -> bool:
        """The follower holds everything up to ``match_index``; False when that is old news."""
        updated = False
        if match_index > self.match_index:
            self.match_index = match_index
            updated = True
            self.probe_sent = False
        if self.next_index < match_index + 1:
            self.next_index = match_index + 1
        return updated

    def maybe_decrease_to(self, hint_next: int) -> bool:
        """A rejection says the follower lacks agreement before ``hint_next``; False when it is stale.

        In REPLICATE the window is dropped and probing restarts just after ``match_index``. In PROBE the next
        probe moves back to the hint (never below ``match_index + 1``); a hint at or past ``next_index`` answers
        an older probe and is ignored. Stale rejections are harmless either way: at worst entries the follower
        already holds are sent again.
        """
        if self.state is ProgressState.SNAPSHOT:
            return False
        if self.state is ProgressState.REPLICATE:
            self.become_probe()
            return True
        if hint_next >= self.next_index:
            return False
        self.next_index = max(self.match_index + 1, hint_next)
        self.probe_sent = False
        return True
