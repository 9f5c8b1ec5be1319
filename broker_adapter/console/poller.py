"""What the console shows, polled from the groups with the clients every tool uses (``AsyncDLedgerClient``
metadata for the nodes, ``AsyncConsumer`` (a ``AsyncBrokerConnection``) for topics and browsing,
``BrokerAdmin`` (``broker_adapter/admin_client.py``) for the consumer groups, their committed offsets, lag and
members, ``NameServerClient`` for a cluster's groups and consumer members).

One poller serves every browser: pages read its latest view and its history, so the groups' cost does not grow
with the number of people looking (docs/console.md, "Cost"). Nodes are asked every ``node_interval_s``; topics,
the consumer groups (``ListGroups``) and each one's offsets (one ``DescribeGroup`` per consumer group, not one
read per queue) every ``interval_s``. ``BrokerAdmin`` is a blocking client: its calls run in a worker thread.

A leader change is seen as the highest-term node answering ``role == "leader"`` changing (node or term); its
failover time is from the last poll that saw the old leader to the first that saw the new one, so it is known
to within one ``node_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from broker_adapter.admin_client import BrokerAdmin
from broker_adapter.client import AsyncConsumer, TopicInfo
from broker_adapter.core import topics as topic_names
from broker_adapter.core.model import GroupQueue
from dledger.client import AsyncDLedgerClient, NodeInfo
from dledger.errors import DLedgerError, NotFoundError
from dledger.security.config import ClientSecurity

T = TypeVar("T")
HISTORY = 600  # samples kept per series (10 min at the default 1 s)
MAX_DESCRIBES = 64  # DescribeGroup calls per group per round, at most (the rest wait for the next rounds)
NODE_FIELDS = (
    "term",
    "last_index",
    "commit_index",
    "applied_index",
    "commit_lag",
    "apply_lag",
    "match_index",
    "pid",
    "flush",
)
POLL_THREADS = 4  # blocking admin calls of the polls at once
BROWSE_GROUP = "%console%"  # the group of the browsing consumer: a Pull names no group and commits nothing


def error_text(e: BaseException) -> str:
    """An error as the console's pages show it: its class and its message."""
    return f"{type(e).__name__}: {e}"


@dataclass(frozen=True, slots=True)
class GroupTarget:
    """A broker group the console watches: its nodes, how to reach them, and its directory when local."""

    name: str
    addresses: tuple[str, ...]
    security: ClientSecurity | None = None
    directory: Path | None = None
    node_ids: tuple[str, ...] = ()  # known from a local group's manifest: a node down from the start is named


@dataclass(slots=True)
class LeaderEvent:
    at: float  # epoch seconds: the first poll that saw the new leader
    group: str
    old: str | None
    new: str
    term: int
    leaderless_s: float | None  # None: the first leader the console saw (no failover measured)


@dataclass(slots=True)
class GroupView:
    target: GroupTarget
    nodes: list[dict[str, Any]] = field(default_factory=list)
    leader: str | None = None
    term: int = 0
    leader_seen_at: float | None = None  # last poll that saw ``leader`` lead
    leaderless_since: float | None = None
    topics: list[TopicInfo] = field(default_factory=list)
    topics_error: str = ""
    # consumer group -> its queues here (committed offset, end, in flight), as DescribeGroup last told
    offsets: dict[str, list[GroupQueue]] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)  # consumer group -> RocketMQ 5 clients
    groups_error: str = ""
    polled_at: float = 0.0


