"""NATS JetStream for ``bench.jetstream``: Debian's ``nats-server`` as a 3-node cluster on 127.0.0.1 with one
R3 file stream, driven by the ``nats-py`` client.

``find_nats_server()`` returns the binary, installing Debian's ``nats-server`` package with ``apt-get`` when it
is missing and this process may (as ``bench.compare.etcd`` does for etcd); otherwise None and why.

The cluster: three ``nats-server`` processes with cluster routes on 127.0.0.1 free ports, JetStream on, store
dirs in the run's temp dir, all other settings NATS's defaults - in particular JetStream acknowledges a
publish once a majority has it, before any fsync (its file store syncs every 2 minutes by default). One stream,
``BENCH`` (subject ``bench``), file storage, 3 replicas.

Load client: nats-py (asyncio), one connection to the stream leader's server shared by all tasks;
``js.publish`` per message (a request that waits for the stream's ack). 64 concurrent senders are 64 tasks;
"batched" is 256 tasks, i.e. 256 publishes in flight. Consume: an ephemeral pull consumer (ack none, deliver
all) on the leader's server, fetching 1,024 at a time. Leader kill: the stream leader's server gets SIGKILL;
a warm client connected to it (the others in its reconnect list, 50 ms reconnect wait) publishes with a 0.5 s
timeout until a publish is acknowledged.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from bench.compare.base import ProcessRegistry, free_ports
from bench.debian import find_or_install
from bench.jetstream_load import BODY, Measured, Plan

STREAM = "BENCH"
SUBJECT = "bench"
PULL = 1024


def find_nats_server(install: bool = True) -> tuple[str | None, str]:
    """The path of ``nats-server`` (installing Debian's package if allowed), and a note on what happened."""
    return find_or_install(
        "nats-server", "nats-server", "NATS", install, ("/usr/sbin/nats-server", "/usr/bin/nats-server")
    )


def have_nats_py() -> bool:
    import importlib.util

    return importlib.util.find_spec("nats") is not None


async def _quiet(*_args) -> None:
    """nats-py prints every connection error by default; a killed server is expected here."""


def _connect(servers: list[str], **kw):
    import nats

    kw.setdefault("connect_timeout", 5)
    return nats.connect(servers=servers, error_cb=_quiet, disconnected_cb=_quiet, **kw)


def _conf(name: str, client: int, route: int, routes: list[int], store: Path) -> str:
    peers = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes if p != route)
    return (
        f'server_name: "{name}"\n'
        f"listen: 127.0.0.1:{client}\n"
        f'jetstream {{ store_dir: "{store}", max_memory_store: 268435456, max_file_store: 17179869184 }}\n'
        f'cluster {{ name: "bench", listen: 127.0.0.1:{route}, routes: [{peers}] }}\n'
    )


class NatsClient:
    """nats-py on the stream leader's server: one connection shared by the tasks, ``js.publish`` per message."""

    mode = "async"
    description = "nats-py (asyncio), one connection shared by the tasks, js.publish per message"
    batch_plan = Plan("batched", 256, 1)  # 256 publishes in flight

    def __init__(self, urls: list[str]):
        self._urls = urls
        self._nc = None
        self._js = None

    async def connect(self, workers: int) -> None:
        self._nc = await _connect(self._urls, dont_randomize=True)
        self._js = self._nc.jetstream(timeout=30)
        await self._js.publish(SUBJECT, BODY)

    async def send(self, worker: int, n: int) -> int:
        assert self._js is not None
        for _ in range(n):
            await self._js.publish(SUBJECT, BODY)
        return n

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None


