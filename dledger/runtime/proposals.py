"""Client appends from queue to commit: group-commit proposals, role watching, and the proposers' futures.

An append is validated and queued (``enqueue``); every turn of the ready loop proposes everything queued as one
batch (``propose_queued``), so whatever arrived while the previous batch was being written goes out as one
write, one fsync and one pipe write per follower. A proposed append resolves at commit with (index, pos) of
each body (``committed``); appends waiting on a node that is no longer the leader of their term fail
(``on_role``). ``ApplyWaiters`` holds the futures of ``Node.submit`` callers, resolved with the state machine's
results as the apply loop reports what it applied.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dledger.core.messages import Prepare, Role
from dledger.core.raft import RaftCore
from dledger.errors import (
    BackpressureError,
    DLedgerError,
    EntryReplacedError,
    InvalidRequestError,
    OutcomeUnknownError,
)
from dledger.metrics import NodeMetrics
from dledger.nodeconfig import NodeConfig
from dledger.runtime.futures import fail
from dledger.transport.base import AppendedRun
from statemachine.apply_loop import Applied, ApplyLoop
from storage.api import LogStore


@dataclass(slots=True)
class PendingAppend:
    """Client bodies waiting to be proposed (queued) or committed (proposed: index range known)."""

    bodies: list[bytes]
    future: asyncio.Future[AppendedRun]
    prepare: Prepare | None = None
    want_results: bool = False  # register with the apply waiters at proposal (``Node.submit``)
    first_index: int = -1
    term: int = -1
    positions: tuple[int, ...] = ()
    applied: list[asyncio.Future[Applied]] = field(default_factory=list)
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.bodies) - 1


class ApplyWaiters:
    """Futures of proposers waiting for the state machine's result of (index, term).

    Fed by the apply loop's ``on_applied`` report: each applied entry resolves its waiter with the ``Applied``
    result, the error the state machine returned for it, or ``EntryReplacedError`` when another term's entry
    committed at that index."""

    def __init__(self, apply: ApplyLoop):
        self._apply = apply
        self._waiters: dict[int, tuple[int, asyncio.Future[Applied]]] = {}

    def register(self, index: int, term: int) -> asyncio.Future[Applied]:
        """A future that resolves with the state machine's result once (index, term) is applied."""
        fut: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        if index <= self._apply.applied_index:
            fut.set_exception(OutcomeUnknownError(f"entry {index} was applied before its waiter registered"))
            return fut
        self._waiters[index] = (term, fut)
        return fut

    def applied(self, chunk: list[Applied]) -> None:
        """The apply loop applied ``chunk``: resolve the waiters of its entries."""
        waiters = self._waiters
        if not waiters:
            return
        for a in chunk:
            waiter = waiters.pop(a.index, None)
            if waiter is None:
                continue
            term, fut = waiter
            if fut.done():
                continue
            if term != a.term:
                fut.set_exception(
                    EntryReplacedError(f"entry {a.index} of term {term} was replaced by term {a.term}")
                )
            elif isinstance(a.result, Exception):
                fut.set_exception(a.result)
            else:
                fut.set_result(a)

    def fail_pending(self, reason: str, above: int = -1) -> int:
        """Leadership was lost: waiters for entries after ``above`` (the commit index) learn the outcome is
        unknown (their entry may still commit); committed ones still apply here and resolve normally."""
        n = 0
        for index in [i for i in self._waiters if i > above]:
            _, fut = self._waiters.pop(index)
            if not fut.done():
                fut.set_exception(OutcomeUnknownError(reason))
                n += 1
        return n

    def covered(self, index: int) -> None:
        """A snapshot up to ``index`` was installed: those entries are never applied here one by one."""
        for i in [i for i in self._waiters if i <= index]:
            _, fut = self._waiters.pop(i)
            if not fut.done():
                fut.set_exception(OutcomeUnknownError(f"entry {i} was covered by an installed snapshot"))


