"""Automatic renewal of invisible time for the official PushConsumer (docs/rocketmq.md, "PushConsumer renewal").

The official clients' PushConsumer receives with ``auto_renew = true`` and no invisible duration: RocketMQ's proxy,
not the client, keeps such a message invisible while the client's listener runs (its receipt-handle manager
changes the invisible time shortly before it runs out, for as long as the client is alive, up to a limit), and
when the client acknowledges with the handle it was given, the proxy acks the newest delivery. Here the leader
does the same: ``Renewals`` keeps each auto-renewed delivery, a task changes its invisible time (a
``ChangeInvisible`` through the log, like a client's) a sixth of the slice before it runs out while its client has
called within ``CLIENT_TTL_MS``, and ``epoch`` maps the handle the client holds to the renewed delivery's epoch.

Unlike the proxy's table, this one survives a failover: the receive's ``Pop`` names its client
(``commands.Pop.renew``) and every node's pop state keeps it with the handle's epoch (``invisibility.Renewal``),
renewals included. A new leader, once it has applied its log (its read barrier), takes every such delivery over
(``role_changed``), counting its client alive from then on for ``CLIENT_TTL_MS``: a listener still running
through a leader kill keeps its message, and its first handle acknowledges it on the new leader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from broker_adapter.core.invisibility import Handled, Outcome, Popped, PopStates
from dledger.core.messages import Role
from dledger.errors import DLedgerError, NotLeaderError

log = logging.getLogger(__name__)

SLICE_MS: Final = 60_000  # each renewal: the invisible time RocketMQ's proxy gives an auto-renewed receive
LEAD_MS: Final = SLICE_MS // 6  # renew this long before the invisible time runs out (of a default slice)
CLIENT_TTL_MS: Final = 60_000  # a client silent this long is gone: its messages are not renewed any more
MAX_RENEW_MS: Final = 3 * 3600 * 1000  # a listener that runs longer gets the message delivered again
MAX_TRACKED: Final = 100_000
TICK_S: Final = 1.0
RETRY_READY_S: Final = 0.1  # a new leader not yet past its read barrier asks again this soon

Key = tuple[str, str, int, int]  # (group, topic, queue_id, offset)


@dataclass(slots=True)
class Renewing:
    handed_epoch: int  # the epoch in the receipt handle the client holds
    epoch: int  # the delivery's current epoch (after renewals)
    deadline_ms: int
    since_ms: int
    client: str


class Renewals:
    """The leader's auto-renewed deliveries. ``change(group, topic, qid, offset, epoch, invisible_ms, renew=True)``
    is ``Pops.change_invisible``; ``clock()`` the leader's ms clock; ``slice_ms`` the invisible time each renewal
    gives (``[broker] auto_renew_invisible_ms``). ``ready()`` (the broker's read barrier) and ``pops()`` (the
    replicated pop state) let a new leader take over what the previous one renewed."""

    def __init__(
        self,
        change: Callable[..., Awaitable[Any]],
        clock: Callable[[], int],
        slice_ms: int = SLICE_MS,
        *,
        ready: Callable[[], Awaitable[object]] | None = None,
        pops: Callable[[], PopStates] | None = None,
    ):
        self._change = change
        self._clock = clock
        self.slice_ms = slice_ms
        self.lead_ms = slice_ms // 6
        self._ready = ready
        self._pops = pops
        self.tracked: dict[Key, Renewing] = {}
        self.seen: dict[str, int] = {}  # client id -> last call (ms)
        self.renewed = 0
        self.adopted = 0  # deliveries taken over from an earlier leader
        self._task: asyncio.Task | None = None
        self._adopting: asyncio.Task | None = None

    def touch(self, client: str) -> None:
        if client:
            self.seen[client] = self._clock()

    def received(self, group: str, topic: str, popped: Popped, client: str) -> None:
        """Remember the deliveries of an ``auto_renew`` receive, and make sure the renewing task runs."""
        self.touch(client)
        if len(self.tracked) + len(popped.deliveries) > MAX_TRACKED:
            return  # beyond the bound: those messages time out as without renewal
        now = self._clock()
        for d in popped.deliveries:
            key = (group, topic, popped.queue_id, d.offset)
            self.tracked[key] = Renewing(d.epoch, d.epoch, popped.deadline_ms, now, client)
        self._ensure_running()

    def _ensure_running(self) -> None:
        if self.tracked and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rocketmq-renewals")

    def epoch(self, group: str, topic: str, queue_id: int, offset: int, epoch: int) -> int:
        """The epoch to act on for the handle a client holds: the renewed delivery's when it was renewed (from
        the replicated pop state when this leader has not taken it over yet)."""
        r = self.tracked.get((group, topic, queue_id, offset))
        if r is not None:
            return r.epoch if r.handed_epoch == epoch else epoch
        q = self._pops().get((group, topic, queue_id)) if self._pops is not None else None
        f = q.inflight.get(offset) if q is not None else None
        if f is not None and f.renew is not None and f.renew.handed == epoch:
            return f.epoch
        return epoch

    def done(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """The client acknowledged the message or changed its invisible time itself: stop renewing it."""
        self.tracked.pop((group, topic, queue_id, offset), None)

    def clear(self, *_: object) -> None:
        """Forget everything (only a leader renews)."""
        self.tracked.clear()

    def role_changed(self, role: Role, term: int) -> None:
        """A role listener: a follower renews nothing; a new leader takes over, once its log is applied, every
        auto-renewed delivery of the replicated pop state (``adopt``)."""
        self.clear()
        if self._adopting is not None:
            self._adopting.cancel()
            self._adopting = None
        if role is Role.LEADER and self._ready is not None:
            self._adopting = asyncio.get_running_loop().create_task(
                self._adopt(), name="rocketmq-renewals-adopt"
            )

    async def _adopt(self) -> None:
        """Adopt once the log is applied. Until then ``ready`` may time out (a loaded node): it is asked again,
        until it passes or the role changes (``role_changed`` cancels this)."""
        assert self._ready is not None
        while True:
            try:
                await self._ready()
            except NotLeaderError:
                return  # another node leads: it adopts
            except DLedgerError as e:
                log.info("taking over the auto-renewed deliveries waits: %s", e)
                await asyncio.sleep(RETRY_READY_S)
                continue
            self.adopt()
            return

    def adopt(self) -> int:
        """Track every auto-renewed delivery of the replicated pop state not tracked yet; their clients count
        as alive from now (a client reaches a new leader within ``CLIENT_TTL_MS`` or is gone). How many."""
        if self._pops is None:
            return 0
        now = self._clock()
        count = 0
        for (group, topic, qid), q in self._pops().queues.items():
            for offset, f in q.inflight.items():
                key = (group, topic, qid, offset)
                if f.renew is None or f.attempt == 0 or key in self.tracked:
                    continue
                self.tracked[key] = Renewing(
                    f.renew.handed, f.epoch, f.deadline_ms, f.renew.since_ms, f.renew.client
                )
                self.seen[f.renew.client] = max(self.seen.get(f.renew.client, now), now)
                count += 1
        self.adopted += count
        if count:
            log.info("took over the renewal of %d auto-renewed deliveries", count)
        self._ensure_running()
        return count

    async def renew_due(self) -> int:
        """One pass: renew what runs out within ``lead_ms`` and still has a live client; drop the rest that is
        due. Returns how many were renewed."""
        now = self._clock()
        count = 0
        for key, r in list(self.tracked.items()):
            if r.deadline_ms - now > self.lead_ms:
                continue
            alive = now - self.seen.get(r.client, -CLIENT_TTL_MS - 1) <= CLIENT_TTL_MS
            if not alive or now - r.since_ms >= MAX_RENEW_MS or r.deadline_ms <= now:
                self.tracked.pop(key, None)  # left to run out: the message is delivered again
                continue
            group, topic, qid, offset = key
            try:
                h = await self._change(group, topic, qid, offset, r.epoch, self.slice_ms, renew=True)
            except Exception as e:  # leadership lost, no quorum: the deadline decides
                log.info("renewing %s failed: %r", key, e)
                self.tracked.pop(key, None)
                continue
            if isinstance(h, Handled) and h.outcome is Outcome.DONE and self.tracked.get(key) is r:
                r.epoch, r.deadline_ms = h.epoch, h.deadline_ms
                count += 1
            else:
                self.tracked.pop(key, None)  # acked or redelivered meanwhile
        self.renewed += count
        return count

    async def _run(self) -> None:
        tick_s = min(TICK_S, self.lead_ms / 3000)  # a few looks within the lead, however short the slice
        while self.tracked:
            await asyncio.sleep(tick_s)
            await self.renew_due()

    async def close(self) -> None:
        if self._adopting is not None:
            self._adopting.cancel()
            await asyncio.gather(self._adopting, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
