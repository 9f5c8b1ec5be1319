"""The load loops of ``bench.jetstream``, the same code for every system and client.

A client of a system under test comes in one of two shapes, and the loop follows the shape rather than forcing
one on it: a *blocking* client (``mode = "threads"``: our ``Producer``) is driven by OS threads, an *asyncio*
client (``mode = "async"``: nats-py, an ``AsyncProducer``) by tasks on one event loop. Wrapping a blocking
client in an executor, or an async one in threads, would add a hand-off per call that neither system's users
pay.

Every worker sends until the window ends; an operation counts when it started after the warm-up and was
acknowledged before the window closed, so its messages are all acknowledged ones. ``send(worker, n)`` sends
``n`` messages in one call and returns how many were acknowledged.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

BODY = bytes(range(256)) * 4  # 1 KiB
ERROR_PAUSE_S = 0.01  # after a failed call, so a broken system does not turn the loop into a spin


class ThreadClient(Protocol):
    mode: str  # "threads"
    description: str

    def connect(self, workers: int) -> None: ...

    def send(self, worker: int, n: int) -> int: ...

    def close(self) -> None: ...


class AsyncClient(Protocol):
    mode: str  # "async"
    description: str

    async def connect(self, workers: int) -> None: ...

    async def send(self, worker: int, n: int) -> int: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """One workload: ``workers`` concurrent callers, ``per_call`` messages per call."""

    workload: str
    workers: int
    per_call: int


@dataclass(slots=True)
class Measured:
    messages: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)  # one per call
    errors: int = 0
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else math.nan

    def latency_ms(self, q: float) -> float:
        return percentile(self.latencies_s, q) * 1000


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class _Tally:
    """What the workers saw, merged under a lock once per worker (not per call)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.result = Measured()

    def add(self, messages: int, latencies: list[float], errors: int, first_error: str) -> None:
        with self.lock:
            self.result.messages += messages
            self.result.latencies_s.extend(latencies)
            self.result.errors += errors
            if first_error and not self.result.first_error:
                self.result.first_error = first_error


def run_threads(client: ThreadClient, plan: Plan, seconds: float, warmup_s: float) -> Measured:
    """``plan.workers`` threads calling ``client.send`` until the window closes."""
    client.connect(plan.workers)
    tally = _Tally()
    t_start = time.perf_counter() + warmup_s
    t_end = t_start + seconds

    def worker(i: int) -> None:
        msgs, lat, errors, first = 0, [], 0, ""
        while (t0 := time.perf_counter()) < t_end:
            try:
                n = client.send(i, plan.per_call)
            except Exception as e:  # counted and shown; the run goes on
                errors += 1
                first = first or repr(e)
                time.sleep(ERROR_PAUSE_S)
                continue
            t1 = time.perf_counter()
            if t0 >= t_start and t1 <= t_end:
                msgs += n
                lat.append(t1 - t0)
        tally.add(msgs, lat, errors, first)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(plan.workers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + warmup_s + 120)
    finally:
        client.close()
    tally.result.seconds = seconds
    return tally.result


async def run_tasks(client: AsyncClient, plan: Plan, seconds: float, warmup_s: float) -> Measured:
    """``plan.workers`` tasks awaiting ``client.send`` until the window closes."""
    await client.connect(plan.workers)
    tally = _Tally()
    t_start = time.perf_counter() + warmup_s
    t_end = t_start + seconds

    async def worker(i: int) -> None:
        msgs, lat, errors, first = 0, [], 0, ""
        while (t0 := time.perf_counter()) < t_end:
            try:
                n = await client.send(i, plan.per_call)
            except Exception as e:
                errors += 1
                first = first or repr(e)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            t1 = time.perf_counter()
            if t0 >= t_start and t1 <= t_end:
                msgs += n
                lat.append(t1 - t0)
        tally.add(msgs, lat, errors, first)

    try:
        # One bound for the whole window, as ``run_threads`` joins its threads: each client bounds its own calls
        # (a task and a timer per call, ``asyncio.wait_for``, cost the bench's process more than some clients do).
        await asyncio.wait_for(
            asyncio.gather(*(worker(i) for i in range(plan.workers))), seconds + warmup_s + 120
        )
    finally:
        await client.close()
    tally.result.seconds = seconds
    return tally.result


def run(client: ThreadClient | AsyncClient, plan: Plan, seconds: float, warmup_s: float) -> Measured:
    """Drive ``client`` the way its shape asks for."""
    if client.mode == "threads":
        return run_threads(client, plan, seconds, warmup_s)  # type: ignore[arg-type]
    if client.mode == "async":
        return asyncio.run(run_tasks(client, plan, seconds, warmup_s))  # type: ignore[arg-type]
    raise ValueError(f"unknown client mode {client.mode!r}")
