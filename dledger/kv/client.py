"""Client of the key-value service (``dledger.v1.KV``) of a group running ``state_machine = "kv"``.

It rides on ``AsyncDLedgerClient`` (leader discovery, not-leader redirects, bounded retries), and reports the
outcome of writes honestly: a put whose call broke after it may have reached the leader raises
``OutcomeUnknownError`` (it may or may not have been applied) rather than being retried behind the caller's back,
which is what a linearizability checker needs to know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dledger.client import AsyncDLedgerClient
from dledger.v1 import kv_pb2, kv_pb2_grpc


@dataclass(frozen=True, slots=True)
class KVRead:
    value: bytes | None  # None: the key does not exist
    applied_index: int


@dataclass(frozen=True, slots=True)
class KVWrite:
    index: int  # the log entry that carried the write
    previous: bytes | None = None  # put: the value it replaced
    existed: bool = False  # delete: whether the key existed
    swapped: bool = False  # compare-and-swap: whether it took effect
    current: bytes | None = None  # compare-and-swap: the value after the command


class AsyncKVClient:
    def __init__(self, addresses: Sequence[str], group: str = "", **kwargs):
        self._c = AsyncDLedgerClient(addresses, group, **kwargs)
        self.group = group

    async def _write(self, fn):
        return await self._c.call(fn, stub_type=kv_pb2_grpc.KVStub, write=True)

    async def put(self, key: bytes, value: bytes) -> KVWrite:
        r = await self._write(
            lambda s: s.Put(
                kv_pb2.PutRequest(group=self.group, key=key, value=value), timeout=self._c.rpc_timeout_s
            )
        )
        return KVWrite(r.index, previous=r.previous if r.had_previous else None)

    async def delete(self, key: bytes) -> KVWrite:
        r = await self._write(
            lambda s: s.Delete(kv_pb2.DeleteRequest(group=self.group, key=key), timeout=self._c.rpc_timeout_s)
        )
        return KVWrite(r.index, existed=r.existed)

    async def compare_and_swap(self, key: bytes, expected: bytes | None, value: bytes) -> KVWrite:
        """Set ``key`` to ``value`` if it holds ``expected`` now (None: if it does not exist)."""
        req = kv_pb2.CompareAndSwapRequest(
            group=self.group, key=key, expected=expected or b"", expect_absent=expected is None, value=value
        )
        r = await self._write(lambda s: s.CompareAndSwap(req, timeout=self._c.rpc_timeout_s))
        return KVWrite(r.index, swapped=r.swapped, current=r.current if r.found else None)

    async def get(self, key: bytes, *, linearizable: bool = True, address: str | None = None) -> KVRead:
        """A linearizable read (through the leader's read index), or with ``linearizable=False`` this node's
        applied state (``address``, else any node: possibly stale)."""
        consistency = kv_pb2.LINEARIZABLE if linearizable else kv_pb2.SERIALIZABLE
        req = kv_pb2.KVGetRequest(group=self.group, key=key, consistency=consistency)
        r = await self._c.call(
            lambda s: s.Get(req, timeout=self._c.rpc_timeout_s),
            stub_type=kv_pb2_grpc.KVStub,
            write=False,
            address=address,
        )
        return KVRead(r.value if r.found else None, r.applied_index)

    async def close(self) -> None:
        await self._c.close()

    async def __aenter__(self) -> AsyncKVClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