class Proposals:
    """The append queue and the proposals in flight of one node.

    ``core()`` returns the current core (rebuilt after a full disk); ``not_leader()`` builds the error that
    points a client at the leader; ``refusal()`` returns the error to refuse writes with (a full disk), if any."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        *,
        core: Callable[[], RaftCore],
        wake: asyncio.Event,
        not_leader: Callable[[], DLedgerError],
        refusal: Callable[[], DLedgerError | None],
        stats: collections.Counter[str],
        metrics: NodeMetrics,
    ):
        self.id = node_id
        self.config = config
        self._core = core
        self._wake = wake
        self._not_leader = not_leader
        self._refusal = refusal
        self.stats = stats
        self.metrics = metrics
        self.queued: list[PendingAppend] = []
        self._queued_entries = 0
        self._proposed: collections.deque[PendingAppend] = collections.deque()
        self._proposed_entries = 0
        self._leader_term = -1  # the term in which our proposals were made
        self.log: LogStore | None = None  # set by the node once storage is open
        self.waiters: ApplyWaiters | None = None  # set by the node when it hosts a state machine

    # -- queue -------------------------------------------------------------------------------------------------

    def enqueue(self, bodies: list[bytes], prepare: Prepare | None, want_results: bool) -> PendingAppend:
        if not bodies:
            raise InvalidRequestError("empty batch: an append needs at least one body")
        cfg = self.config
        limit = cfg.max_body_bytes
        for i, b in enumerate(bodies):
            if len(b) > limit:
                raise InvalidRequestError(
                    f"body {i} has {len(b)} bytes; the limit is {limit} (max_body_bytes)"
                )
        if len(bodies) > cfg.max_pending_entries:
            raise InvalidRequestError(
                f"a batch of {len(bodies)} bodies can never fit: at most {cfg.max_pending_entries} "
                "entries may wait to commit (max_pending_entries); split it"
            )
        if self._core().role is not Role.LEADER:
            raise self._not_leader()
        refused = self._refusal()
        if refused is not None:
            raise refused
        pending = self._queued_entries + self._proposed_entries
        if pending + len(bodies) > cfg.max_pending_entries:
            raise BackpressureError(
                f"{pending} entries are waiting to commit (limit {cfg.max_pending_entries}); "
                "back off and retry"
            )
        p = PendingAppend(list(bodies), asyncio.get_running_loop().create_future(), prepare, want_results)
        self.queued.append(p)
        self._queued_entries += len(bodies)
        self._wake.set()
        return p

    def propose_queued(self) -> None:
        """Group commit: everything queued becomes one proposal (one write, one fsync, one AppendEntries)."""
        queued, self.queued = self.queued, []
        self._queued_entries = 0
        core = self._core()
        if core.role is not Role.LEADER:
            for p in queued:
                fail(p.future, self._not_leader())
            return
        bodies = [b for p in queued for b in p.bodies]
        try:
            proposed = core.propose(bodies, prepare=_combined_prepare(queued))
        except DLedgerError as e:
            for p in queued:
                fail(p.future, e)
            return
        self._leader_term = proposed.term
        i = 0
        for p in queued:
            n = len(p.bodies)
            p.first_index = proposed.first_index + i
            p.term = proposed.term
            p.positions = proposed.positions[i : i + n]
            if p.want_results:
                waiters = self.waiters
                assert waiters is not None, "results are wanted only from a node that hosts a state machine"
                p.applied = [waiters.register(p.first_index + k, p.term) for k in range(n)]
            i += n
            self._proposed.append(p)
        self._proposed_entries += len(bodies)
        self.stats["proposals"] += 1
        self.stats["proposed_entries"] += len(bodies)

    # -- outcomes ----------------------------------------------------------------------------------------------

    def committed(self, commit_index: int) -> None:
        """Entries up to ``commit_index`` are committed and persisted locally: resolve the appends they hold
        with (index, pos)."""
        proposed = self._proposed
        now = time.perf_counter()
        observe = self.metrics.append_latency.observe
        while proposed and proposed[0].last_index <= commit_index:
            p = proposed.popleft()
            observe(now - p.queued_at)
            self._proposed_entries -= len(p.bodies)
            if p.future.done():
                continue
            # Log matching: if the entry at last_index still has our term, the whole batch is ours.
            log = self.log
            assert log is not None, "committed only once storage is open"
            if log.term(p.last_index) != p.term:
                fail(p.future, OutcomeUnknownError("the entries were overwritten by a newer leader"))
                continue
            p.future.set_result(AppendedRun(p.first_index, p.term, p.positions))

    def on_role(self, core: RaftCore, commit_index: int) -> None:
        """Appends waiting on a node that is no longer the leader of the term they were proposed in fail:
        proposed ones with "outcome unknown" (they may still commit), queued ones with "not leader"."""
        role = core.role
        if self._proposed and (role is not Role.LEADER or core.term != self._leader_term):
            self.fail_proposed(
                f"node {self.id} lost leadership (now {role.value} at term {core.term}, "
                f"leader {core.leader_id or 'unknown'}): the outcome of the append is unknown",
                commit_index,
            )
        if self.queued and role is not Role.LEADER:
            # Not proposed yet (e.g. they arrived while the previous write was in progress): nothing happened.
            self.fail_queued(self._not_leader())
        if role is Role.LEADER:
            self._leader_term = core.term

    def fail_queued(self, err: BaseException) -> None:
        for p in self.queued:
            fail(p.future, err)
        self.queued.clear()
        self._queued_entries = 0

    def fail_proposed(self, reason: str, commit_index: int) -> None:
        while self._proposed:
            fail(self._proposed.popleft().future, OutcomeUnknownError(reason))
        self._proposed_entries = 0
        if self.waiters is not None:
            # Committed entries still apply here; only what may never commit is reported as unknown.
            self.waiters.fail_pending(reason, above=commit_index)


def _combined_prepare(queued: list[PendingAppend]) -> Prepare | None:
    """One prepare for a group-commit batch: each body goes through the prepare of the append it came from."""
    fns = [p.prepare for p in queued for _ in p.bodies]
    if not any(fns):
        return None
    first: list[int] = []

    def prepare(index: int, pos: int, body: bytes) -> bytes:
        if not first:
            first.append(index)
        fn = fns[index - first[0]]
        return body if fn is None else fn(index, pos, body)

    return prepare
