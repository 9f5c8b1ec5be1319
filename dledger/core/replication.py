"""Log replication: the follower's answers to AppendEntries, Heartbeat and InstallSnapshot, the leader's handling
of the responses, what the leader sends each follower (entries within flow control, or a snapshot once they are
compacted) and the commit rule (Raft §5.3, §5.4.2).

A mixin of ``RaftCore`` (see ``raft.py``): the methods run on the core's own state, so a role's step function
calls them with no extra indirection. Rules that live here:

- Commit only entries of the leader's own term by counting replicas (§5.4.2): ``_maybe_commit``. Followers
  learn a new commit index at once (an empty AppendEntries each), or with ``RaftConfig.commit_at_tick`` from the
  next AppendEntries or within two of the leader's ticks (``_tell_commit``).
- Fast log backtracking: a rejection carries the follower's conflicting term and its first index
  (``_on_append_entries`` builds the hint, ``_hint_next`` uses it).
- A follower whose entries are compacted gets the snapshot instead (``_send_snapshot``); the runtime reports the
  outcome as a ``SnapshotStatus`` (``_on_snapshot_status``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    SnapshotStatus,
    TimeoutNow,
)
from dledger.core.progress import Progress, ProgressState
from dledger.core.quorum import committed_index
from dledger.core.raft_log import LogConflictError
from storage import codec
from storage.errors import IndexOutOfRange

if TYPE_CHECKING:
    from dledger.core.config import RaftConfig
    from dledger.core.messages import Message
    from dledger.core.raft_log import RaftLog
    from dledger.core.read_index import ReadRequest

__all__ = ["Replication"]


class Replication:
    """Replication and commit; mixed into ``RaftCore``, whose ``__init__`` sets the state declared here;
    calls ``_send``, ``_event`` and the read hooks of ``read_index.py`` on the same object."""

    _id: str
    _voters: tuple[str, ...]
    _peers: tuple[str, ...]
    _raft_log: RaftLog
    _term: int
    _applied: int
    _max_append_bytes: int
    _prs: dict[str, Progress]
    _lead_transferee: str | None
    _msgs: list[Message]
    _pending_reads: list[int]
    _read_requests: list[ReadRequest]
    _config: RaftConfig
    _commit_at_last_tick: int

    if TYPE_CHECKING:  # defined by RaftCore (raft.py) and ReadIndex (read_index.py)

        def _send(self, m: Message) -> None: ...
        def _event(self, line: str) -> None: ...
        def _committed_in_term(self) -> bool: ...
        def _start_read(self, context: int) -> None: ...
        def _ack_read(self, peer: str, seq: int) -> None: ...

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
            # Tell everyone the new commit index now; with commit_at_tick, the next AppendEntries or a tick will.
            if self._maybe_commit() and not self._config.commit_at_tick:
                for p in self._peers:
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
        pr.commit_sent = log.committed
        if frames:
            pr.sent_entries(last)
        self._msgs.append(msg)
        return True

    def _tell_commit(self) -> None:
        """``commit_at_tick``, at each leader tick: the followers whose last AppendEntries carried an older commit
        index than the leader had at its previous tick get one now. A commit index is untold for two ticks at
        most, and while AppendEntries flow none is sent for it alone (each carries the commit index of its time).
        """
        told_by = self._commit_at_last_tick
        self._commit_at_last_tick = self._raft_log.committed
        for p in self._peers:
            if self._prs[p].commit_sent < told_by:
                self._send_append(p, True)

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
