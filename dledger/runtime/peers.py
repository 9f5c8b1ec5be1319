"""Talking to the other voters: inbound messages stepped into the core and answered once persisted, and one
sender per peer for everything outbound.

Inbound (the gRPC server calls ``handle_message``/``handle_batch``/``handle_snapshot``): a message is stepped into
the core and its caller waits on a ``ReplyWaiter`` until the ready loop has persisted what the answer depends on
and hands the answer over (``dispatch``). Outbound: one sender per peer writes everything queued for that peer
(AppendEntries, heartbeats, answers) as one message on a long-lived stream without waiting for answers, so many
AppendEntries are in flight at once and a heartbeat is never queued behind more than the one write in progress.
Votes and TimeoutNow use unary calls; snapshots their own stream. Answers come back through ``step_all``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from dledger import timeline
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    RequestVote,
    RequestVoteResponse,
    SnapshotStatus,
    TimeoutNow,
)
from dledger.core.raft import RaftCore
from dledger.errors import DLedgerError, InvalidRequestError, UnavailableError
from dledger.nodeconfig import NodeConfig
from dledger.runtime.futures import fail
from dledger.runtime.snapshots import Snapshots
from dledger.transport.base import PeerTransport, PeerUnreachableError, SnapshotChunk

log = logging.getLogger("dledger.runtime")

# Which response type answers which request: the reply a peer's call waits for.
RESPONSE_TO: dict[type[Message], type[Message] | None] = {
    RequestVote: RequestVoteResponse,
    AppendEntries: AppendEntriesResponse,
    Heartbeat: HeartbeatResponse,
    TimeoutNow: None,  # never answered: the transferee campaigns instead
    InstallSnapshot: AppendEntriesResponse,
}


@dataclass(slots=True)
class ReplyWaiter:
    """An inbound call waiting for the core's answer to the message it delivered. ``future`` is an
    ``asyncio.Future`` or, for one message of a batch, a ``_Part`` of the batch's answer."""

    src: str
    kind: type[Message]
    future: asyncio.Future[list[Message]] | _Part
    replies: list[Message] = field(default_factory=list)


