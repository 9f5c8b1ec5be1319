"""A full disk makes a node refuse writes, not stop and not corrupt its log (real files, real gRPC).

Every node's log is a ``FileLogStore`` writing through the chaos suite's ``SwitchableFullDisk``: while a node's
control file exists, each write of its log fails with ENOSPC exactly as a full file system answers.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dledger.chaos.faultnode import SwitchableFullDisk, control_path
from dledger.client import AsyncDLedgerClient
from dledger.core.messages import Role
from dledger.errors import DLedgerError, OutcomeUnknownError
from storage.filestore import FileLogStore
from storage.memory import MemoryMetaStore
from tests.conftest import TEST_INDEX_UNITS
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(90)


def _file_stores(tmp_path):
    def stores(pid):
        directory = tmp_path / "logs" / pid
        directory.mkdir(parents=True)
        log = FileLogStore.open(
            str(directory), io=SwitchableFullDisk(str(control_path(directory))), index_units=TEST_INDEX_UNITS
        )
        return log, MemoryMetaStore()

    return stores


def _fill(tmp_path, pid: str) -> None:
    control_path(tmp_path / "logs" / pid).write_text("full\n")


def _free(tmp_path, pid: str) -> None:
    control_path(tmp_path / "logs" / pid).unlink(missing_ok=True)


async def _append_eventually(c: AsyncDLedgerClient, body: bytes, timeout_s: float = 20.0):
    """Retry a body while nothing was written; None when the outcome is unknown (it may or may not commit: an
    append is not idempotent, so it is not retried)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await c.append(body)
        except OutcomeUnknownError:
            return None
        except (DLedgerError, grpc.RpcError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def _bodies(node, last: int) -> list[bytes]:
    return [node.log_store.entry(i).body for i in range(node.log_store.first_index, last + 1)]


def test_a_leader_whose_disk_fills_steps_down_and_the_group_writes_on(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, stores=_file_stores(tmp_path)) as g:
            old = await g.leader()
            async with AsyncDLedgerClient(g.addresses) as c:
                before = [await c.append(b"before %d" % i) for i in range(20)]
                _fill(tmp_path, old.id)
                # The leader's next write fails: it refuses it, steps down, and another node leads.
                during = [b"during %d" % i for i in range(30)]
                outcomes = [await _append_eventually(c, body) for body in during]
                acked = [r for r in outcomes if r is not None]
                assert len(acked) >= 28, (
                    "at most the appends in flight when the disk filled have unknown outcomes"
                )
                await g.until(
                    lambda: any(n.core.role is Role.LEADER for n in g.nodes.values() if n is not old),
                    what="another leader",
                )
                assert old.failure is None and not old._stopping, "the node keeps running"
                assert old.stats["disk_full_refusals"] >= 1
                assert old.core.role is not Role.LEADER
                assert (await c.metadata(old.config.address)).node_id == old.id, "it still answers"
                # Its log is intact: every entry it holds is the group's.
                new = next(n for n in g.nodes.values() if n.core.role is Role.LEADER)
                held = old.log_store.last_index
                assert _bodies(old, held) == _bodies(new, held)

                _free(tmp_path, old.id)
                after = await _append_eventually(c, b"after")
                last = after.index
                await g.until(
                    lambda: all(n.metadata().commit_index >= last for n in g.nodes.values()),
                    what="every node, the one whose disk was full included, to catch up",
                )
                assert old.disk_full is None, "a successful append lifted the refusal"
                logs = {pid: _bodies(n, last) for pid, n in g.nodes.items()}
                assert len({tuple(v) for v in logs.values()}) == 1, "every node holds the same log"
                everything = logs[old.id]
                for r in [*before, *acked, after]:
                    body = g.nodes[new.id].log_store.entry(r.index).body
                    assert everything.count(body) == 1, "each acknowledged append is stored exactly once"
                for body in during:
                    assert everything.count(body) <= 1, "nothing is stored twice"

    asyncio.run(run())


def test_with_every_disk_full_writes_are_refused_and_nothing_is_lost(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, stores=_file_stores(tmp_path)) as g:
            await g.leader()
            async with AsyncDLedgerClient(g.addresses, timeout_s=2.0) as c:
                acked = [await c.append(b"kept %d" % i) for i in range(10)]
                # Acknowledged at a quorum: the third node may still be writing the last one.
                await g.until(
                    lambda: all(n.log_store.last_index == acked[-1].index for n in g.nodes.values()),
                    what="every node to hold every acknowledged append",
                )
                lasts = {pid: n.log_store.last_index for pid, n in g.nodes.items()}
                for pid in g.nodes:
                    _fill(tmp_path, pid)
                refused = 0
                for i in range(5):
                    try:
                        await c.append(b"refused %d" % i)
                    except (DLedgerError, grpc.RpcError):
                        refused += 1
                assert refused == 5, "no write can be stored anywhere, so none is acknowledged"
                await g.until(
                    lambda: all(n.disk_full is not None for n in g.nodes.values()),
                    what="every node to refuse writes",
                )
                assert all(n.failure is None for n in g.nodes.values()), "no node stopped"
                assert {pid: n.log_store.last_index for pid, n in g.nodes.items()} == lasts, "nothing written"
                for n in g.nodes.values():
                    assert (await c.metadata(n.config.address)).node_id == n.id

                for pid in g.nodes:
                    _free(tmp_path, pid)
                r = await _append_eventually(c, b"after space was freed", timeout_s=30)
                await g.until(
                    lambda: all(n.metadata().commit_index >= r.index for n in g.nodes.values()),
                    what="the group to commit again",
                )
                assert all(n.disk_full is None for n in g.nodes.values())
                for a in acked:
                    assert (await c.get(a.index)).body == b"kept %d" % acked.index(a)

    asyncio.run(run())
