"""What RocketMQ 5 consumer groups hold of each queue: messages received and invisible until a deadline, and
acknowledgements. Replicated: every change is a log command (``commands.Pop``, ``Ack``, ``ChangeInvisible``)
applied by the broker's state machine on every node, so a failover neither loses an ack nor redelivers an
acknowledged message (only one whose invisible time ran out, which is RocketMQ's at-least-once promise).

Per (group, topic, queue), the state is bounded, like RocketMQ's pop checkpoints::

    offsets:   0 ........ low ............................ next ............ end of queue
               acked      | acked, in flight or expired |  never delivered

- ``low``: every offset below it is acknowledged (the group's committed offset follows it).
- ``next``: the first offset never delivered; a pop takes new offsets from here, in order.
- ``inflight``: offset -> (deadline, epoch, attempt) for delivered, unacknowledged offsets in [low, next); a
  PushConsumer's auto-renewed delivery also names its client and the epoch of its receipt handle (``Renewal``).
  An offset in [low, next) absent from it is acknowledged. ``next - low`` never exceeds ``WINDOW``.

Time is an input: the leader stamps ``now_ms`` into a pop or change command and the deadline is
``now_ms + invisible_ms`` on every node. A pop names the offsets it wants; applying it grants only those still
deliverable at that ``now_ms`` (new and in order, or in flight with an expired deadline), so concurrent or
retried pops can never deliver one offset twice within its invisible time. Each grant gets a new ``epoch``
(per queue): receipt handles carry it, so an ack of a delivery that was since redelivered is recognised.
Everything here is pure and deterministic: replaying the same commands gives the same state on every node.

Delivery rules that the state itself enforces (so no leader can break them, docs/rocketmq.md, Delivery):

- a group's last attempt: an expired offset already delivered ``max_attempts`` times is never granted again; the
  leader moves it to the group's dead-letter topic, and dispatching that copy (``dead``) ends it here;
- FIFO groups: at most one message of each message group in flight. A new offset whose message group has an
  unacknowledged one is taken in as *waiting* (in ``inflight`` with attempt 0 and deadline 0, never delivered),
  and only the lowest offset of a message group can be granted, once its invisible time is over. So order per
  message group holds across retries, expiries and failovers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final

from broker_adapter.core import commands

WINDOW: Final = 10_000  # offsets past ``low`` a group may have delivered and not yet acknowledged, per queue

Key = tuple[str, str, int]  # (group, topic, queue_id)


@dataclass(frozen=True, slots=True)
class Renewal:
    """An auto-renewed delivery (a PushConsumer's, ``commands.Pop.renew``): replicated, so that a new leader goes
    on renewing it (broker_adapter/rocketmq/renewal.py)."""

    client: str  # the client id that received it
    handed: int  # the epoch of the grant: the one in the receipt handle the client holds
    since_ms: int  # when it was granted (renewal stops after a bound)


@dataclass(slots=True)
class InFlight:
    deadline_ms: int
    epoch: int
    attempt: int  # delivery attempt: 1 for the first delivery; 0: waiting (FIFO), never delivered
    mgroup: str = ""  # the message group (FIFO groups only)
    renew: Renewal | None = None  # renewed by the leader while its client lives


@dataclass(slots=True)
class PopQueue:
    low: int
    next: int
    epoch: int = 0  # the last epoch handed out for this queue
    inflight: dict[int, InFlight] = field(default_factory=dict)

    def heads(self) -> dict[int, InFlight]:
        """The in-flight offsets that may be granted again once expired: every one, except in FIFO message
        groups, where only each message group's lowest offset is."""
        if not any(f.mgroup for f in self.inflight.values()):
            return self.inflight  # no FIFO entries: every one is a head
        out: dict[int, InFlight] = {}
        seen: set[str] = set()
        for o in sorted(self.inflight):
            f = self.inflight[o]
            if f.mgroup:
                if f.mgroup in seen:
                    continue
                seen.add(f.mgroup)
            out[o] = f
        return out

    def deliverable(self, now_ms: int, end: int, limit: int, max_attempts: int = 0) -> list[int]:
        """Up to ``limit`` offsets a pop at ``now_ms`` may deliver: expired in-flight ones first (oldest offset
        first; with ``max_attempts``, not those already delivered that often), then never-delivered ones below
        ``end`` and within the window."""
        out = sorted(
            o
            for o, f in self.heads().items()
            if f.deadline_ms <= now_ms and not (max_attempts and f.attempt >= max_attempts)
        )[:limit]
        hi = min(end, self.low + WINDOW)
        out.extend(range(self.next, min(hi, self.next + limit - len(out))))
        return out

    def exhausted(self, now_ms: int, max_attempts: int) -> list[tuple[int, InFlight]]:
        """Expired offsets already delivered ``max_attempts`` times: bound for the dead-letter topic. (Asked at
        every pop: the few that qualify are sorted, not everything in flight.)"""
        return sorted(
            (o, f) for o, f in self.heads().items() if f.deadline_ms <= now_ms and f.attempt >= max_attempts
        )

    def next_deadline(self) -> int | None:
        """The earliest deadline among offsets that can be granted again (when something becomes deliverable)."""
        return min((f.deadline_ms for f in self.heads().values()), default=None)

    def _advance(self) -> None:
        while self.low < self.next and self.low not in self.inflight:
            self.low += 1


@dataclass(frozen=True, slots=True)
class Delivery:
    offset: int
    epoch: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Popped:
    """The result of applying a ``Pop``: what the group received (a subset of what was asked), until when."""

    group: str
    topic: str
    queue_id: int
    deadline_ms: int
    deliveries: tuple[Delivery, ...]


class Outcome(enum.Enum):
    DONE = "done"  # acknowledged now, or the invisible time changed
    ALREADY = "already"  # was acknowledged before (a retried ack): nothing changed
    REDELIVERED = "redelivered"  # the receipt handle names an older delivery: the message was delivered again
    NOT_DELIVERED = "not-delivered"  # the group never received this offset


@dataclass(frozen=True, slots=True)
class Handled:
    """The result of applying an ``Ack`` or ``ChangeInvisible``: for a change, the new epoch and deadline."""

    group: str
    topic: str
    queue_id: int
    offset: int
    outcome: Outcome
    epoch: int = -1
    deadline_ms: int = -1


class PopStates:
    """The pop state of every (group, topic, queue) that received something through the RocketMQ face."""

    def __init__(self) -> None:
        self.queues: dict[Key, PopQueue] = {}

    def get(self, key: Key) -> PopQueue | None:
        return self.queues.get(key)

    def view(self, key: Key, start: int) -> PopQueue:
        """The queue's state, or the state a first pop would start from (not stored)."""
        q = self.queues.get(key)
        return q if q is not None else PopQueue(start, start)

    # -- commands ------------------------------------------------------------------------------------------
    def pop(
        self, cmd: commands.Pop, start: int, end: int, fifo: bool = False, max_attempts: int = 0
    ) -> Popped:
        """Apply a pop. ``start``: where a group's first pop of this queue begins (its committed offset);
        ``end``: the queue's dispatched end (no offset at or past it exists yet); ``fifo`` and
        ``max_attempts``: the group's settings (``broker_adapter.core.groups``) at this point of the log."""
        key = (cmd.group, cmd.topic, cmd.queue_id)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = PopQueue(start, start)
        deadline = cmd.now_ms + cmd.invisible_ms
        skip = set(cmd.skip)
        mgroups = dict(cmd.groups) if fifo else {}
        granted: list[Delivery] = []
        for o in sorted(set(cmd.offsets) | skip):
            f = q.inflight.get(o)
            mgroup = mgroups.get(o, "")
            if f is not None:
                if f.deadline_ms > cmd.now_ms:
                    continue  # still invisible: another pop holds it
                if max_attempts and f.attempt >= max_attempts:
                    continue  # the last attempt was made: only the dead-letter topic takes it now
                if f.mgroup and any(p < o and g.mgroup == f.mgroup for p, g in q.inflight.items()):
                    continue  # an earlier message of its message group is not acknowledged yet
                attempt = f.attempt + 1
                mgroup = f.mgroup
            elif o == q.next and o < end and o < q.low + WINDOW:
                q.next += 1
                attempt = 1
                if mgroup and o not in skip and any(g.mgroup == mgroup for g in q.inflight.values()):
                    q.inflight[o] = InFlight(0, 0, 0, mgroup)  # waits for its message group's turn
                    continue
            else:
                continue  # acknowledged, not yet stored, beyond the window or not in order
            if o in skip:
                q.inflight.pop(o, None)  # filtered out: done without delivery
                continue
            q.epoch += 1
            renew = Renewal(cmd.renew, q.epoch, cmd.now_ms) if cmd.renew else None
            q.inflight[o] = InFlight(deadline, q.epoch, attempt, mgroup, renew)
            granted.append(Delivery(o, q.epoch, attempt))
        q._advance()
        return Popped(cmd.group, cmd.topic, cmd.queue_id, deadline, tuple(granted))

    def dead(self, group: str, topic: str, queue_id: int, offset: int, epoch: int) -> bool:
        """The delivery ``epoch`` of an offset was copied to the group's dead-letter topic: it is done here.
        False (nothing changed) when that delivery is no longer the current one."""
        q = self.queues.get((group, topic, queue_id))
        if q is None or self._owner(q, offset, epoch) is not Outcome.DONE:
            return False
        del q.inflight[offset]
        q._advance()
        return True

    def ack(self, cmd: commands.Ack) -> Handled:
        key = (cmd.group, cmd.topic, cmd.queue_id)
        q = self.queues.get(key)
        outcome = self._owner(q, cmd.offset, cmd.epoch)
        if outcome is Outcome.DONE:
            assert q is not None  # DONE: the queue holds this delivery
            del q.inflight[cmd.offset]
            q._advance()
        return Handled(cmd.group, cmd.topic, cmd.queue_id, cmd.offset, outcome)

    def change_invisible(self, cmd: commands.ChangeInvisible) -> Handled:
        key = (cmd.group, cmd.topic, cmd.queue_id)
        q = self.queues.get(key)
        outcome = self._owner(q, cmd.offset, cmd.epoch)
        if outcome is not Outcome.DONE:
            return Handled(cmd.group, cmd.topic, cmd.queue_id, cmd.offset, outcome)
        assert q is not None  # DONE: the queue holds this delivery
        f = q.inflight[cmd.offset]
        q.epoch += 1
        deadline = cmd.now_ms + cmd.invisible_ms
        renew = f.renew if cmd.renew else None  # the client's own change: renewing it is the client's now
        q.inflight[cmd.offset] = InFlight(deadline, q.epoch, f.attempt, f.mgroup, renew)
        return Handled(cmd.group, cmd.topic, cmd.queue_id, cmd.offset, Outcome.DONE, q.epoch, deadline)

    @staticmethod
    def _owner(q: PopQueue | None, offset: int, epoch: int) -> Outcome:
        """Whether the delivery ``epoch`` of ``offset`` is the current one (DONE), or why not."""
        if q is None or offset >= q.next:
            return Outcome.NOT_DELIVERED
        f = q.inflight.get(offset)
        if f is None:
            return Outcome.ALREADY
        return Outcome.DONE if f.epoch == epoch and f.attempt > 0 else Outcome.REDELIVERED

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """The group's offset was set explicitly (UpdateOffset / CommitOffset): consumption restarts there and
        nothing before or after it counts as delivered."""
        q = self.queues.get((group, topic, queue_id))
        if q is not None:
            q.low = q.next = offset
            q.inflight.clear()

    # -- snapshots -----------------------------------------------------------------------------------------
    def to_json(self) -> list[Any]:
        return [
            [
                g,
                t,
                qid,
                q.low,
                q.next,
                q.epoch,
                [
                    [o, f.deadline_ms, f.epoch, f.attempt, *_optional(f)]
                    for o, f in sorted(q.inflight.items())
                ],
            ]
            for (g, t, qid), q in sorted(self.queues.items())
        ]

    @classmethod
    def from_json(cls, rows: list[Any]) -> PopStates:
        st = cls()
        for g, t, qid, low, nxt, epoch, inflight in rows:
            st.queues[(str(g), str(t), int(qid))] = PopQueue(
                int(low),
                int(nxt),
                int(epoch),
                {
                    int(r[0]): InFlight(
                        int(r[1]),
                        int(r[2]),
                        int(r[3]),
                        str(r[4]) if len(r) > 4 else "",
                        Renewal(str(r[5][0]), int(r[5][1]), int(r[5][2])) if len(r) > 5 else None,
                    )
                    for r in inflight
                },
            )
        return st


def _optional(f: InFlight) -> list[Any]:
    """A snapshot row's optional tail: the message group, then the renewal (an older reader ignores what it does
    not know; a row without them reads as before)."""
    if f.renew is not None:
        return [f.mgroup, [f.renew.client, f.renew.handed, f.renew.since_ms]]
    return [f.mgroup] if f.mgroup else []