class NatsCluster:
    """Three ``nats-server`` processes (names n0..n2), JetStream on, one R3 file stream."""

    name = "nats"
    durability = "majority in memory before the ack, fsync every 2 min (JetStream defaults)"

    def __init__(self, registry: ProcessRegistry, binary: str):
        self._registry = registry
        self._binary = binary
        self.kinds = ["nats-py"]
        self._urls: dict[str, str] = {}
        self._pids: dict[str, int] = {}

    def version(self) -> str:
        out = subprocess.run([self._binary, "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip() or "unknown"

    def start(self, workdir: Path) -> None:
        d = workdir / self.name
        d.mkdir(parents=True, exist_ok=True)
        ports = free_ports(6)
        clients, routes = ports[:3], ports[3:]
        for i in range(3):
            name = f"n{i}"
            conf = d / f"{name}.conf"
            conf.write_text(_conf(name, clients[i], routes[i], routes, d / name))
            proc = self._registry.spawn([self._binary, "-c", str(conf)], d / f"{name}.log")
            self._pids[name] = proc.pid
            self._urls[name] = f"nats://127.0.0.1:{clients[i]}"
        asyncio.run(self._create_stream())

    async def _create_stream(self) -> None:
        from nats.js.api import StorageType, StreamConfig

        deadline = time.monotonic() + 60
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                nc = await _connect(list(self._urls.values()), connect_timeout=1)
                try:
                    js = nc.jetstream(timeout=5)
                    cfg = StreamConfig(
                        name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, num_replicas=3
                    )
                    await js.add_stream(cfg)
                    await self._wait_replicas(js)
                    return
                finally:
                    await nc.close()
            except Exception as e:  # the cluster is still forming (no JetStream meta leader yet)
                last = e
                await asyncio.sleep(0.2)
        raise TimeoutError(f"nats: stream {STREAM} with 3 current replicas not ready in 60 s ({last!r})")

    async def _wait_replicas(self, js) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = await js.stream_info(STREAM)
            c = info.cluster
            if c and c.leader and len(c.replicas or []) == 2 and all(p.current for p in c.replicas):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError("nats: the stream's replicas did not become current")

    async def _leader(self) -> str:
        nc = await _connect([u for n, u in self._urls.items() if n in self._pids])
        try:
            info = await nc.jetstream(timeout=5).stream_info(STREAM)
            assert info.cluster is not None and info.cluster.leader
            return info.cluster.leader
        finally:
            await nc.close()

    def _urls_from(self, first: str) -> list[str]:
        return [self._urls[first]] + [u for n, u in self._urls.items() if n != first]

    def stop(self) -> None:
        pids = list(self._pids.values())
        for pid in pids:
            self._registry.stop(pid)
        self._pids.clear()

    def describe(self, kind: str) -> str:
        return NatsClient.description

    def client(self, kind: str) -> NatsClient:
        if kind != "nats-py":
            raise ValueError(f"nats has one client kind, nats-py (not {kind!r})")
        return NatsClient(self._urls_from(asyncio.run(self._leader())))

    def consume(self, seconds: float) -> Measured:
        return asyncio.run(self._consume(seconds))

    async def _consume(self, seconds: float) -> Measured:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        leader = await self._leader()
        nc = await _connect([self._urls[leader]])
        out = Measured()
        try:
            js = nc.jetstream(timeout=10)
            total = (await js.stream_info(STREAM)).state.messages
            cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
            sub = await js.pull_subscribe(SUBJECT, stream=STREAM, config=cfg)
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while out.messages < total and time.perf_counter() < deadline:
                t1 = time.perf_counter()
                try:
                    msgs = await sub.fetch(min(PULL, total - out.messages), timeout=1.0)
                except TimeoutError:  # nothing (more) to fetch
                    break
                out.latencies_s.append(time.perf_counter() - t1)
                out.messages += len(msgs)
            out.seconds = time.perf_counter() - t0
            await sub.unsubscribe()
        finally:
            await nc.close()
        return out

    def leader_kill(self, timeout_s: float) -> tuple[str, float]:
        return asyncio.run(self._leader_kill(timeout_s))

    async def _leader_kill(self, timeout_s: float) -> tuple[str, float]:
        leader = await self._leader()
        nc = await _connect(
            self._urls_from(leader),
            dont_randomize=True,
            reconnect_time_wait=0.05,
            max_reconnect_attempts=-1,
            connect_timeout=1,
        )
        try:
            js = nc.jetstream(timeout=0.5)
            for _ in range(3):
                await js.publish(SUBJECT, BODY)
            t_kill = time.perf_counter()
            self._registry.kill(self._pids.pop(leader))
            last: BaseException | None = None
            failed = 0
            while time.perf_counter() - t_kill < timeout_s:
                try:
                    await js.publish(SUBJECT, BODY, timeout=0.5)
                    ms = (time.perf_counter() - t_kill) * 1000
                    return (
                        f"killed {leader}; {failed} failed publishes before (last {type(last).__name__})",
                        ms,
                    )
                except Exception as e:  # timeout, no responders, reconnecting: try again
                    last = e
                    failed += 1
                    await asyncio.sleep(0.005)
            raise TimeoutError(f"nats: no acknowledged publish within {timeout_s} s of the kill ({last!r})")
        finally:
            await nc.close()