class _BatchAnswer:
    """The answers to a batch of several messages, in their order, as one future: complete when each part is."""

    __slots__ = ("future", "parts", "remaining")

    def __init__(self, future: asyncio.Future[list[Message]], n: int):
        self.future = future
        self.parts: list[_Part] = []
        self.remaining = n

    def part_done(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result([r for p in self.parts for r in p.replies])


class _Part:
    """One message's answer within a batch; quacks like the future a ``ReplyWaiter`` resolves."""

    __slots__ = ("_batch", "_done", "replies")

    def __init__(self, batch: _BatchAnswer):
        self._batch = batch
        self._done = False
        self.replies: list[Message] = []
        batch.parts.append(self)

    def done(self) -> bool:
        return self._done or self._batch.future.done()

    def set_result(self, replies: list[Message]) -> None:
        if not self._done:
            self._done = True
            self.replies = replies
            self._batch.part_done()

    def set_exception(self, err: BaseException) -> None:
        if not self._done:
            self._done = True
            if not self._batch.future.done():
                self._batch.future.set_exception(err)


class Peers:
    """The node's side of the peer protocol. ``core()`` is the current core (None before start);
    ``on_failure(exc)`` stops the node when the core finds broken safety. ``transport`` is set at start."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        *,
        core: Callable[[], RaftCore | None],
        wake: asyncio.Event,
        snapshots: Snapshots,
        stats: collections.Counter[str],
        on_failure: Callable[[BaseException], None],
    ):
        self.id = node_id
        self.group = config.group
        self.config = config
        self._core = core
        self._wake = wake
        self._snapshots = snapshots
        self.stats = stats
        self._on_failure = on_failure
        self.transport: PeerTransport | None = None
        self.closing = False
        self.reply_waiters: list[ReplyWaiter] = []
        self.queues: dict[str, asyncio.Queue[Message]] = {
            p: asyncio.Queue() for p in config.peers if p != node_id
        }
        # Every node we know an address for: the configured peers, then members the log adds (docs/membership.md).
        self.addresses: dict[str, str] = dict(config.peers)
        self._unreachable_logged: dict[str, float] = {}
        # Called after answers were stepped: the node hands on what they committed at once (fix 3 of
        # docs/send-budget.md: ``ReadyLoop.commit_acked``), not a ready-loop turn later.
        self.after_step: Callable[[], None] = lambda: None

    # -- stepping ----------------------------------------------------------------------------------------------

    def step_all(self, messages: list[Message]) -> None:
        """Answers from peers (and local reports) go into the core; wake the ready loop if there is work."""
        if self.closing or not messages:
            return
        timeline.mark("ack")
        for m in messages:
            self.step(m)
        self.after_step()
        if self._running_core().has_ready():
            self._wake.set()

    def step(self, m: Message) -> None:
        """Step one message. A core that raises anything but a refusal has found broken safety (e.g. a log
        conflict below the commit index): the node stops rather than diverge."""
        try:
            self._running_core().step(m)
        except DLedgerError:
            raise
        except Exception as e:
            log.critical(
                "%s: the Raft core failed on %s; stopping the node", self.id, type(m).__name__, exc_info=e
            )
            self._on_failure(e)
            raise UnavailableError(f"node {self.id} stopped: {e}") from e

    # -- inbound (PeerHandler) ---------------------------------------------------------------------------------

    def check_sender(self, msg: Message) -> None:
        """Only the group's other voters may speak Raft to this node: a stray process (a node of another
        group, a tool, a fuzzer) is refused before the core sees anything."""
        if msg.dst != self.id:
            raise InvalidRequestError(
                f"message for {msg.dst} delivered to {self.id}: check the peer addresses"
            )
        if msg.src == self.id or msg.src not in self.addresses:
            raise InvalidRequestError(
                f"{type(msg).__name__} from {msg.src!r}, which is not a member of group {self.group} "
                f"(members: {', '.join(sorted(self.addresses))}): refused"
            )

    def learn(self, peer: str, address: str | None) -> bool:
        """A configuration names ``peer`` (at ``address`` when it says): accept its messages and give it a
        queue. Returns True when a sender must be started for it. Addresses already known are kept: a node id
        is never moved to another address (replace the node instead)."""
        if peer == self.id:
            return False
        if peer not in self.addresses:
            if not address:
                log.warning("%s: member %s has no known address; it cannot be reached", self.id, peer)
                return False
            self.addresses[peer] = address
            add = getattr(self.transport, "add_peer", None)
            if add is not None:
                add(peer, address)
        if peer in self.queues:
            return False
        self.queues[peer] = asyncio.Queue()
        return True

    def _running_core(self) -> RaftCore:
        """The core, for what runs only once the node started (``_check_open`` refuses calls before)."""
        core = self._core()
        assert core is not None, "the core exists once the node started"
        return core

    def _connected(self) -> PeerTransport:
        """The transport, for the senders: the node sets it at start, before it starts them."""
        assert self.transport is not None, "the transport is set at start, before the senders run"
        return self.transport

    def _check_open(self) -> None:
        if self.closing:
            raise UnavailableError(f"node {self.id} is shutting down")
        if self._core() is None:
            raise UnavailableError(f"node {self.id} is starting")

    async def handle_message(self, msg: Message) -> list[Message]:
        if self.closing:
            raise UnavailableError(f"node {self.id} is shutting down")
        self.check_sender(msg)
        if self._core() is None:
            raise UnavailableError(f"node {self.id} is starting")
        kind = RESPONSE_TO.get(type(msg))
        self.step(msg)
        self._wake.set()
        if kind is None:
            return []  # a response delivered one way: nothing answers it
        answer: asyncio.Future[list[Message]] = asyncio.get_running_loop().create_future()
        self.reply_waiters.append(ReplyWaiter(msg.src, kind, answer))
        return await answer

    def handle_batch(self, messages: list[Message]) -> asyncio.Future[list[Message]]:
        """Step ``messages`` now (refusals raise at once) and return a future of their answers, resolved by the
        ready loop itself once they are persisted: no task and no gather per batch on the replication round
        trip (the Pipe servicer answers from the future's done callback)."""
        self._check_open()
        loop = asyncio.get_running_loop()
        for msg in messages:
            self.check_sender(msg)
        kinds: list[tuple[str, type[Message]]] = []
        for msg in messages:
            self.step(msg)
            kind = RESPONSE_TO.get(type(msg))
            if kind is not None:
                kinds.append((msg.src, kind))
        self._wake.set()
        answer: asyncio.Future[list[Message]] = loop.create_future()
        # While this node's write is in progress (a stalled fdatasync holds its Ready), the answers to heartbeats
        # leave now, not from the next Ready: a follower whose disk stalls still tells its leader it is there, so
        # a stall of every follower is not an election (``RaftCore.take_heartbeats``: an answer claims no entry
        # and leaves only with the term and vote durable; docs/decisions/0031-heartbeats-during-a-stalled-write.md).
        early: list[Heartbeat | HeartbeatResponse] = []
        core = self._running_core()
        if core.writing and any(kind is HeartbeatResponse for _, kind in kinds):
            early = core.take_heartbeats()
        if not kinds:
            answer.set_result([])
        elif len(kinds) == 1:  # the usual batch: one AppendEntries or heartbeat
            src, kind = kinds[0]
            mine = next((m for m in early if isinstance(m, HeartbeatResponse) and m.dst == src), None)
            if mine is not None:  # rides back on this call
                early.remove(mine)
                self.stats["heartbeats_during_writes"] += 1
                answer.set_result([mine])
            else:  # its waiter resolves the answer, from the Ready that persists what it depends on
                self.reply_waiters.append(ReplyWaiter(src, kind, answer))
        else:
            batch = _BatchAnswer(answer, len(kinds))
            self.reply_waiters.extend(ReplyWaiter(src, kind, _Part(batch)) for src, kind in kinds)
        self.send_heartbeats(early)  # the rest (a batch's, or earlier heartbeats') through the senders
        return answer

    def send_heartbeats(self, messages: list[Heartbeat | HeartbeatResponse]) -> None:
        """Heartbeats (and answers to heartbeats) taken out of the Ready being written go to their senders."""
        for m in messages:
            q = self.queues.get(m.dst)
            if q is not None:
                q.put_nowait(m)
        if messages:
            self.stats["heartbeats_during_writes"] += len(messages)

    async def handle_snapshot(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk]
    ) -> list[Message]:
        """Install the snapshot's data into the state machine first (verified; nothing changes if the transfer
        breaks), then step the meta into the core, which restarts the log after it."""
        self._check_open()
        await self._snapshots.install(msg, chunks.__aiter__(), self._running_core().term)
        return await self.handle_message(msg)

    # -- answers to inbound calls (from the ready loop) --------------------------------------------------------

    def take_waiters(self) -> list[ReplyWaiter]:
        """The calls waiting for answers from the Ready about to be taken."""
        waiters, self.reply_waiters = self.reply_waiters, []
        return waiters

    def dispatch(self, messages: tuple[Message, ...], waiters: list[ReplyWaiter]) -> None:
        """Answers ride back on the calls that asked; everything else goes to its peer's sender."""
        for m in messages:
            for w in waiters:
                if w.src == m.dst and isinstance(m, w.kind) and not w.replies:
                    w.replies.append(m)
                    break
            else:
                q = self.queues.get(m.dst)
                if q is None:
                    log.warning("%s: dropping %s for unknown node %s", self.id, type(m).__name__, m.dst)
                else:
                    q.put_nowait(m)
        for w in waiters:
            if not w.future.done():
                w.future.set_result(w.replies)

    def fail_waiters(self, err: BaseException) -> None:
        for w in self.reply_waiters:
            fail(w.future, err)

    # -- outbound ----------------------------------------------------------------------------------------------

    async def sender(self, peer: str) -> None:
        """Deliver messages to one peer in order. Everything queued while the previous write was in progress
        goes out as one pipe write (AppendEntries, heartbeats, answers); answers come back through
        ``step_all``. Votes and TimeoutNow use their own unary calls, snapshots their own stream."""
        queue = self.queues[peer]
        side: set[asyncio.Task[None]] = set()
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                piped: list[Message] = []
                for m in batch:
                    if isinstance(m, RequestVote | TimeoutNow):
                        t = asyncio.create_task(self._call(m))
                    elif isinstance(m, InstallSnapshot):
                        t = asyncio.create_task(self._send_snapshot(m))
                    else:
                        piped.append(m)
                        continue
                    side.add(t)
                    t.add_done_callback(side.discard)
                if piped:
                    timeline.mark("send", peer)
                    try:
                        await self._connected().deliver(peer, piped)
                    except PeerUnreachableError as e:
                        self._note_unreachable(e)
                        continue
                    self._unreachable_logged.pop(peer, None)
                    self.stats["pipe_writes"] += 1
                    self.stats["piped_messages"] += len(piped)
        finally:
            for t in side:
                t.cancel()

    async def _call(self, msg: Message) -> None:
        try:
            replies = await self._connected().call(msg)
        except PeerUnreachableError as e:
            self._note_unreachable(e)
            return
        self._unreachable_logged.pop(msg.dst, None)
        self.step_all(replies)

    async def _send_snapshot(self, msg: InstallSnapshot) -> None:
        """Stream the newest snapshot the log continues from; report the outcome to the core."""
        out = await self._snapshots.outgoing(msg)
        if out is None:
            self.step_all(
                [SnapshotStatus(term=self._running_core().term, src=msg.dst, dst=self.id, success=False)]
            )
            return
        msg, chunks = out
        try:
            replies = await self._connected().install_snapshot(msg, chunks)
        except PeerUnreachableError as e:
            self._note_unreachable(e)
            self.step_all(
                [SnapshotStatus(term=self._running_core().term, src=msg.dst, dst=self.id, success=False)]
            )
            return
        self.step_all(
            [*replies, SnapshotStatus(term=self._running_core().term, src=msg.dst, dst=self.id, success=True)]
        )

    def _note_unreachable(self, e: PeerUnreachableError) -> None:
        now = time.monotonic()
        last = self._unreachable_logged.get(e.peer)
        if last is None or now - last > 5.0:
            self._unreachable_logged[e.peer] = now
            log.warning("%s: %s", self.id, e)
