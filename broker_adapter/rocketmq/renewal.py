"""Automatic renewal of invisible time for the official PushConsumer (docs/rocketmq.md, "PushConsumer renewal").

The official clients' PushConsumer receives with ``auto_renew = true`` and no invisible duration: RocketMQ's proxy,
not the client, keeps such a message invisible while the client's listener runs (its receipt-handle manager
changes the invisible time shortly before it runs out, for as long as the client is alive, up to a limit), and
when the client acknowledges with the handle it was given, the proxy acks the newest delivery. Here the leader
does the same: ``Renewals`` remembers each auto-renewed delivery, a task changes its invisible time (a
``ChangeInvisible`` through the log, like a client's) ``LEAD_MS`` before it runs out while its client has called
within ``CLIENT_TTL_MS``, and ``epoch`` maps the handle the client holds to the renewed delivery's epoch.

Not replicated, like the proxy's table: after a failover the new leader renews nothing, so a message whose
listener is still running is delivered again when its invisible time runs out (at-least-once), and its first
handle is then refused as superseded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from broker_adapter.core.invisibility import Handled, Outcome, Popped

log = logging.getLogger(__name__)

SLICE_MS: Final = 60_000  # each renewal: the invisible time RocketMQ's proxy gives an auto-renewed receive
LEAD_MS: Final = 10_000  # renew this long before the invisible time runs out
CLIENT_TTL_MS: Final = 60_000  # a client silent this long is gone: its messages are not renewed any more
MAX_RENEW_MS: Final = 3 * 3600 * 1000  # a listener that runs longer gets the message delivered again
MAX_TRACKED: Final = 100_000
TICK_S: Final = 1.0

Key = tuple[str, str, int, int]  # (group, topic, queue_id, offset)


@dataclass(slots=True)
class Renewing:
    handed_epoch: int  # the epoch in the receipt handle the client holds
    epoch: int  # the delivery's current epoch (after renewals)
    deadline_ms: int
    since_ms: int
    client: str


class Renewals:
    """The leader's auto-renewed deliveries. ``change(group, topic, qid, offset, epoch, now_ms, invisible_ms)``
    is ``Pops.change_invisible`` with a clock; ``clock()`` the leader's ms clock."""

    def __init__(self, change: Callable[..., Any], clock: Callable[[], int]):
        self._change = change
        self._clock = clock
        self.tracked: dict[Key, Renewing] = {}
        self.seen: dict[str, int] = {}  # client id -> last call (ms)
        self.renewed = 0
        self._task: asyncio.Task | None = None

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
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rocketmq-renewals")

    def epoch(self, group: str, topic: str, queue_id: int, offset: int, epoch: int) -> int:
        """The epoch to act on for the handle a client holds: the renewed delivery's when it was renewed."""
        r = self.tracked.get((group, topic, queue_id, offset))
        return r.epoch if r is not None and r.handed_epoch == epoch else epoch

    def done(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """The client acknowledged the message or changed its invisible time itself: stop renewing it."""
        self.tracked.pop((group, topic, queue_id, offset), None)

    def clear(self, *_: object) -> None:
        """Forget everything (a role listener: only a leader renews)."""
        self.tracked.clear()

    async def renew_due(self) -> int:
        """One pass: renew what runs out within ``LEAD_MS`` and still has a live client; drop the rest that is
        due. Returns how many were renewed."""
        now = self._clock()
        count = 0
        for key, r in list(self.tracked.items()):
            if r.deadline_ms - now > LEAD_MS:
                continue
            alive = now - self.seen.get(r.client, -CLIENT_TTL_MS - 1) <= CLIENT_TTL_MS
            if not alive or now - r.since_ms >= MAX_RENEW_MS or r.deadline_ms <= now:
                self.tracked.pop(key, None)  # left to run out: the message is delivered again
                continue
            group, topic, qid, offset = key
            try:
                h = await self._change(group, topic, qid, offset, r.epoch, SLICE_MS)
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
        while self.tracked:
            await asyncio.sleep(TICK_S)
            await self.renew_due()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
