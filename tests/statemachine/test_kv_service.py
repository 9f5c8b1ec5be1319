"""The KV service over real gRPC on an in-process three-node group running the "kv" plugin."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dledger.errors import InvalidRequestError, NotLeaderError
from dledger.kv.client import AsyncKVClient
from dledger.v1 import kv_pb2, kv_pb2_grpc
from statemachine.kv import KVStore, Swapped, encode_cas
from tests.runtime.cluster import LocalGroup


def test_put_get_delete_cas_and_read_consistency(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, state_machine_plugin="kv") as g:
            leader = await g.leader()
            followers = [n for n in g.nodes.values() if n is not leader]
            async with AsyncKVClient(g.addresses) as kv:
                w1 = await kv.put(b"k", b"v1")
                assert w1.previous is None
                w2 = await kv.put(b"k", b"v2")
                assert w2.previous == b"v1" and w2.index > w1.index
                r = await kv.get(b"k")
                assert r.value == b"v2" and r.applied_index >= w2.index
                assert (await kv.get(b"missing")).value is None

                lost = await kv.compare_and_swap(b"k", b"v1", b"v3")
                assert not lost.swapped and lost.current == b"v2"
                won = await kv.compare_and_swap(b"k", b"v2", b"v3")
                assert won.swapped and won.current == b"v3"
                fresh = await kv.compare_and_swap(b"new", None, b"x")
                assert fresh.swapped
                assert not (await kv.compare_and_swap(b"new", None, b"y")).swapped

                assert (await kv.delete(b"k")).existed
                assert not (await kv.delete(b"k")).existed
                assert (await kv.get(b"k")).value is None

                # A linearizable read asked of a follower is redirected to the leader by the client ...
                top = (await kv.put(b"r", b"1")).index
                f = followers[0]
                assert (await kv.get(b"r")).value == b"1"
                with pytest.raises(NotLeaderError):
                    await kv.get(b"r", address=f.config.address)
                # ... while a serializable read is served by the follower from what it applied.
                await g.until(lambda: f.metadata().applied_index >= top, what="follower applied")
                stale_ok = await kv.get(b"r", linearizable=False, address=f.config.address)
                assert stale_ok.value == b"1" and stale_ok.applied_index >= top

    asyncio.run(run())


def test_bad_requests_get_clear_statuses(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, state_machine_plugin="kv") as g:
            leader = await g.leader()
            async with AsyncKVClient(g.addresses) as kv:
                with pytest.raises(InvalidRequestError, match="key must be"):
                    await kv.put(b"", b"v")
                with pytest.raises(InvalidRequestError, match="key is empty"):
                    await kv.get(b"")
                with pytest.raises(InvalidRequestError, match="key must be"):
                    await kv.put(b"k" * 70000, b"v")
            async with grpc.aio.insecure_channel(leader.config.address) as ch:
                stub = kv_pb2_grpc.KVStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Put(kv_pb2.PutRequest(group="other", key=b"k", value=b"v"))
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "unknown group 'other'" in e.value.details()
            follower = next(n for n in g.nodes.values() if n is not leader)
            async with grpc.aio.insecure_channel(follower.config.address) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await kv_pb2_grpc.KVStub(ch).Put(kv_pb2.PutRequest(key=b"k", value=b"v"))
                assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
                md = dict(e.value.trailing_metadata())
                assert md.get("leader-address") == leader.config.address
            # Nothing bad was written: the only entries are the leader's no-op(s).
            assert all(len(n.plugin.state_machine) == 0 for n in g.nodes.values())

    asyncio.run(run())


def test_cas_command_round_trip_and_malformed():
    kv = KVStore()

    class E:
        def __init__(self, body):
            self.body = body

    out = kv.apply([E(encode_cas(b"a", None, b"1")), E(encode_cas(b"a", b"2", b"3")), E(b"C\x00\x01a\x00")])
    assert out[0] == Swapped(True, b"1")
    assert out[1] == Swapped(False, b"1")
    assert isinstance(out[2], ValueError) and "expected-value length" in str(out[2])
    assert kv.get(b"a") == b"1"
