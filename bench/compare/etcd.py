"""A 3-member etcd cluster for the comparison (Debian's ``etcd-server``, etcd 3.4), driven over its gRPC API.

``find_etcd()`` returns the ``etcd`` binary, installing Debian's ``etcd-server`` package with
``apt-get install -y`` when it is missing and this process may (root, apt-get present); otherwise it returns
None and says why, and the run goes on without etcd.

The cluster: three ``etcd`` processes on 127.0.0.1 free ports, data dirs in the run's temp dir, with
``--heartbeat-interval=50 --election-timeout=300`` (issue 8's comparable timing) and etcd's default
durability: the WAL is fsynced before a write is acknowledged. The backend quota is raised to 8 GiB so a
long run cannot trip etcd's 2 GiB space alarm.

Load client: etcd's own gRPC API (``etcdserverpb.KV/Put``, ``KV/Txn``) through grpc.aio, the same grpcio our
client uses, one channel per member and one unary call per write (etcd's Go client also multiplexes unary
calls over one HTTP/2 connection). The message classes come from ``etcd_kv.proto`` (the subset of etcd's API
used here), compiled with grpcio-tools into a temp dir at run time. The batched path is one transaction of
100 puts (etcd allows 128 operations per transaction by default).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.compare.base import LeaderView, ProcessRegistry, free_ports, poll_until
from bench.debian import find_or_install

PROTO = Path(__file__).with_name("etcd_kv.proto")


def find_etcd(install: bool = True) -> tuple[str | None, str]:
    """The path of the ``etcd`` binary (installing ``etcd-server`` if allowed), and a note on what happened."""
    return find_or_install("etcd", "etcd-server", "etcd", install)


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.splitlines()[0].split(":", 1)[-1].strip() if out else "unknown"


def load_messages(tmpdir: Path):
    """Compile ``etcd_kv.proto`` into ``tmpdir`` and import the generated message module."""
    from grpc_tools import protoc

    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={tmpdir}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    spec = importlib.util.spec_from_file_location("etcd_kv_pb2", tmpdir / "etcd_kv_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Member:
    """One member's channel and the three calls the benchmark makes."""

    def __init__(self, pb, address: str):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address)
        self.put = self.channel.unary_unary(
            "/etcdserverpb.KV/Put",
            request_serializer=pb.PutRequest.SerializeToString,
            response_deserializer=pb.PutResponse.FromString,
        )
        self.txn = self.channel.unary_unary(
            "/etcdserverpb.KV/Txn",
            request_serializer=pb.TxnRequest.SerializeToString,
            response_deserializer=pb.TxnResponse.FromString,
        )
        self.status = self.channel.unary_unary(
            "/etcdserverpb.Maintenance/Status",
            request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusResponse.FromString,
        )

    async def close(self) -> None:
        await self.channel.close()


class _EtcdLoad:
    """Puts to the leader for throughput; a failover client sends each put to the next member in turn (a
    follower forwards it to the leader), so no write waits on a member it cannot know is dead."""

    def __init__(self, pb, addresses: list[str], first: int, rotate: bool, timeout_s: float):
        self._pb = pb
        self._members = [_Member(pb, a) for a in addresses]
        self._i = first
        self._rotate = rotate
        self._timeout = timeout_s
        self._keys = itertools.count()

    def _member(self) -> _Member:
        m = self._members[self._i % len(self._members)]
        if self._rotate:
            self._i += 1
        return m

    def _key(self) -> bytes:
        return b"compare/%d" % (next(self._keys) % 1000)

    async def put(self, value: bytes) -> None:
        await self._member().put(self._pb.PutRequest(key=self._key(), value=value), timeout=self._timeout)

    async def put_batch(self, values: list[bytes]) -> None:
        pb = self._pb
        ops = [pb.RequestOp(request_put=pb.PutRequest(key=self._key(), value=v)) for v in values]
        resp = await self._member().txn(pb.TxnRequest(success=ops), timeout=self._timeout)
        if not resp.succeeded:
            raise RuntimeError("etcd transaction did not succeed")

    async def close(self) -> None:
        for m in self._members:
            await m.close()


