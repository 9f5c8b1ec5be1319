"""Our side of ``bench.jetstream``: a 3-node broker group (``dledger.group``, real node processes on
127.0.0.1) with one flush policy, and the broker clients users have.

Client kinds (``KINDS``; a new client is one more entry there):

- ``producer``: the blocking ``broker_adapter.client.Producer``, shared by threads as issue 15 measures it:
  64 concurrent senders are 64 threads over 16 Producers (thread i uses Producer i % 16), the sequential
  sender one thread with one Producer, the batched path one thread calling ``send_batch`` of 256.
- ``async-producer``: ``broker_adapter.client.AsyncProducer`` (when the installed code has it), one instance
  shared by asyncio tasks; batched is one task awaiting ``send_batch`` of 256.

Consume is one ``Consumer`` pulling 1,024 messages per call from the leader, queue after queue, from offset 0.
The leader kill: a warm ``Producer`` (1 s call deadline) is idle, the leader gets SIGKILL, and the next
``send`` is timed from the kill to its acknowledgement (the client's own retries and redirects included).
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.compare.base import ProcessRegistry
from bench.jetstream_load import BODY, Measured, Plan
from dledger import group as grp

TOPIC = "bench"
QUEUES = 4
PRODUCERS_PER_64 = 16  # 64 threads over 16 Producers (issue 15)
PULL = 1024


# The default snapshot policy (256 MiB of bodies) compacts a busy run's log before the consume workload reads it.
RETAIN_ALL = "\n[snapshot]\nentries = 100000000\nbytes = 68719476736\n"


class ProducerClient:
    """Blocking ``Producer`` instances shared by the worker threads (worker i uses instance i % count)."""

    mode = "threads"
    description = "broker_adapter.client.Producer (blocking gRPC), 64 threads over 16 Producers"
    batch_plan = Plan("batched", 1, 256)

    def __init__(self, addresses: list[str]):
        self._addresses = addresses
        self._producers: list = []

    def connect(self, workers: int) -> None:
        from broker_adapter.client import Producer

        count = max(1, min(workers, workers * PRODUCERS_PER_64 // 64))
        self._producers = [Producer(self._addresses) for _ in range(count)]
        for p in self._producers:
            p.send(TOPIC, BODY)  # a channel, the leader and the topic's queues, before the clock runs

    def send(self, worker: int, n: int) -> int:
        p = self._producers[worker % len(self._producers)]
        if n == 1:
            p.send(TOPIC, BODY)
            return 1
        return len(p.send_batch(TOPIC, [BODY] * n))

    def close(self) -> None:
        for p in self._producers:
            p.close()
        self._producers.clear()


class AsyncProducerClient:
    """One ``AsyncProducer`` shared by all the tasks (its calls pipeline over one stream per node)."""

    mode = "async"
    description = "broker_adapter.client.AsyncProducer (grpc.aio), one instance shared by the tasks"
    batch_plan = Plan("batched", 1, 256)

    def __init__(self, addresses: list[str]):
        self._addresses = addresses
        self._p = None

    async def connect(self, workers: int) -> None:
        from broker_adapter.client import AsyncProducer  # type: ignore[attr-defined]

        self._p = AsyncProducer(self._addresses)
        await self._p.send(TOPIC, BODY)

    async def send(self, worker: int, n: int) -> int:
        assert self._p is not None
        if n == 1:
            await self._p.send(TOPIC, BODY)
            return 1
        return len(await self._p.send_batch(TOPIC, [BODY] * n))

    async def close(self) -> None:
        if self._p is not None:
            await self._p.close()
            self._p = None


def _has_async_producer() -> bool:
    import broker_adapter.client

    return hasattr(broker_adapter.client, "AsyncProducer")


# kind -> (client class, whether the installed code has it)
KINDS = {
    "producer": (ProducerClient, lambda: True),
    "async-producer": (AsyncProducerClient, _has_async_producer),
}


def available_kinds() -> list[str]:
    return [k for k, (_, present) in KINDS.items() if present()]


class OursBroker:
    """A 3-node broker group with ``flush`` "sync" (fdatasync before the ack) or "async" (page cache)."""

    def __init__(self, registry: ProcessRegistry, flush: str, kinds: list[str]):
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown client kind(s) {unknown}; choose from {', '.join(KINDS)}")
        self.flush = flush
        self.name = f"ours-{flush}"
        self.kinds = kinds
        self.durability = (
            "fdatasync on a majority before the ack (flush=sync)"
            if flush == "sync"
            else "majority in page cache before the ack, fsync every 10 ms (flush=async)"
        )
        self._group: grp.GroupSpec | None = None
        registry.on_stop(self.stop)

    @property
    def group(self) -> grp.GroupSpec:
        if self._group is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._group

    def version(self) -> str:
        return "dledger-py broker (this checkout)"

    def start(self, workdir: Path) -> None:
        from broker_adapter.client import BrokerConnection

        g = grp.create(workdir / self.name, 3, None, flush=self.flush, state_machine="broker")
        for spec in g.nodes:  # keep the whole run's log: the consume workload reads every queue from offset 0
            with open(spec.config, "a") as f:
                f.write(RETAIN_ALL)
        self._group = g
        for spec in g.nodes:
            grp.start_node(spec)
        grp.wait_for_leader(g, timeout_s=30)
        with BrokerConnection(g.addresses) as c:
            c.create_topic(TOPIC, QUEUES)

    def stop(self) -> None:
        if self._group is not None:
            grp.stop_group(self._group)
            self._group = None

    def describe(self, kind: str) -> str:
        return KINDS[kind][0].description

    def client(self, kind: str):
        cls, _ = KINDS[kind]
        return cls(self.group.addresses)

    def consume(self, seconds: float) -> Measured:
        """One consumer pulls every queue from offset 0 on the leader, until all is read or ``seconds``."""
        from broker_adapter.client import BrokerConnection, Consumer

        g = self.group
        leader = grp.wait_for_leader(g).address
        with BrokerConnection([leader]) as c:
            ends = list({t.topic: t for t in c.list_topics()}[TOPIC].max_offsets)
        out = Measured()
        with Consumer([leader], "bench-consume") as c:
            c.pull(TOPIC, 0, 0, 1)  # the channel, before the clock runs
            t0 = time.perf_counter()
            deadline = t0 + seconds
            for q, end in enumerate(ends):
                off = 0
                while off < end and time.perf_counter() < deadline:
                    t1 = time.perf_counter()
                    msgs = c.pull(TOPIC, q, off, PULL)
                    out.latencies_s.append(time.perf_counter() - t1)
                    if not msgs:
                        break
                    off = msgs[-1].queue_offset + 1
                    out.messages += len(msgs)
            out.seconds = time.perf_counter() - t0
        return out

    def leader_kill(self, timeout_s: float) -> tuple[str, float]:
        """SIGKILL the leader; (what happened, milliseconds from the kill to the next acknowledged send)."""
        from broker_adapter.client import Producer

        g = self.group
        with Producer(g.addresses, timeout_s=1.0, retry_for_s=timeout_s) as p:
            for _ in range(3):  # warm: the leader found (a redirect is cached), the topic's queues known
                p.send(TOPIC, BODY)
            leader = grp.wait_for_leader(g)
            t_kill = time.perf_counter()
            if grp.kill_node(g.node(leader.id)) is None:
                raise RuntimeError(f"{self.name}: leader {leader.id} was not running")
            p.send(TOPIC, BODY)  # the Producer retries and follows redirects itself
            return f"killed {leader.id}", (time.perf_counter() - t_kill) * 1000
