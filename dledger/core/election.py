"""Elections: pre-vote and vote campaigns, counting votes, granting votes (Raft §5.2, §5.4.1; thesis §9.6).

A mixin of ``RaftCore`` (see ``raft.py``): the methods run on the core's own state, so a role's step function
calls them with no extra indirection. Entering a role (``_become_*``), the leader lease check and the term
comparison stay in ``raft.py``; this module decides when to campaign and who wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dledger.core.messages import RequestVote, RequestVoteResponse, Role
from dledger.core.quorum import VoteResult, vote_result

if TYPE_CHECKING:
    from dledger.core.config import RaftConfig
    from dledger.core.messages import Message
    from dledger.core.progress import Progress
    from dledger.core.raft_log import RaftLog

__all__ = ["Election"]


class Election:
    """Campaigning and voting; mixed into ``RaftCore``, whose ``__init__`` sets the state declared here;
    calls ``_send``, ``_event``, ``_become_*`` and ``_send_append`` on the same object."""

    _id: str
    _voters: tuple[str, ...]
    _voter_peers: tuple[str, ...]  # voters but us: learners are never asked for a vote
    _config: RaftConfig
    _raft_log: RaftLog
    _role: Role
    _term: int
    _vote: str | None
    _leader: str | None
    _votes: dict[str, bool]
    _election_elapsed: int
    _prs: dict[str, Progress]

    if TYPE_CHECKING:  # defined by RaftCore (raft.py) and Replication (replication.py)

        def _send(self, m: Message) -> None: ...
        def _event(self, line: str) -> None: ...
        def _become_follower(self, term: int, leader: str | None) -> None: ...
        def _become_pre_candidate(self) -> None: ...
        def _become_candidate(self) -> None: ...
        def _become_leader(self) -> None: ...
        def _send_append(self, to: str, send_if_empty: bool) -> bool: ...

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
            for p in self._voter_peers:
                self._send(RequestVote(term, self._id, p, log.last_index, log.last_term, pre_vote=True))
        else:
            self._campaign_election(transfer)

    def _campaign_election(self, transfer: bool) -> None:
        self._become_candidate()
        self._votes[self._id] = True
        if self._poll() is not VoteResult.PENDING:
            return
        log = self._raft_log
        for p in self._voter_peers:
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
                for p in self._prs:
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
