"""Membership changes in the core (thesis chapter 4, single-server changes; docs/decisions/0017-membership.md):
proposing a change on the leader, using a configuration as soon as its entry is in the log, and the leader that
removed itself stepping down once that change commits.

A mixin of ``RaftCore`` (see ``raft.py``), like ``election.py`` and ``replication.py``: the methods run on the
core's own state. The configuration types and their rules (what a change may do) are ``membership.py``'s; this
module is when a configuration takes effect and what the roles do about it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dledger.core.membership import ConfChange, ConfChangeKind, Configuration
from dledger.core.messages import Proposed, Role, TimeoutNow
from dledger.core.progress import Progress
from dledger.core.quorum import quorum_size
from dledger.errors import UnavailableError
from storage import codec

if TYPE_CHECKING:
    from dledger.core.config import RaftConfig
    from dledger.core.messages import Message
    from dledger.core.raft_log import RaftLog

__all__ = ["Reconfiguration"]


class Reconfiguration:
    """The configuration in effect and changes to it; mixed into ``RaftCore``, whose ``__init__`` sets the state
    declared here (the configuration's through ``_set_conf``); calls ``_send``, ``_event``, ``_become_follower``
    and the replication handlers on the same object."""

    _id: str
    _config: RaftConfig
    _raft_log: RaftLog
    _role: Role
    _term: int
    _leader: str | None
    _lead_transferee: str | None
    _prs: dict[str, Progress]
    _conf: Configuration
    _voters: tuple[str, ...]
    _voter_set: frozenset[str]
    _peers: tuple[str, ...]  # everyone we replicate to, learners too
    _voter_peers: tuple[str, ...]  # everyone we ask for votes
    _quorum: int

    if (
        TYPE_CHECKING
    ):  # defined by RaftCore (raft.py), Replication (replication.py) and ReadIndex (read_index.py)

        def _send(self, m: Message) -> None: ...
        def _event(self, line: str) -> None: ...
        def _become_follower(self, term: int, leader: str | None) -> None: ...
        def _send_append(self, to: str, send_if_empty: bool) -> bool: ...
        def _maybe_commit(self) -> bool: ...
        def _committed_in_term(self) -> bool: ...
        def _check_proposing(self) -> None: ...

    def propose_conf_change(self, change: ConfChange) -> Proposed:
        """Append a config entry applying ``change`` to the configuration in effect (thesis §4.1: it takes effect
        now, on this leader, and on each follower as it appends it).

        Refused (``UnavailableError``, retriable) while an earlier change is uncommitted, before this leader
        committed an entry of its term (the single-server-change bug Ongaro described in 2015: an uncommitted
        change of a deposed leader could otherwise form a majority disjoint from this one), and when promoting a
        learner that has not caught up with the commit index. ``InvalidRequestError`` when the change does not
        apply (adding a member twice, removing the last voter...). Removing this leader is allowed: it leads
        until the change commits, then steps down and hands over to the most up-to-date voter."""
        self._check_proposing()
        log = self._raft_log
        if log.conf_index > min(log.committed, log.durable_index):
            # Committed counts this leader's own copy once appended; a change waits until it is on this disk
            # too, so that the one before it is committed on a quorum of durable copies (a leader whose write
            # stalls, alone in its configuration, would otherwise pile changes on an unwritten one).
            raise UnavailableError(
                f"the configuration change at index {log.conf_index} ({self._conf.describe()}) is not committed "
                "yet: one change at a time; retry once it commits"
            )
        if not self._committed_in_term():
            raise UnavailableError(
                f"leader {self._id} has not committed an entry of its term {self._term} yet; retry shortly"
            )
        new = self._conf.apply(change)
        if change.kind is ConfChangeKind.PROMOTE:
            pr = self._prs.get(change.node)
            match = pr.match_index if pr is not None else -1
            if match < log.committed:
                raise UnavailableError(
                    f"learner {change.node} has not caught up (it holds up to index {match}, the commit index is "
                    f"{log.committed}); promote it once it has"
                )
        first, positions = log.append_new([new.encode()], self._term, codec.MAGIC_CONFIG)
        self._event(f"{self._id} proposed {change} at index {first} term {self._term}")
        self._on_conf_changed()
        for p in self._peers:
            self._send_append(p, False)
        if self._role is Role.LEADER and self._id not in self._voter_set:
            self._step_down_if_removed()
        return Proposed(first, self._term, tuple(positions))

    def _set_conf(self, conf: Configuration) -> None:
        self._conf = conf
        self._voters = conf.voters
        self._voter_set = frozenset(conf.voters)
        self._peers = tuple(
            n for n in conf.members if n != self._id
        )  # everyone we replicate to, learners too
        self._voter_peers = tuple(n for n in conf.voters if n != self._id)  # everyone we ask for votes
        self._quorum = quorum_size(len(conf.voters)) if conf.voters else 1

    def _may_campaign(self) -> bool:
        """A voter campaigns; so does a voter whose removal is not committed yet (thesis §4.2.2: it may still be
        needed, e.g. when it alone holds the entry that removes it; its own vote then does not count). Learners
        and nodes outside the group never do."""
        if self._id in self._voter_set:
            return True
        log = self._raft_log
        return log.conf_index > log.committed and self._id in log.conf_before(log.conf_index)[1].voters

    def _on_conf_changed(self) -> None:
        """The log's configuration changed (appended, installed by a snapshot, or truncated away): use it now."""
        conf = self._raft_log.configuration
        self._set_conf(conf)
        self._event(f"{self._id} uses configuration {conf.describe()} (index {self._raft_log.conf_index})")
        if self._role is not Role.LEADER:
            return
        nxt = self._raft_log.last_index + 1
        for p in self._peers:
            if p not in self._prs:
                pr = Progress(nxt, self._config.max_inflight)
                pr.recent_active = True  # a newcomer gets an election timeout to answer before check-quorum
                self._prs[p] = pr
        for p in [p for p in self._prs if p not in conf.members]:
            del self._prs[p]
            if p == self._lead_transferee:
                self._event(f"{self._id} abandoned leadership transfer to removed {p}")
                self._lead_transferee = None
        if self._maybe_commit():  # fewer voters may commit more
            for p in self._peers:
                self._send_append(p, True)

    def _step_down_if_removed(self) -> None:
        """A leader outside its configuration (it removed itself) leads until that change commits (thesis
        §4.2.2), then steps down, handing over to the most up-to-date voter with TimeoutNow."""
        log = self._raft_log
        if log.committed < log.conf_index:
            return
        best, best_match = None, -1
        for p in self._voter_peers:
            pr = self._prs.get(p)
            if pr is not None and pr.match_index > best_match:
                best, best_match = p, pr.match_index
        self._event(f"{self._id} steps down at term {self._term}: it is no longer a voter")
        term = self._term
        self._become_follower(term, None)
        if best is not None and best_match == log.last_index:
            self._send(TimeoutNow(term, self._id, best))
