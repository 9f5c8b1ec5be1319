"""Benchmark: what snapshots buy at restart, and what the KV state machine costs over raw appends.

1. Restart time of a single KV node holding ``--entries`` 1 KiB puts (scaled down from the issue's 1 million;
   the figure scales linearly with the log replayed), measured twice from the same data: without a snapshot
   (the whole log is replayed into the KV store) and with one (the snapshot is loaded; the log was compacted).
   Restart = ``Node.start()`` until the applied index reaches the log's last index.
2. Put throughput through the full node stack (3 in-process nodes, real gRPC between them, file stores, flush
   "async"): ``Node.submit`` of KV puts (acknowledged once applied, with the state machine's result) against
   ``Node.append`` of raw 1 KiB bodies (acknowledged at commit) in the same run, same batching and concurrency.
3. Snapshot install of a ``--install-mb`` MB KV state (distinct 1 KiB values): a follower is stopped, the state
   is written, the leader snapshots (the time its event loop spends serializing is reported: that is a stall)
   and compacts; the follower restarts and the time until it has installed and applied the snapshot is taken.
   The baseline in the same run is writing that state's bytes to a file and fsyncing it.

    python -m bench.statemachine [--entries N] [--puts N] [--install-mb N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from dledger.core.config import RaftConfig
from dledger.group import free_ports
from dledger.nodeconfig import NodeConfig
from dledger.runtime.node import Node
from statemachine import kv

VALUE = bytes(range(256)) * 4  # 1 KiB
BATCH = 100
KEYS = (
    1000  # distinct keys: the state is ~1 MiB however long the log (a snapshot is of the state, not the log)
)
SEGMENT = 64 << 20


def _put(i: int) -> bytes:
    return kv.encode_put(f"key-{i % KEYS:08d}".encode(), VALUE)


def _config(data_dir: Path, peers: dict[str, str], node_id: str = "n0", **kw) -> NodeConfig:
    return NodeConfig(
        node_id,
        peers,
        data_dir,
        flush="async",
        raft=RaftConfig(segment_size=SEGMENT),
        state_machine="kv",
        **kw,
    )


async def _fill(data_dir: Path, entries: int) -> None:
    peers = {"n0": f"127.0.0.1:{free_ports(1)[0]}"}
    node = Node(
        _config(data_dir, peers, snapshot_entries=10**9, snapshot_bytes=1 << 60), rng=random.Random(1)
    )
    await node.start()
    try:
        while node.core.role.value != "leader":
            await asyncio.sleep(0.01)
        for i in range(0, entries, BATCH):
            await node.append([_put(k) for k in range(i, min(i + BATCH, entries))])
    finally:
        await node.stop()


async def _restart(data_dir: Path, snapshot: bool) -> float:
    peers = {"n0": f"127.0.0.1:{free_ports(1)[0]}"}
    node = Node(
        _config(data_dir, peers, snapshot_entries=10**9, snapshot_bytes=1 << 60), rng=random.Random(2)
    )
    t0 = time.perf_counter()
    await node.start()
    try:
        target = node.log_store.last_index
        deadline = time.monotonic() + 600
        while node.metadata().applied_index < target and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - t0
        if snapshot:
            info = await node.take_snapshot()
            assert info is not None or node.snapshots.infos(), "no snapshot taken"
        return elapsed
    finally:
        await node.stop()


async def _throughput(tmp: Path, puts: int) -> tuple[float, float]:
    ports = free_ports(3)
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    nodes = [Node(_config(tmp / pid, peers, pid), rng=random.Random(i)) for i, pid in enumerate(peers)]
    for n in nodes:
        await n.start()
    try:
        deadline = time.monotonic() + 30
        while not any(n.core.role.value == "leader" for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("no leader")
            await asyncio.sleep(0.01)
        leader = next(n for n in nodes if n.core.role.value == "leader")

        async def run(op, bodies_of) -> float:
            sem = asyncio.Semaphore(8)  # 8 batches in flight, as a pipelining client would keep

            async def one(i):
                async with sem:
                    await op(bodies_of(i))

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(0, puts, BATCH)))
            return puts / (time.perf_counter() - t0)

        raw = await run(leader.append, lambda i: [b"R" + VALUE for _ in range(BATCH)])
        put = await run(leader.submit, lambda i: [_put(k) for k in range(i, i + BATCH)])
        return raw, put
    finally:
        for n in nodes:
            await n.stop()


async def _install(tmp: Path, mb: int) -> tuple[float, float, int, float]:
    """(serialize s on the leader's loop, install s on the follower, snapshot bytes, write+fsync baseline s)."""
    ports = free_ports(3)
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}

    def make(i: int, pid: str) -> Node:
        return Node(
            _config(tmp / pid, peers, pid, snapshot_entries=10**9, snapshot_bytes=1 << 60),
            rng=random.Random(i),
        )

    nodes = {pid: make(i, pid) for i, pid in enumerate(peers)}
    for n in nodes.values():
        await n.start()
    try:
        deadline = time.monotonic() + 30
        while not any(n.core.role.value == "leader" for n in nodes.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("no leader")
            await asyncio.sleep(0.01)
        leader = next(n for n in nodes.values() if n.core.role.value == "leader")
        fid = next(pid for pid, n in nodes.items() if n is not leader)
        await nodes[fid].stop()
        count = mb * 1024
        sem = asyncio.Semaphore(8)

        async def one(i):
            async with sem:
                bodies = [
                    kv.encode_put(f"big-{k:09d}".encode(), VALUE) for k in range(i, min(i + BATCH, count))
                ]
                await leader.append(bodies)

        await asyncio.gather(*(one(i) for i in range(0, count, BATCH)))
        while leader.metadata().applied_index < leader.metadata().commit_index:
            await asyncio.sleep(0.01)
        before = leader.stats["snapshot_serialize_us"]
        info = await leader.take_snapshot()
        serialize = (leader.stats["snapshot_serialize_us"] - before) / 1e6
        t0 = time.perf_counter()
        with open(tmp / "baseline", "wb") as f:
            for chunk in leader.snapshots.chunks(info):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        baseline = time.perf_counter() - t0
        follower = make(9, fid)
        nodes[fid] = follower
        t0 = time.perf_counter()
        await follower.start()
        deadline = time.monotonic() + 300
        while follower.metadata().applied_index < info.index:
            if time.monotonic() > deadline:
                raise RuntimeError("the follower did not install the snapshot in 300 s")
            await asyncio.sleep(0.005)
        install = time.perf_counter() - t0
        if follower.stats["snapshots_installed"] < 1:
            raise RuntimeError(
                "the follower caught up from the log, not by snapshot: the measurement is void"
            )
        return serialize, install, info.size, baseline
    finally:
        for n in nodes.values():
            await n.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=50_000, help="log size for the restart figures")
    ap.add_argument("--puts", type=int, default=20_000, help="entries per throughput run")
    ap.add_argument("--install-mb", type=int, default=100, help="state size for the install figure (0: skip)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sm-"))
    try:
        base = tmp / "filled"
        asyncio.run(_fill(base, args.entries))
        plain, snap = tmp / "plain", tmp / "snap"
        shutil.copytree(base, plain)
        shutil.copytree(base, snap)
        asyncio.run(_restart(snap, snapshot=True))  # take the snapshot (and compact) once
        t_plain = min(asyncio.run(_restart(plain, snapshot=False)) for _ in range(2))
        t_snap = min(asyncio.run(_restart(snap, snapshot=False)) for _ in range(2))
        print(f"restart, {args.entries:,} x 1 KiB KV puts in the log:")
        print(f"  replay the whole log   {t_plain:8.3f} s")
        print(
            f"  snapshot + suffix      {t_snap:8.3f} s   ratio {t_snap / t_plain:.3f} (speed-up {t_plain / t_snap:.1f}x)"
        )
        print(f"  scaled to 1M entries: ~{t_plain * 1e6 / args.entries:.1f} s without a snapshot")
        raw, put = asyncio.run(_throughput(tmp / "tp", args.puts))
        print(f"throughput, 3 nodes in process, batches of {BATCH}, 8 in flight, {args.puts:,} entries:")
        print(f"  raw append (commit)    {raw:10,.0f} entries/s")
        print(f"  KV put (applied)       {put:10,.0f} entries/s   ratio {put / raw:.2f} (target >= 0.80)")
        if args.install_mb:
            ser, inst, size, base = asyncio.run(_install(tmp / "inst", args.install_mb))
            print(f"snapshot install, {size / 1e6:.0f} MB KV state, 3 nodes in process:")
            print(f"  leader serializes (event loop stalled)  {ser:7.3f} s")
            print(f"  follower restart -> installed, applied  {inst:7.3f} s")
            print(f"  baseline: write + fsync the same bytes   {base:7.3f} s   ratio {inst / base:.1f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
