"""Linearizable reads (thesis §6.4, ReadIndex): a read waits for the commit index it saw to be confirmed by a
heartbeat round to a quorum, so a deposed leader cannot serve a stale read.

A mixin of ``RaftCore`` (see ``raft.py``, whose ``read_index()`` is the entry point). A request is tagged with a
sequence number that rides in the heartbeat's ``context``; an acknowledgement of sequence ``s`` confirms every
request up to ``s``. Before the leader's first commit in its term the commit index may be stale, so requests wait
in ``_pending_reads`` until ``_maybe_commit`` starts them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["ReadIndex", "ReadRequest"]

if TYPE_CHECKING:
    from dledger.core.raft_log import RaftLog


class ReadRequest:
    """One pending read: the commit index it waits on and the voters that confirmed it (the leader included while
    it is a voter; learners' answers never count)."""

    __slots__ = ("acks", "context", "index", "seq")

    def __init__(self, seq: int, context: int, index: int, acks: set[str]):
        self.seq = seq
        self.context = context
        self.index = index
        self.acks = acks


class ReadIndex:
    """ReadIndex bookkeeping; mixed into ``RaftCore``, whose ``__init__`` sets the state declared here;
    calls ``_bcast_heartbeat`` (``replication.py``) on the same object."""

    _id: str
    _quorum: int
    _voter_set: frozenset[str]
    _raft_log: RaftLog
    _term: int
    _read_seq: int
    _read_requests: list[ReadRequest]
    _read_states: list[tuple[int, int]]

    if TYPE_CHECKING:  # defined by Replication (replication.py)

        def _bcast_heartbeat(self, context: int) -> None: ...

    def _committed_in_term(self) -> bool:
        log = self._raft_log
        return log.committed >= 0 and log.match_term(log.committed, self._term)

    def _start_read(self, context: int) -> None:
        self._read_seq += 1
        acks = {self._id} if self._id in self._voter_set else set()
        self._read_requests.append(ReadRequest(self._read_seq, context, self._raft_log.committed, acks))
        self._bcast_heartbeat(self._read_seq)

    def _ack_read(self, peer: str, seq: int) -> None:
        if peer not in self._voter_set:
            return
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
