"""The gRPC face of the built-in key-value store (``proto/dledger/v1/kv.proto``).

Writes become log entries (``statemachine.kv`` commands) through ``Node.submit``, so a put answers with the
state machine's own result (the previous value) once the leader applied it. Reads are linearizable by default
through the leader's read index (``Node.linearizable_read``): no log entry per read, one heartbeat round to
confirm leadership. A SERIALIZABLE read is served by any node from what it has applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from dledger.errors import DLedgerError, InvalidRequestError
from dledger.transport.grpc import abort_rpc, check_group
from dledger.v1 import kv_pb2, kv_pb2_grpc
from statemachine.kv import KVCommandError, KVStore, encode_cas, encode_delete, encode_put

SERVICE_NAME = kv_pb2.DESCRIPTOR.services_by_name["KV"].full_name


class KVServicer(kv_pb2_grpc.KVServicer):
    def __init__(self, node: Any, store: KVStore):
        self._node = node
        self._store = store

    async def _fail(self, context: grpc.aio.ServicerContext, err: DLedgerError) -> None:
        await abort_rpc(context, err, self._node.address_of)

    async def _write(self, context: grpc.aio.ServicerContext, group: str, command) -> tuple[int, Any]:
        """Submit one command; (index, state machine result). Bad keys are INVALID_ARGUMENT before the log."""
        await check_group(context, group, self._node.group)
        try:
            body = command()
        except KVCommandError as e:
            await self._fail(context, InvalidRequestError(str(e)))
        try:
            (outcome,) = await self._node.submit([body])
        except DLedgerError as e:
            await self._fail(context, e)
        if isinstance(outcome, BaseException):  # the state machine refused the entry (committed, no effect)
            await self._fail(
                context, InvalidRequestError(f"the key-value store refused the command: {outcome}")
            )
        return outcome.index, outcome.result

    async def Put(self, request, context):
        index, previous = await self._write(
            context, request.group, lambda: encode_put(request.key, request.value)
        )
        return kv_pb2.PutResponse(index=index, had_previous=previous is not None, previous=previous or b"")

    async def Delete(self, request, context):
        index, existed = await self._write(context, request.group, lambda: encode_delete(request.key))
        return kv_pb2.DeleteResponse(index=index, existed=bool(existed))

    async def CompareAndSwap(self, request, context):
        expected = None if request.expect_absent else request.expected
        index, swapped = await self._write(
            context, request.group, lambda: encode_cas(request.key, expected, request.value)
        )
        return kv_pb2.CompareAndSwapResponse(
            index=index,
            swapped=swapped.swapped,
            found=swapped.current is not None,
            current=swapped.current or b"",
        )

    async def Get(self, request, context):
        await check_group(context, request.group, self._node.group)
        if not request.key:
            await self._fail(context, InvalidRequestError("key is empty: give 1..65535 bytes"))
        try:
            if request.consistency == kv_pb2.SERIALIZABLE:
                value = self._store.get(request.key)
            else:
                value = await self._node.linearizable_read(lambda kv: kv.get(request.key))
        except DLedgerError as e:
            await self._fail(context, e)
        applied = self._node.metadata().applied_index
        return kv_pb2.KVGetResponse(found=value is not None, value=value or b"", applied_index=applied)


def attach(node: Any, server: grpc.aio.Server, store: KVStore) -> Sequence[str]:
    kv_pb2_grpc.add_KVServicer_to_server(KVServicer(node, store), server)
    return (SERVICE_NAME,)
