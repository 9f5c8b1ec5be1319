"""Our side of the comparison: a 3-node dledger group (``dledger.group``: real node processes on 127.0.0.1) with
its default Raft timing, run once with ``flush = "sync"`` (fdatasync before an append is acknowledged) and once
with ``flush = "async"`` (page cache, flushed every 10 ms), and a broker group for the batched produce path.

Load client: one ``AsyncDLedgerClient`` shared by all writers (grpc.aio; concurrent appends share one
bidirectional stream per node, the way the client library serves any concurrent caller). The batched path is
``append_batch`` of 100 bodies. The broker variant uses ``broker_adapter.client.Producer.send_batch`` (a
blocking gRPC client, one producer per writer thread).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.compare.base import LeaderView, ProcessRegistry, poll_until
from dledger import group as grp
from dledger.client import AsyncDLedgerClient
from dledger.errors import DLedgerError

TOPIC = "compare"


class _DLedgerLoad:
    def __init__(self, client: AsyncDLedgerClient):
        self._c = client

    async def put(self, value: bytes) -> None:
        await self._c.append(value)

    async def put_batch(self, values: list[bytes]) -> None:
        await self._c.append_batch(values)

    async def close(self) -> None:
        await self._c.close()


class _ProducerLoad:
    """Batched produce through the broker: one blocking ``Producer`` per writer thread."""

    def __init__(self, addresses: list[str], writers: int = 64):
        from broker_adapter.client import Producer

        self._addresses = addresses
        self._producer_cls = Producer
        self._pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="producer")
        self._free: list = []

    def _send(self, values: list[bytes]) -> None:
        p = self._free.pop() if self._free else self._producer_cls(self._addresses)
        try:
            if len(values) == 1:
                p.send(TOPIC, values[0])
            else:
                p.send_batch(TOPIC, values)
        finally:
            self._free.append(p)

    async def put(self, value: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._send, [value])

    async def put_batch(self, values: list[bytes]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._send, values)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        for p in self._free:
            p.close()
        self._free.clear()


class OursSystem:
    """A 3-node dledger group with one flush policy (``broker=True``: with the broker state machine)."""

    def __init__(self, registry: ProcessRegistry, flush: str = "sync", broker: bool = False):
        self.flush = flush
        self.broker = broker
        self.name = f"ours-{'broker-' if broker else ''}{flush}"
        self.durability = (
            "fdatasync before ack (flush=sync)"
            if flush == "sync"
            else "no fsync before ack (flush=async, page cache flushed every 10 ms)"
        )
        self.client_kind = (
            "broker Producer (blocking gRPC, one per writer thread)"
            if broker
            else "AsyncDLedgerClient (grpc.aio, appends share one stream)"
        )
        self.batch_size = 100
        self.batch_path = "Producer.send_batch(100)" if broker else "append_batch(100)"
        self._registry = registry
        self._group: grp.GroupSpec | None = None
        registry.on_stop(self._stop_sync)

    @property
    def group(self) -> grp.GroupSpec:
        if self._group is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._group

    async def start(self, workdir: Path) -> None:
        g = grp.create(
            workdir / self.name, 3, None, flush=self.flush, state_machine="broker" if self.broker else ""
        )
        self._group = g
        for spec in g.nodes:
            grp.start_node(spec)
        await grp.wait_for_leader_async(g, timeout_s=30)
        if self.broker:
            from broker_adapter.client import BrokerConnection

            def create() -> None:
                with BrokerConnection(g.addresses) as c:
                    c.create_topic(TOPIC, 4)

            await asyncio.to_thread(create)

    def _stop_sync(self) -> None:
        if self._group is not None:
            grp.stop_group(self._group)
            self._group = None

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop_sync)

    async def client(self, *, failover: bool = False):
        g = self.group
        if self.broker:
            return _ProducerLoad(g.addresses)
        if failover:  # short deadlines: a trickle write that hangs on a dead leader must not hide recovery
            c = AsyncDLedgerClient(
                g.addresses, g.name, timeout_s=1.0, rpc_timeout_s=0.5, backoff_s=(0.005, 0.02)
            )
        else:
            c = AsyncDLedgerClient(g.addresses, g.name, timeout_s=10.0, rpc_timeout_s=5.0)
        return _DLedgerLoad(c)

    async def _leader_row(self) -> grp.NodeStatus | None:
        return grp.leader_of(await grp.status_async(self.group, timeout_s=0.3))

    async def leader(self) -> LeaderView | None:
        row = await self._leader_row()
        return LeaderView(row.id, row.term or 0) if row else None

    async def leader_pid(self) -> int | None:
        row = await self._leader_row()
        return row.pid if row else None

    async def kill_leader(self) -> tuple[str, float]:
        row = await poll_until(self._leader_row, 15, f"{self.name}: a leader")
        spec = self.group.node(row.id)
        t_kill = time.monotonic()
        if grp.kill_node(spec) is None:
            raise RuntimeError(f"{self.name}: leader {row.id} was not running")
        return row.id, t_kill

    async def restart(self, member: str) -> None:
        spec = self.group.node(member)
        grp.start_node(spec)

        async def caught_up() -> bool:
            lead = await self._leader_row()
            if lead is None or lead.id == member:
                return lead is not None
            async with AsyncDLedgerClient([spec.address], timeout_s=0.5, rpc_timeout_s=0.5) as c:
                try:
                    info = await c.metadata(spec.address)
                except DLedgerError:
                    return False
            return info.commit_index >= (lead.commit_index or 0)

        await poll_until(caught_up, 30, f"{self.name}: {member} caught up", interval_s=0.05)