class EtcdSystem:
    name = "etcd"
    durability = "fsync before ack (etcd WAL)"
    client_kind = "grpc.aio unary KV.Put / KV.Txn on one channel per member (etcd's gRPC API)"
    batch_size = 100
    batch_path = "KV.Txn with 100 puts"

    def __init__(self, registry: ProcessRegistry, binary: str):
        self._registry = registry
        self._binary = binary
        self.version = etcd_version(binary)
        self._proto_dir = Path(tempfile.mkdtemp(prefix="etcd-proto-"))
        self._pb = load_messages(self._proto_dir)
        self._members: dict[str, dict] = {}  # name -> {"client", "argv", "pid", "id"}
        self._status: dict[str, _Member] = {}
        self._workdir: Path | None = None

    async def start(self, workdir: Path) -> None:
        self._workdir = workdir / self.name
        self._workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(6)
        names = [f"e{i}" for i in range(3)]
        peer = {n: f"http://127.0.0.1:{ports[i]}" for i, n in enumerate(names)}
        cluster = ",".join(f"{n}={u}" for n, u in peer.items())
        token = f"compare-{os.getpid()}-{time.monotonic_ns()}"
        for i, n in enumerate(names):
            client = f"127.0.0.1:{ports[3 + i]}"
            argv = [
                self._binary,
                f"--name={n}",
                f"--data-dir={self._workdir / n}",
                f"--listen-client-urls=http://{client}",
                f"--advertise-client-urls=http://{client}",
                f"--listen-peer-urls={peer[n]}",
                f"--initial-advertise-peer-urls={peer[n]}",
                f"--initial-cluster={cluster}",
                f"--initial-cluster-token={token}",
                "--initial-cluster-state=new",
                "--heartbeat-interval=50",
                "--election-timeout=300",
                "--quota-backend-bytes=8589934592",
                "--logger=zap",
                "--log-level=warn",
            ]
            self._members[n] = {"client": client, "argv": argv, "pid": None, "id": None}
            self._spawn(n)
        await poll_until(self._agreed_leader, 30, "etcd: one leader all members agree on")

    def _spawn(self, name: str) -> None:
        assert self._workdir is not None
        m = self._members[name]
        m["pid"] = self._registry.spawn(m["argv"], self._workdir / f"{name}.log").pid

    async def _statuses(self) -> dict[str, object]:
        async def one(name: str):
            m = self._members[name]
            if m["pid"] is None or not self._registry.alive(m["pid"]):
                return name, None
            ch = self._status.get(name)
            if ch is None:
                ch = self._status[name] = _Member(self._pb, m["client"])
            try:
                st = await ch.status(self._pb.StatusRequest(), timeout=0.5)
            except grpc.aio.AioRpcError:
                return name, None
            m["id"] = st.header.member_id
            return name, st

        pairs = await asyncio.gather(*(one(n) for n in self._members))
        return {n: st for n, st in pairs if st is not None}

    def _name_of(self, member_id: int) -> str | None:
        return next((n for n, m in self._members.items() if m["id"] == member_id and member_id), None)

    async def _agreed_leader(self) -> str | None:
        sts = await self._statuses()
        leaders = {st.leader for st in sts.values()}
        if len(sts) == len(self._members) and len(leaders) == 1:
            return self._name_of(leaders.pop())
        return None

    async def leader(self) -> LeaderView | None:
        sts = await self._statuses()
        best = None
        for st in sts.values():
            name = self._name_of(st.leader)
            if name is not None and name in sts and (best is None or st.raftTerm > best.term):
                best = LeaderView(name, st.raftTerm)
        return best

    async def leader_pid(self) -> int | None:
        view = await self.leader()
        return self._members[view.leader]["pid"] if view else None

    async def client(self, *, failover: bool = False):
        view = await poll_until(self.leader, 15, "etcd: a leader")
        addresses = [m["client"] for m in self._members.values()]
        first = list(self._members).index(view.leader)
        return _EtcdLoad(self._pb, addresses, first, rotate=failover, timeout_s=1.0 if failover else 10.0)

    async def kill_leader(self) -> tuple[str, float]:
        view = await poll_until(self.leader, 15, "etcd: a leader")
        m = self._members[view.leader]
        t_kill = time.monotonic()
        self._registry.kill(m["pid"])
        m["pid"] = None
        return view.leader, t_kill

    async def restart(self, member: str) -> None:
        self._spawn(member)  # same flags: etcd rejoins from its data dir and ignores the --initial-* ones

        async def caught_up() -> bool:
            sts = await self._statuses()
            mine = sts.get(member)
            lead = sts.get(self._name_of(mine.leader) or "") if mine else None
            return bool(lead and mine and mine.raftAppliedIndex >= lead.raftIndex)

        await poll_until(caught_up, 30, f"etcd: {member} caught up", interval_s=0.05)

    async def stop(self) -> None:
        for ch in self._status.values():
            await ch.close()
        self._status.clear()
        pids = [m["pid"] for m in self._members.values() if m["pid"] is not None]
        await asyncio.gather(*(asyncio.to_thread(self._registry.stop, pid) for pid in pids))
        for m in self._members.values():
            m["pid"] = None

    def cleanup(self) -> None:
        shutil.rmtree(self._proto_dir, ignore_errors=True)


if __name__ == "__main__":  # python -m bench.compare.etcd: find (or install) etcd and say what happened
    print(find_etcd()[1])
    sys.exit(0)
