"""An in-process group for runtime tests: real ``Node`` objects and real gRPC on 127.0.0.1, one event loop.

Storage is injectable (memory stores by default, or recording wrappers), so the runtime's own rules (persist
before send, group commit, error mapping) are tested without the file engine, and the test controls every
object it creates.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from dledger.core.config import RaftConfig
from dledger.core.messages import Role
from dledger.group import free_ports
from dledger.nodeconfig import NodeConfig
from dledger.runtime.node import Node
from storage.memory import MemoryLogStore, MemoryMetaStore


class LocalGroup:
    def __init__(
        self,
        tmp: Path,
        n: int = 3,
        *,
        stores=None,
        state_machine=None,
        state_machine_plugin: str = "",
        raft: RaftConfig | None = None,
        **cfg,
    ):
        ports = free_ports(n)
        self.peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        self.nodes: dict[str, Node] = {}
        for i, pid in enumerate(self.peers):
            log, meta = stores(pid) if stores else (MemoryLogStore(), MemoryMetaStore())
            config = NodeConfig(
                pid,
                self.peers,
                tmp / pid,
                raft=raft or RaftConfig(),
                state_machine=state_machine_plugin,
                **cfg,
            )
            sm = state_machine(pid) if state_machine else None
            self.nodes[pid] = Node(
                config, log_store=log, meta_store=meta, rng=random.Random(i), state_machine=sm
            )

    @property
    def addresses(self) -> list[str]:
        return list(self.peers.values())

    async def start(self) -> None:
        for n in self.nodes.values():
            await n.start()

    async def stop(self) -> None:
        await asyncio.gather(*(n.stop() for n in self.nodes.values()), return_exceptions=True)

    async def leader(self, timeout_s: float = 10.0) -> Node:
        """Poll until exactly one node leads the highest term."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            leaders = [n for n in self.nodes.values() if n.core is not None and n.core.role is Role.LEADER]
            if len(leaders) == 1:
                return leaders[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no single leader within {timeout_s} s")

    async def until(self, cond, timeout_s: float = 10.0, what: str = "condition") -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if cond():
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{what} not reached within {timeout_s} s")

    async def __aenter__(self) -> LocalGroup:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