class Poller:
    def __init__(
        self,
        targets: Sequence[GroupTarget],
        *,
        consumer_groups: Sequence[str] = (),
        interval_s: float = 1.0,
        node_interval_s: float = 0.5,
        discover: Callable[[], tuple[list[GroupTarget], dict[str, list[str]]]] | None = None,
    ):
        """``discover``: for a cluster, called every round for its groups and consumer members (name servers)."""
        self.views: dict[str, GroupView] = {t.name: GroupView(t) for t in targets}
        self.watched: set[str] = set(consumer_groups)
        self.members: dict[str, list[str]] = {}
        self.interval_s = interval_s
        self.node_interval_s = node_interval_s
        self._discover = discover
        self.events: deque[LeaderEvent] = deque(maxlen=200)
        self.rates: deque[tuple[float, dict[str, int]]] = deque(maxlen=HISTORY)  # "group/topic" -> messages
        self.lags: deque[tuple[float, dict[str, int]]] = deque(maxlen=HISTORY)  # consumer group -> total lag
        self._clients: dict[str, tuple[AsyncDLedgerClient, AsyncConsumer]] = {}
        self._admins: dict[tuple[str, bool], BrokerAdmin] = {}
        # The polls' blocking admin calls run here, not in the loop's default executor: a slow round under load
        # holds these threads only, never those of what an operator asked (``AdminPages.pool``, admin_pages.py).
        self._pool = ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="console-poll")
        self._describe_cursor = 0
        self.moved_at: dict[str, float] = {}  # consumer group -> when its committed offsets last moved
        self._tasks: list[asyncio.Task[None]] = []
        self.rounds = 0
        self.errors = 0  # rounds that failed

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(self.poll_nodes, lambda: self.node_interval_s))]
        self._tasks.append(asyncio.create_task(self._loop(self.poll_data, lambda: self.interval_s)))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for dl, c in self._clients.values():
            await dl.close()
            await c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for a in self._admins.values():
            a.close()

    async def _loop(self, fn: Callable[[], Any], period: Callable[[], float]) -> None:
        me = asyncio.current_task()
        while True:
            t0 = time.monotonic()
            try:
                await fn()
            except asyncio.CancelledError:
                if me is not None and me.cancelling():
                    raise  # stop() cancels this loop; a call cancelled under it is a failed round
                self.errors += 1
            except Exception:  # a round that failed is retried at the next; the page shows the age
                self.errors += 1
            await asyncio.sleep(max(0.05, period() - (time.monotonic() - t0)))

    def clients(self, group: str) -> tuple[AsyncDLedgerClient, AsyncConsumer]:
        """The group's metadata client and its browsing consumer (pulls commit nothing)."""
        c = self._clients.get(group)
        if c is None:
            t = self.views[group].target
            dl = AsyncDLedgerClient(list(t.addresses), timeout_s=0.5, rpc_timeout_s=0.5, security=t.security)
            browse = AsyncConsumer(
                list(t.addresses), BROWSE_GROUP, timeout_s=3.0, retry_for_s=3.0, security=t.security
            )
            c = self._clients[group] = (dl, browse)
        return c

    def admin(self, group: str, patient: bool = False) -> BrokerAdmin:
        """The group's administration client (blocking, thread-safe: call it in a worker thread),
        signed with the console's own credentials: the poll's gives up within a round's time or so (the next
        round asks again); the ``patient`` one, for what an operator asked (a change, a search), waits as long
        as the CLI's does."""
        a = self._admins.get((group, patient))
        if a is None:
            t = self.views[group].target
            waits = (
                {"timeout_s": 10.0, "retry_for_s": 20.0}
                if patient
                else {"timeout_s": 3.0, "retry_for_s": 3.0}
            )
            a = self._admins[(group, patient)] = BrokerAdmin(list(t.addresses), security=t.security, **waits)
        return a

    # -- nodes and leaders -----------------------------------------------------------------------------------
    async def poll_nodes(self) -> None:
        if self._discover is not None:
            await self._rediscover()
        await asyncio.gather(*(self._poll_group_nodes(v) for v in list(self.views.values())))

    async def _rediscover(self) -> None:
        assert self._discover is not None
        targets, members = await asyncio.to_thread(self._discover)
        self.members = members
        self.watched.update(members)
        for t in targets:
            v = self.views.get(t.name)
            if v is None or v.target.addresses != t.addresses:
                self.views[t.name] = GroupView(t) if v is None else v
                if v is not None:
                    v.target = t
                    old = self._clients.pop(t.name, None)
                    if old is not None:
                        await old[0].close()
                        await old[1].close()
                    for patient in (False, True):
                        old_admin = self._admins.pop((t.name, patient), None)
                        if old_admin is not None:
                            old_admin.close()

    async def _poll_group_nodes(self, v: GroupView) -> None:
        dl, _ = self.clients(v.target.name)

        async def one(address: str) -> NodeInfo | None:
            try:
                return await dl.metadata(address)
            except DLedgerError:
                return None

        # A node that does not answer within the round is down for this round: a dead node's retries do not
        # hold the others' news back.
        tasks = [asyncio.ensure_future(one(a)) for a in v.target.addresses]
        await asyncio.wait(tasks, timeout=max(0.2, self.node_interval_s * 0.8))
        infos = []
        for t in tasks:
            if t.done():
                infos.append(t.result())
            else:
                t.cancel()
                infos.append(None)
        now = time.time()
        leaders = [i for i in infos if i is not None and i.role == "leader"]
        lead = max(leaders, key=lambda i: i.term) if leaders else None
        rows = []
        for address, info in zip(v.target.addresses, infos, strict=True):
            if info is None:
                rows.append({"address": address, "id": "?", "role": "down", **dict.fromkeys(NODE_FIELDS)})
                continue
            match = {p.id: p.match_index for p in lead.peers} if lead is not None else {}
            rows.append(
                {
                    "address": address,
                    "id": info.node_id,
                    "role": info.role,
                    "term": info.term,
                    "last_index": info.last_index,
                    "commit_index": info.commit_index,
                    "applied_index": info.applied_index,
                    "commit_lag": None if lead is None else max(0, lead.commit_index - info.commit_index),
                    "apply_lag": max(0, info.commit_index - info.applied_index),
                    "match_index": match.get(info.node_id),
                    "pid": info.pid,
                    "flush": info.flush,
                }
            )
        # A node that is down keeps the id it had when it answered.
        known: dict[str, str] = dict(zip(v.target.addresses, v.target.node_ids, strict=False))
        known.update({str(r["address"]): str(r["id"]) for r in v.nodes if r["id"] != "?"})
        for r in rows:
            if r["id"] == "?":
                r["id"] = known.get(str(r["address"]), "?")
        v.nodes = rows
        v.polled_at = now
        if lead is None:
            if v.leaderless_since is None:
                v.leaderless_since = now
            return
        if lead.node_id != v.leader or lead.term != v.term:
            gap = None if v.leader_seen_at is None else now - v.leader_seen_at
            self.events.append(LeaderEvent(now, v.target.name, v.leader, lead.node_id, lead.term, gap))
            v.leader, v.term = lead.node_id, lead.term
        v.leader_seen_at = now
        v.leaderless_since = None

    # -- topics, offsets, lag --------------------------------------------------------------------------------
    async def poll_data(self) -> None:
        views = list(self.views.values())
        await asyncio.gather(*(self._poll_topics(v) for v in views))
        for v in views:
            for t in v.topics:
                for prefix in (topic_names.RETRY_PREFIX, topic_names.DLQ_PREFIX):
                    if t.topic.startswith(prefix):
                        self.watched.add(t.topic[len(prefix) :])
        await self._poll_offsets(views)
        now = time.time()
        self.rates.append(
            (now, {f"{v.target.name}/{t.topic}": sum(t.max_offsets) for v in views for t in v.topics})
        )
        self.lags.append((now, self.total_lags()))
        self.rounds += 1

    async def _poll_topics(self, v: GroupView) -> None:
        _, browse = self.clients(v.target.name)
        try:
            v.topics = sorted(await browse.list_topics(), key=lambda t: t.topic)
            v.topics_error = ""
        except DLedgerError as e:
            v.topics_error = error_text(e)

    async def _poll_offsets(self, views: list[GroupView]) -> None:
        """Each group's consumer groups (``ListGroups``, added to ``watched``) and, for each watched one, its
        queues and members (``DescribeGroup``)."""
        listed = await asyncio.gather(
            *(self._in_pool(self._list_groups, v, self.admin(v.target.name)) for v in views)
        )
        for names in listed:
            self.watched.update(names or ())
        pairs = [(v, cg) for cg in sorted(self.watched) for v in views]
        if len(pairs) > MAX_DESCRIBES * len(views):  # a window that moves round by round
            start = self._describe_cursor % len(pairs)
            pairs = (pairs + pairs)[start : start + MAX_DESCRIBES * len(views)]
            self._describe_cursor = start + MAX_DESCRIBES * len(views)
        await asyncio.gather(*(self.refresh_consumer_group(v.target.name, cg) for v, cg in pairs))

    async def _in_pool(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @staticmethod
    def _list_groups(v: GroupView, admin: BrokerAdmin) -> list[str] | None:
        try:
            names = [s.group for s in admin.list_groups()]
        except DLedgerError as e:
            v.groups_error = error_text(e)
            return None
        v.groups_error = ""
        return names

    async def refresh_consumer_group(self, group: str, consumer_group: str, patient: bool = False) -> None:
        """Read a consumer group's queues and members in ``group`` again (each round, and at once, ``patient``,
        after the console reset its offsets)."""
        v = self.views[group]
        try:
            members, queues = await self._in_pool(self.admin(group, patient).describe, consumer_group)
        except NotFoundError:  # no state of it in this group (any more)
            v.offsets.pop(consumer_group, None)
            v.members.pop(consumer_group, None)
            return
        except DLedgerError:  # the group did not answer this round: what shows is the last answer
            return
        old = v.offsets.get(consumer_group)
        if old is not None and [q.committed for q in old] != [q.committed for q in queues]:
            self.moved_at[consumer_group] = time.time()
        v.offsets[consumer_group] = queues
        v.members[consumer_group] = members

    def consumer_rows(self, consumer_group: str | None = None) -> list[dict[str, Any]]:
        """One row per (consumer group, group, topic, queue) the consumer group has state on (or only
        ``consumer_group``'s)."""
        rows = []
        for v in self.views.values():
            for cg, queues in sorted(v.offsets.items()):
                if consumer_group is not None and cg != consumer_group:
                    continue
                for q in queues:
                    rows.append(
                        {
                            "consumer_group": cg,
                            "group": v.target.name,
                            "topic": q.topic,
                            "queue": q.queue_id,
                            "max_offset": q.max_offset,
                            "committed": q.committed,
                            "lag": None if q.committed is None else q.lag,
                            "in_flight": q.in_flight,
                        }
                    )
        return rows

    def members_of(self, consumer_group: str) -> list[str]:
        """The consumer group's members: our consumers pulling from a group's leader and RocketMQ 5 clients
        heartbeating to it, and a cluster's consumers heartbeating to the name servers (docs/console.md)."""
        found = set(self.members.get(consumer_group, ()))
        for v in self.views.values():
            found.update(v.members.get(consumer_group, ()))
        return sorted(found)

    def total_lags(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.consumer_rows():
            if r["lag"] is not None:
                out[r["consumer_group"]] = out.get(r["consumer_group"], 0) + r["lag"]
        return out

    # -- series for the charts -------------------------------------------------------------------------------
    def rate_series(self) -> dict[str, Any]:
        """Messages per second per "group/topic" between consecutive samples."""
        samples = list(self.rates)
        names = sorted({k for _, d in samples for k in d if not k.split("/", 1)[1].startswith("%")})
        xs: list[float] = []
        ys: dict[str, list[float | None]] = {n: [] for n in names}
        for (t0, a), (t1, b) in itertools.pairwise(samples):
            xs.append(t1)
            for n in names:
                ys[n].append(None if n not in a or n not in b else max(0, b[n] - a[n]) / max(t1 - t0, 1e-6))
        return {"x": xs, "series": ys}

    def lag_series(self) -> dict[str, Any]:
        samples = list(self.lags)
        names = sorted({k for _, d in samples for k in d})
        return {"x": [t for t, _ in samples], "series": {n: [d.get(n) for _, d in samples] for n in names}}

    def failover_series(self) -> dict[str, Any]:
        """Each failover's leaderless time, between two empty ends (10 minutes ago at least, and now) so that the
        time axis shows when they happened rather than spanning the points alone."""
        ev = [e for e in self.events if e.leaderless_s is not None]
        now = time.time()
        xs = [min([now - 600.0, *(e.at for e in ev)]), *(e.at for e in ev), now]
        ys = [None, *(round(e.leaderless_s or 0.0, 3) for e in ev), None]
        return {"x": xs, "series": {"leaderless s": ys}}
