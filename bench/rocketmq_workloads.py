"""The client workloads ``bench.rocketmq_client`` measures: the official RocketMQ 5 Python client (sequential,
with sends in flight, receive and ack, acks in a window) and our own clients doing the same work, each returning
its rate (messages per second)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait

import grpc
from rocketmq import ClientConfiguration, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code

from broker_adapter.client import Consumer
from broker_adapter.client import Producer as OurProducer
from broker_adapter.rocketmq import ensure_event_loop

BODY = bytes(range(256)) * 4  # 1 KiB


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _message(topic: str, i: int) -> Message:
    m = Message()
    m.topic = topic
    m.body = BODY
    m.tag = "bench"
    m.keys = f"k{i}"
    return m


def official_send(cfg: ClientConfiguration, topic: str, n: int) -> float:
    ensure_event_loop()
    p = Producer(cfg, (topic,))
    p.startup()
    try:
        p.send(_message(topic, -1))  # warm: route and connection
        t0 = time.perf_counter()
        for i in range(n):
            p.send(_message(topic, i))
        return rate(n, time.perf_counter() - t0)
    finally:
        p.shutdown()


def official_send_async(cfg: ClientConfiguration, topic: str, n: int, inflight: int) -> float:
    ensure_event_loop()
    p = Producer(cfg, (topic,))
    p.startup()
    try:
        p.send(_message(topic, -1))
        pending: set = set()
        t0 = time.perf_counter()
        for i in range(n):
            if len(pending) >= inflight:
                done, pending = wait(pending, return_when="FIRST_COMPLETED")
                for f in done:
                    f.result()  # a failed send fails the benchmark: nothing is counted that was not acked
            pending.add(p.send_async(_message(topic, i)))
        for f in pending:
            f.result()
        return rate(n, time.perf_counter() - t0)
    finally:
        p.shutdown()


def our_send(addresses: list[str], topic: str, n: int) -> float:
    with OurProducer(addresses) as p:
        p.send(topic, BODY, tags="bench", keys=["k-1"])
        t0 = time.perf_counter()
        for i in range(n):
            p.send(topic, BODY, tags="bench", keys=[f"k{i}"])
        return rate(n, time.perf_counter() - t0)


def our_send_concurrent(addresses: list[str], topic: str, n: int, inflight: int) -> float:
    with OurProducer(addresses) as p, ThreadPoolExecutor(inflight) as pool:
        p.send(topic, BODY)
        t0 = time.perf_counter()
        for f in [pool.submit(p.send, topic, BODY, "bench", [f"k{i}"]) for i in range(n)]:
            f.result()
        return rate(n, time.perf_counter() - t0)


def official_consume(
    cfg: ClientConfiguration, topic: str, group: str, n: int, concurrent_acks: bool = False
) -> float:
    """Receive and ack ``n`` messages (the topic holds exactly the ones this side sent): one ack at a time, or
    every ack of a received batch in flight at once from a thread pool, then the next receive. (The client's
    ``ack_async`` returns None in 5.1.2 instead of its future, so nothing could wait for those acks.)"""
    pool = ThreadPoolExecutor(32) if concurrent_acks else None
    ensure_event_loop()
    c = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1)
    c.startup()
    try:
        got = 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            batch = c.receive(32, 30)
            if pool is not None:
                list(pool.map(c.ack, batch))
            else:
                for m in batch:
                    c.ack(m)
            got += len(batch)
        return rate(got, time.perf_counter() - t0)
    finally:
        c.shutdown()
        if pool is not None:
            pool.shutdown()


def our_consume(addresses: list[str], topic: str, group: str, n: int) -> float:
    with Consumer(addresses, group) as c:
        got = 0
        t0 = time.perf_counter()
        for _ in c.messages(topic, batch=32, idle_s=1.0, limit=n):
            got += 1
        return rate(got, time.perf_counter() - t0)


def official_send_window(cfg: ClientConfiguration, topic: str, n: int, inflight: int) -> tuple[float, int]:
    return official_send_async(cfg, topic, n, inflight), n


def _acked(f) -> bool:
    """Whether the ack was answered OK. One refused (a leader change under load: the client does not retry
    acks, the message comes back after its invisible time) is not counted and is reported."""
    st = f.result().status
    if st.code != Code.OK:
        print(f"  ack refused: {st.code} {st.message}", file=sys.stderr)
        return False
    return True


def official_consume_window(
    cfg: ClientConfiguration, topic: str, group: str, n: int, window: int = 32
) -> tuple[float, int]:
    """Receive batches of 32 and acknowledge every message with up to ``window`` acks in flight (the next
    receive goes out while the last batch's acks are still outstanding). ``n``: what the topic holds."""
    ensure_event_loop()
    c = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1)
    c.startup()
    try:
        got = acked = 0
        pending: set = set()
        t0 = time.perf_counter()
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            for m in c.receive(32, 30):
                if len(pending) >= window:
                    done, pending = wait(pending, return_when="FIRST_COMPLETED")
                    acked += sum(_acked(f) for f in done)
                pending.add(c._Consumer__ack(m))  # the future the public ack_async drops (5.1.2)
                got += 1
        acked += sum(_acked(f) for f in pending)
        return rate(acked, time.perf_counter() - t0), acked
    finally:
        c.shutdown()


def _official_metadata() -> tuple[tuple[str, str], ...]:
    """The headers the official client 5.1.2 puts on every call (``rocketmq.v5.util.signature``), so that a bare
    call carries as much metadata as a RocketMQ one."""
    return (
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-client-id", "bench@1@0@bare"),
        ("x-mq-namespace", ""),
    )


def bare_calls(address: str, method: str, n: int, inflight: int, request: bytes = b"") -> tuple[float, int]:
    """``n`` calls of an empty unary method (``bench.rocketmq_double --bare``) from a grpc.aio channel, as the
    official client makes them (its metadata, a timeout), with ``inflight`` outstanding at a time."""

    async def run() -> float:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(method)
            metadata = _official_metadata()
            await call(request, metadata=metadata, timeout=3)  # connected
            left = n

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await call(request, metadata=metadata, timeout=3)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(inflight)))
            return rate(n, time.perf_counter() - t0)

    with ThreadPoolExecutor(
        1
    ) as thread:  # asyncio.run would leave this thread without the loop the client needs
        return thread.submit(asyncio.run, run()).result(), n
