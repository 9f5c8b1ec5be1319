"""Broker-level group commit: the entries of concurrent broker calls (sends, pops, acks, invisible-time changes,
offset commits, topic creations) go to the node as one proposal instead of one per call.

A call hands over its already validated entries and waits. When no proposal of this broker is in flight, the
pending calls are flushed on the next loop turn (so calls arriving in the same turn share it, and a lone
sequential caller waits for nothing but that turn); while one is in flight, new calls gather and are flushed
together the moment it finishes. Each call's entries stay contiguous and in arrival order, and each call gets
back exactly its own slice: where its messages were placed (``Dispatched``) and, for calls that asked for
them, the applied results. A proposal the node refuses fails every call in it with that error, as it failed
the one call before; a call cancelled before its flush is left out (nothing of it is written).

A proposal holding a call that wants applied results is a ``node.submit`` (it resolves once applied); one of
sends only is a ``node.append`` (it resolves at commit).

Under concurrent load (the proposal that just finished carried the calls of ``LINGER_CALLERS`` callers or more,
and fewer calls came while it was in flight) the waiting calls are flushed when as many calls wait as that
proposal carried, or ``linger_s`` later, whichever comes first, rather than at once, so that the calls still on
their way join them: every Raft round costs each node the same gRPC messages, persist and apply turn however
few entries it carries (about 1.9 ms of a 3-node group's CPU on a 2-vCPU machine, docs/send-budget.md), and a
loaded group spends less per message, and answers sooner, when its rounds carry more. A lone caller is never
held, nor is a producer session (its batches come one or two to a round: waiting for its next one measured
slower than proposing what came).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from broker_adapter.core import commands
from broker_adapter.core.formats import Route
from broker_adapter.core.statemachine import Dispatched
from dledger.errors import DLedgerError

if TYPE_CHECKING:
    from broker_adapter.core.allocator import QueueOffsetAllocator
    from dledger.plugins import NodeHandle

# A round that carried the calls of this many callers or more, under way when it ended, may linger.
LINGER_CALLERS: Final = 3

# Entries of one proposal at most (a single call larger than this still goes alone): well under the node's
# default max_pending_entries, so packing never turns calls that fit into one that cannot.
MAX_GROUP_ENTRIES: Final = 4096

# What a call gets back: where each body was placed and, when it asked for them, the applied outcomes (what the
# state machine's ``apply`` answered for each: a result or the error it refused the entry with).
Proposed = tuple[list["Dispatched | None"], list[Any] | None]


@dataclass(slots=True)
class _Call:
    bodies: Sequence[bytes]
    want_results: bool
    future: asyncio.Future[Proposed]
    routes: Sequence[Route | None] | None = None


class GroupCommit:
    def __init__(
        self,
        node: NodeHandle,
        allocator: QueueOffsetAllocator,
        max_inflight: int = 1,
        linger_s: float = 0.0,
    ):
        self._node = node
        self._alloc = allocator
        self._max_inflight = max_inflight
        self._linger_s = linger_s  # [broker] group_commit_linger_ms
        self._pending: list[_Call] = []
        self._inflight = 0
        self._scheduled = False
        # Lingering (see the module's docstring): the timer that ends it, and how many calls end it sooner.
        self._lingering: asyncio.TimerHandle | None = None
        self._fill = 0
        self._tasks: set[asyncio.Task[None]] = (
            set()
        )  # proposals running (held: the loop keeps only weak refs)
        self.proposals = 0  # proposals made (for tests and stats)

    async def propose(
        self, bodies: Sequence[bytes], want_results: bool, routes: Sequence[Route | None] | None = None
    ) -> Proposed:
        """Propose ``bodies`` (with the calls gathered alongside). Returns where each was placed (a message's
        ``Dispatched``, None for a command) and, with ``want_results``, each one's applied outcome. ``routes``:
        what the caller already knows of each message it encoded (``allocator.prepare_entry``)."""
        loop = asyncio.get_running_loop()
        call = _Call(bodies, want_results, loop.create_future(), routes)
        self._pending.append(call)
        if self._inflight < self._max_inflight and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        elif self._lingering is not None and len(self._pending) >= self._fill:
            self._lingering.cancel()  # the next round is as full as the last: no need to wait longer
            self._lingering = None
            loop.call_soon(self._flush)
        return await call.future

    async def submit(self, cmds: Sequence[commands.Command | bytes]) -> list[Any]:
        """Propose commands (or encoded bodies) as one call: each one's applied result, or the error the state
        machine returned for it."""
        bodies = [c if isinstance(c, bytes) else commands.encode(c) for c in cmds]
        _, results = await self.propose(bodies, True)
        assert results is not None  # asked for (want_results): one applied outcome per body
        return results

    def _flush(self) -> None:
        self._scheduled = False
        self._lingering = None
        while self._pending and self._inflight < self._max_inflight:
            batch: list[_Call] = []
            n = 0
            while self._pending:
                c = self._pending[0]
                if c.future.done():  # cancelled while waiting: never proposed
                    self._pending.pop(0)
                    continue
                if batch and n + len(c.bodies) > MAX_GROUP_ENTRIES:
                    break
                batch.append(self._pending.pop(0))
                n += len(c.bodies)
            if not batch:
                return
            self._inflight += 1
            self.proposals += 1
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Call]) -> None:
        node, alloc = self._node, self._alloc
        placed: list[Dispatched | None] = []

        # The node calls ``prepare`` once per body, in order: the count placed so far is the body's position.
        routes = [r for c in batch for r in (c.routes or (None,) * len(c.bodies))]

        def prepare(index: int, pos: int, body: bytes) -> bytes:
            out, d = alloc.prepare_entry(node.term, index, pos, body, routes[len(placed)])
            placed.append(d)
            return out

        bodies = [b for c in batch for b in c.bodies] if len(batch) > 1 else list(batch[0].bodies)
        try:
            if any(c.want_results for c in batch):
                outcomes = await node.submit(bodies, prepare)
                results: list[Any] | None = [
                    o if isinstance(o, BaseException) else o.result for o in outcomes
                ]
            else:
                await node.append(bodies, prepare)
                results = None
        except BaseException as e:
            for c in batch:
                if c.future.done():
                    continue
                if isinstance(e, asyncio.CancelledError):
                    c.future.cancel()
                else:
                    c.future.set_exception(e if isinstance(e, DLedgerError) else DLedgerError(str(e)))
            if not isinstance(e, Exception):
                raise
            return
        finally:
            self._inflight -= 1
            if self._pending and not self._scheduled:
                carried = len(batch)
                if self._linger_s and carried >= LINGER_CALLERS and len(self._pending) < carried:
                    # concurrent callers, and fewer waiting than this round carried: let more join the next one
                    self._scheduled = True
                    self._fill = carried
                    self._lingering = asyncio.get_running_loop().call_later(self._linger_s, self._flush)
                else:
                    self._flush()
        i = 0
        for c in batch:
            k = len(c.bodies)
            if not c.future.done():
                mine = results[i : i + k] if c.want_results and results is not None else None  # (submitted)
                c.future.set_result((placed[i : i + k], mine))
            i += k
