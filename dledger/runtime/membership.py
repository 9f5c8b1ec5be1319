"""Membership changes on a running node: proposing one change at a time, waiting for its config entry to
commit, and dialing the members a configuration names (docs/membership.md).

``Membership.change`` validates a change, proposes it on the leader (a leader removing itself first hands
leadership to its most caught-up voter) and waits until the config entry commits. The node tells it what
committed (``committed``) and, after each Ready, lets it look at the configuration and the role (``watch``):
a new configuration gets its new members dialed (``watch_conf_changed``), and a lost leadership fails the
changes still waiting (``role_changed``; "outcome unknown": they may commit yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dledger.core.membership import ConfChange, ConfChangeKind, Configuration
from dledger.core.messages import Role
from dledger.core.raft import RaftCore
from dledger.errors import (
    ConfigError,
    DLedgerError,
    InvalidRequestError,
    OutcomeUnknownError,
    UnavailableError,
)
from dledger.nodeconfig import NodeConfig, dial_address, parse_address, valid_id
from dledger.runtime.peers import Peers

log = logging.getLogger("dledger.runtime")


class Membership:
    """The configuration side of one node. ``core()`` is the current core (None before start); ``running()``
    says whether the node serves; ``commit_index()`` is its persisted commit index; ``transfer(target)``
    transfers leadership; ``start_sender(peer)`` starts a sender task for a newly dialed member."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        *,
        core: Callable[[], RaftCore | None],
        wake: asyncio.Event,
        peers: Peers,
        not_leader: Callable[[], DLedgerError],
        running: Callable[[], bool],
        commit_index: Callable[[], int],
        transfer: Callable[[str], Awaitable[str]],
        start_sender: Callable[[str], None],
    ):
        self.id = node_id
        self.config = config
        self._core = core
        self._wake = wake
        self._peers = peers
        self._not_leader = not_leader
        self._running = running
        self._commit_index = commit_index
        self._transfer = transfer
        self._start_sender = start_sender
        self._seen_conf: Configuration | None = None
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # (index, term, future) of changes

    async def change(
        self, kind: str, node_id: str, address: str
    ) -> tuple[int, int, tuple[str, ...], tuple[str, ...]]:
        """One membership change (docs/membership.md), on the leader; returns (index, term, voters, learners)
        once its config entry committed. Removing this leader transfers leadership first (to the most caught-up
        voter), so clients see a transfer rather than an election; the change is then proposed on the new
        leader by the caller (``NotLeaderError`` points there)."""
        try:
            change_kind = ConfChangeKind(kind)
        except ValueError:
            kinds = ", ".join(k.value for k in ConfChangeKind)
            raise InvalidRequestError(f"unknown membership change {kind!r}; one of: {kinds}") from None
        if not valid_id(node_id):
            raise InvalidRequestError(
                f"node id {node_id!r} is invalid: use 1-64 letters, digits, '_', '.', '-' (e.g. n3)"
            )
        adding = change_kind in (ConfChangeKind.ADD_LEARNER, ConfChangeKind.ADD_VOTER)
        if adding and not address:
            raise InvalidRequestError(f"{kind} {node_id} needs the new node's address (host:port)")
        if address:
            try:
                parse_address(address, f"{kind} {node_id}")
            except ConfigError as e:
                raise InvalidRequestError(str(e)) from None
        core = self._core()
        if core is None or not self._running():
            raise UnavailableError(f"node {self.id} is not running")
        if core.role is not Role.LEADER:
            raise self._not_leader()
        if change_kind is ConfChangeKind.REMOVE and node_id == self.id:
            others = [v for v in core.configuration.voters if v != self.id]
            if others:
                st = core.status()
                target = max(others, key=lambda v: st.match.get(v, -1))
                await self._transfer(target)
                raise self._not_leader()
        p = core.propose_conf_change(ConfChange(change_kind, node_id, address))
        log.info("%s: proposed %s %s at index %d", self.id, kind, node_id, p.first_index)
        self._wake.set()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((p.first_index, p.term, fut))
        self.committed(self._commit_index())
        timeout = 10 * self.config.raft.election_timeout_max_ms / 1000
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise OutcomeUnknownError(
                f"the change {kind} {node_id} (index {p.first_index}) did not commit within {timeout:.1f} s; "
                "check 'dledger member list'"
            ) from None
        core = self._core()
        assert core is not None, "a started node's core"
        conf = core.configuration_at(p.first_index)
        return p.first_index, p.term, conf.voters, conf.learners

    def committed(self, commit_index: int) -> None:
        """Resolve the changes whose config entry committed (or fail those whose entry was replaced)."""
        if not self._waiters:
            return
        core = self._core()
        log_view = core.raft_log if core is not None else None
        keep = []
        for index, term, fut in self._waiters:
            if fut.done():
                continue
            if index > commit_index:
                keep.append((index, term, fut))
            elif log_view is not None and log_view.match_term(index, term):
                fut.set_result(None)
            else:
                fut.set_exception(OutcomeUnknownError(f"the config entry at index {index} was replaced"))
        self._waiters = keep

    def watch_conf_changed(self) -> None:
        """After each Ready: dial the members of a new configuration."""
        core = self._core()
        assert core is not None, "watched once started"
        if core.configuration is not self._seen_conf:
            self.watch_conf()

    def watch_conf(self) -> None:
        """The configuration changed (a config entry appended, truncated or installed): dial new members."""
        core = self._core()
        assert core is not None, "watched once started"
        conf = core.configuration
        self._seen_conf = conf
        known = self._peers.addresses
        for member in conf.members:
            address = None
            if member not in known and member != self.id:
                # A member this node has not dialled yet: its own [dial] table first (read again now), then the
                # address the configuration carries for everyone.
                address = dial_address(self.config, member)
                if address is not None:
                    log.info("%s: dialling %s at %s ([dial])", self.id, member, address)
            if self._peers.learn(member, address or conf.address(member) or self.config.peers.get(member)):
                self._start_sender(member)
        log.info("%s: configuration %s", self.id, conf.describe())

    def role_changed(self) -> None:
        """The role or term changed: a change still waiting on a node that no longer leads may or may not
        commit."""
        core = self._core()
        if core is not None and core.role is Role.LEADER:
            return
        for index, _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(
                    OutcomeUnknownError(
                        f"leadership was lost before the config entry at index {index} committed; "
                        "check 'dledger member list'"
                    )
                )
        self._waiters = []
