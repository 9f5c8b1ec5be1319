"""The five workloads of issue 8, written once against ``base.System`` so every system runs the same code.

1. ``sequential``: one writer, one 1 KiB value per call: writes/s and p50/p99 latency.
2. ``concurrent-16`` / ``concurrent-64``: 16 and 64 concurrent writers sharing one client: writes/s, p50/p99.
3. ``batched``: 16 concurrent writers, each call the system's best batched path (ours: ``append_batch`` of
   100, the broker: ``send_batch`` of 100; etcd: a transaction of 100 puts; PySyncObj: one ``@replicated``
   call with 25 values, its best size here): entries/s.
4. ``failover``: a trickle of writes (a new one every 10 ms, each bounded by a short deadline, rotating over
   the members where the system's client does not find the leader itself), kill -9 the leader, measure from
   the kill to the completion of the first successful write issued after it, and to the first poll that
   shows a new leader; restart the killed member and wait for it to catch up; N rounds.
5. ``stability``: the heaviest load (64 writers x the system's batch) for a long run while the leader is polled every
   100 ms: leader changes seen and elections (term increase).

Every load is bounded in time (``seconds`` after ``warmup_s``) and in count (``max_entries``). Latency is
measured per call, from the call to its acknowledgement, for calls that start and end inside the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from dataclasses import dataclass

from bench.compare.base import LeaderView, System

VALUE = 1024


@dataclass(frozen=True, slots=True)
class LoadPoint:
    workload: str
    writers: int
    batch: int


SEQUENTIAL = LoadPoint("sequential", 1, 1)
CONCURRENT_16 = LoadPoint("concurrent-16", 16, 1)
CONCURRENT_64 = LoadPoint("concurrent-64", 64, 1)
BATCHED = LoadPoint("batched", 16, 0)  # batch 0: the system's own batch_size
FULL_LOAD = LoadPoint("stability", 64, 0)
THROUGHPUT_POINTS = (SEQUENTIAL, CONCURRENT_16, CONCURRENT_64, BATCHED)


@dataclass(frozen=True, slots=True)
class LoadResult:
    system: str
    workload: str
    round: int
    writers: int
    batch: int
    seconds: float
    entries: int
    calls: int
    errors: int
    rate: float  # acknowledged entries per second
    p50_ms: float
    p99_ms: float
    elections: int  # term increase over the run
    leader_changes: int  # changes of (leader, term) seen by polling (stability run only; else from the ends)
    client_cpu: float = float("nan")  # the load generator's CPU over the run, in cores (1.0 = one core busy)


@dataclass(frozen=True, slots=True)
class FailoverResult:
    system: str
    round: int
    killed: str
    to_write_ms: float  # kill -> first successful write issued after the kill
    to_leader_ms: float  # kill -> first poll showing another member leading
    failed_writes: int


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _leader_or_none(system: System) -> LeaderView | None:
    try:
        return await system.leader()
    except Exception:  # a member is down or busy: one missed poll is not a leader change
        return None


def _count_changes(views: list[LeaderView]) -> int:
    return sum(1 for a, b in itertools.pairwise(views) if a != b)


async def run_load(
    system: System,
    point: LoadPoint,
    seconds: float,
    *,
    round_no: int = 0,
    warmup_s: float = 1.0,
    max_entries: int = 5_000_000,
    poll_leader_s: float = 0.0,
    call_timeout_s: float = 15.0,
) -> LoadResult:
    """Drive ``point`` against ``system`` for ``warmup_s`` + ``seconds`` (or until ``max_entries``). A call
    that takes longer than ``call_timeout_s`` counts as an error, so a stalled system cannot hang the run."""
    batch = point.batch or system.batch_size
    value = os.urandom(VALUE)
    values = [value] * batch
    lat: list[float] = []
    entries = calls = errors = 0
    client = await system.client()
    views: list[LeaderView] = []
    try:
        first = await _leader_or_none(system)
        if first:
            views.append(first)
        loop = asyncio.get_running_loop()
        cpu0, wall0 = time.process_time(), loop.time()
        t_start = wall0 + warmup_s
        t_end = t_start + seconds
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                v = await _leader_or_none(system)
                if v is not None and (not views or views[-1] != v):
                    views.append(v)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_leader_s)

        async def writer() -> None:
            nonlocal entries, calls, errors
            while entries < max_entries:
                t0 = loop.time()
                if t0 >= t_end:
                    return
                try:
                    if batch == 1:
                        await asyncio.wait_for(client.put(value), call_timeout_s)
                    else:
                        await asyncio.wait_for(client.put_batch(values), call_timeout_s)
                except Exception:  # any failed write counts as an error; the load goes on
                    errors += 1
                    await asyncio.sleep(0.001)
                    continue
                t1 = loop.time()
                if t0 >= t_start and t1 <= t_end:
                    lat.append(t1 - t0)
                    entries += batch
                    calls += 1

        watcher = asyncio.create_task(watch()) if poll_leader_s else None
        await asyncio.gather(*(writer() for _ in range(point.writers)))
        measured = min(seconds, max(1e-9, loop.time() - t_start))
        client_cpu = (time.process_time() - cpu0) / max(1e-9, loop.time() - wall0)
        stop.set()
        if watcher is not None:
            await watcher
        last = await _leader_or_none(system)
        if last is not None and (not views or views[-1] != last):
            views.append(last)
    finally:
        await client.close()
    elections = views[-1].term - views[0].term if len(views) >= 2 else 0
    return LoadResult(
        system=system.name,
        workload=point.workload,
        round=round_no,
        writers=point.writers,
        batch=batch,
        seconds=measured,
        entries=entries,
        calls=calls,
        errors=errors,
        rate=entries / measured,
        p50_ms=percentile(lat, 0.5) * 1000,
        p99_ms=percentile(lat, 0.99) * 1000,
        elections=elections,
        leader_changes=_count_changes(views),
        client_cpu=client_cpu,
    )


async def failover_round(
    system: System,
    round_no: int,
    *,
    trickle_s: float = 0.01,
    write_deadline_s: float = 1.0,
    timeout_s: float = 10.0,
) -> FailoverResult:
    """One kill -9 of the leader under a write trickle; the killed member is restarted and caught up after."""
    client = await system.client(failover=True)
    value = os.urandom(VALUE)
    done: list[tuple[float, float]] = []  # (issued, acknowledged) of successful writes
    failed = 0
    tasks: set[asyncio.Task] = set()
    stop = asyncio.Event()

    async def one_write() -> None:
        nonlocal failed
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(client.put(value), write_deadline_s)
        except Exception:  # refused, timed out, or lost with the leader: the next trickle write tries again
            failed += 1
            return
        done.append((t0, time.monotonic()))

    async def trickle() -> None:
        while not stop.is_set():
            t = asyncio.create_task(one_write())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), trickle_s)

    async def wait_for(cond, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.name} failover round {round_no}: {what} within {timeout_s} s")
            await asyncio.sleep(0.005)

    trickler = asyncio.create_task(trickle())
    try:
        await wait_for(lambda: len(done) >= 20, "20 writes acknowledged before the kill")
        killed, t_kill = await system.kill_leader()
        new_leader: list[float] = []

        async def watch() -> None:
            while time.monotonic() < t_kill + timeout_s:
                v = await _leader_or_none(system)
                if v is not None and v.leader != killed:
                    new_leader.append(time.monotonic() - t_kill)
                    return
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        await wait_for(lambda: any(t0 >= t_kill for t0, _ in done), "a write issued after the kill succeeded")
        await watcher
    finally:
        stop.set()
        await trickler
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
    to_write = min(t1 for t0, t1 in done if t0 >= t_kill) - t_kill
    await system.restart(killed)
    return FailoverResult(
        system=system.name,
        round=round_no,
        killed=killed,
        to_write_ms=to_write * 1000,
        to_leader_ms=(new_leader[0] if new_leader else float("nan")) * 1000,
        failed_writes=failed,
    )
