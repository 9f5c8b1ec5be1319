"""A paused old leader that wakes must not acknowledge writes in its stale term.

The leader is SIGSTOPped until another node leads; a write goes through the new leader; an append is sent to
the old leader's own address (raw gRPC, no redirects: pinned) while it is still stopped, and then it is resumed.
That append must fail (FAILED_PRECONDITION / UNAVAILABLE / outcome unknown), never succeed, and its body must
not be in the committed log of any node, while the write through the new leader is in every node's log."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import grpc
import pytest

from dledger import group as grp
from dledger.chaos.nemesis import wait_converged
from dledger.chaos.runner import RAFT
from dledger.client import DLedgerClient
from dledger.v1 import client_pb2, client_pb2_grpc

pytestmark = pytest.mark.integration


def _bodies(address: str, group: str, last: int) -> set[bytes]:
    with grpc.insecure_channel(address) as ch:
        stub = client_pb2_grpc.DLedgerStub(ch)
        out = set()
        for i in range(last + 1):
            r = stub.Get(client_pb2.GetRequest(group=group, index=i), timeout=5)
            out.add(r.body)
        return out


def test_paused_old_leader_does_not_acknowledge_in_a_stale_term(tmp_path):
    g = grp.create(tmp_path / "g", 3, base_port=None, raft=dict(RAFT))
    try:
        for spec in g.nodes:
            grp.start_node(spec)
        old = grp.wait_for_leader(g, 30)
        with DLedgerClient(g.addresses, g.name) as c:
            c.append(b"before")
        old_spec = g.node(old.id)
        assert grp.signal_node(old_spec, signal.SIGSTOP) is not None
        new = grp.wait_for_leader(g, 30, exclude=old.id)
        assert new.term > old.term
        with DLedgerClient([n.address for n in g.nodes if n.id != old.id], g.name) as c:
            after = c.append(b"after-new-leader")
        assert after.term == new.term

        with grpc.insecure_channel(old_spec.address) as ch, concurrent.futures.ThreadPoolExecutor(1) as pool:
            stub = client_pb2_grpc.DLedgerStub(ch)
            req = client_pb2.AppendRequest(group=g.name, bodies=[b"stale-write"])
            fut = pool.submit(stub.Append, req, timeout=10)
            # the request is in the stopped process's socket buffer before it wakes
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not fut.running():
                time.sleep(0.01)
            grp.signal_node(old_spec, signal.SIGCONT)
            try:
                r = fut.result(timeout=20)
            except grpc.RpcError as e:
                assert e.code() in (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ), e
            else:
                pytest.fail(
                    f"the woken old leader acknowledged a write: index {r.first_index}, term {r.term}"
                )

        rows = wait_converged(g, 30)
        last = rows[0].commit_index
        for spec in g.nodes:
            bodies = _bodies(spec.address, g.name, last)
            assert b"after-new-leader" in bodies and b"before" in bodies, spec.id
            assert b"stale-write" not in bodies, f"{spec.id} committed the stale leader's write"
    finally:
        for spec in g.nodes:
            grp.signal_node(spec, signal.SIGCONT)
        grp.stop_group(g)
