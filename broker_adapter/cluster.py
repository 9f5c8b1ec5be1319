"""A local cluster: name servers plus several broker groups on 127.0.0.1, described by files under one directory.

Layout (everything later commands need is on disk, so ``cluster status`` and ``cluster down`` work from another
shell)::

    DIR/cluster.json         the cluster: name, name servers (id, address), groups (names)
    DIR/ns<i>/nameserver.pid  a name server's pid; nameserver.log its output
    DIR/<group>/             one broker group, exactly as ``dledger group`` lays it out (dledger/group.py),
                             with ``[broker] nameservers`` and ``cluster`` in every node's config

Across machines nothing here is needed: run ``dledger nameserver`` on a few hosts and give every broker node
the same ``[broker] nameservers`` list in its config (docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from broker_adapter.nameserver.client import NameServerClient
from dledger import group as grp
from dledger.errors import ConfigError, DLedgerError, UnavailableError

MANIFEST = "cluster.json"


@dataclass(frozen=True, slots=True)
class NameServerSpec:
    id: str
    address: str
    dir: str
    consumer_expiry_ms: int = 10_000

    @property
    def pid_file(self) -> Path:
        return Path(self.dir) / "nameserver.pid"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    directory: str
    nameservers: tuple[NameServerSpec, ...]
    groups: tuple[str, ...]

    @property
    def nameserver_addresses(self) -> list[str]:
        return [n.address for n in self.nameservers]

    def group(self, name: str) -> grp.GroupSpec:
        g = grp.load(Path(self.directory) / name)
        assert g is not None
        return g


def create(
    directory: Path,
    groups: int = 2,
    nodes: int = 3,
    nameservers: int = 1,
    *,
    name: str = "DefaultCluster",
    flush: str = "sync",
    raft: dict[str, int] | None = None,
    heartbeat_ms: int = 1_000,
    consumer_expiry_ms: int = 10_000,
) -> ClusterSpec:
    """Write the manifest, the name servers' directories and every group (a group per ``g<i>``). An existing
    cluster in ``directory`` is reused; asking for another shape is an error, not a silent surprise."""
    directory = directory.resolve()
    existing = load(directory, missing_ok=True)
    if existing is not None:
        if len(existing.groups) != groups or len(existing.nameservers) != nameservers:
            raise ConfigError(
                f"the cluster in {directory} has {len(existing.groups)} groups and {len(existing.nameservers)} "
                f"name servers: use another --dir (or `cluster down` and delete it) to change its shape"
            )
        return existing
    if not 1 <= groups <= 16:
        raise ConfigError(f"--groups must be in 1..16, got {groups}")
    if not 1 <= nameservers <= 5:
        raise ConfigError(f"--nameservers must be in 1..5, got {nameservers}")
    ns_ports = grp.free_ports(nameservers)
    ns = tuple(
        NameServerSpec(f"ns{i}", f"127.0.0.1:{p}", str(directory / f"ns{i}"), consumer_expiry_ms)
        for i, p in enumerate(ns_ports)
    )
    addresses = ", ".join(f'"{n.address}"' for n in ns)
    names = tuple(f"g{i}" for i in range(groups))
    directory.mkdir(parents=True, exist_ok=True)
    for n in ns:
        Path(n.dir).mkdir(parents=True, exist_ok=True)
    for gname in names:
        g = grp.create(
            directory / gname, nodes, None, name=gname, flush=flush, raft=raft, state_machine="broker"
        )
        for spec in g.nodes:
            with open(spec.config, "a") as f:
                f.write(
                    f'\n[broker]\nnameservers = [{addresses}]\ncluster = "{name}"\n'
                    f"nameserver_heartbeat_ms = {heartbeat_ms}\n"
                )
    manifest = {
        "name": name,
        "nameservers": [
            {"id": n.id, "address": n.address, "dir": n.dir, "consumer_expiry_ms": n.consumer_expiry_ms}
            for n in ns
        ],
        "groups": list(names),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return ClusterSpec(name, str(directory), ns, names)


def load(directory: Path, missing_ok: bool = False) -> ClusterSpec | None:
    path = directory.resolve() / MANIFEST
    if not path.exists():
        if missing_ok:
            return None
        raise ConfigError(f"no cluster in {directory} (no {MANIFEST}): start one with `dledger cluster up`")
    try:
        raw = json.loads(path.read_text())
        ns = tuple(
            NameServerSpec(n["id"], n["address"], n["dir"], int(n.get("consumer_expiry_ms", 10_000)))
            for n in raw["nameservers"]
        )
        return ClusterSpec(raw["name"], str(directory.resolve()), ns, tuple(raw["groups"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} is not a cluster manifest: {err}") from None


def _nameserver_running(spec: NameServerSpec, pid: int | None = None) -> bool:
    """Whether ``pid`` (or the pid file's) is this name server: its command line names its listen address."""
    if pid is None:
        try:
            pid = int(spec.pid_file.read_text().strip())
        except (OSError, ValueError):
            return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"nameserver" in cmdline and spec.address.encode() in cmdline


def start_nameserver(spec: NameServerSpec) -> int:
    if _nameserver_running(spec):
        return int(spec.pid_file.read_text())
    pid = grp._spawn_detached(
        [
            sys.executable,
            "-m",
            "dledger",
            "nameserver",
            "--listen",
            spec.address,
            "--consumer-expiry-ms",
            str(spec.consumer_expiry_ms),
        ],
        Path(spec.dir) / "nameserver.log",
    )
    spec.pid_file.write_text(f"{pid}\n")
    return pid


def stop_nameserver(spec: NameServerSpec, timeout_s: float = 5.0) -> bool:
    if not _nameserver_running(spec):
        return False
    pid = int(spec.pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _nameserver_running(spec, pid) and time.monotonic() < deadline:
        grp._reap(pid)
        time.sleep(0.02)
    if _nameserver_running(spec, pid):
        os.kill(pid, signal.SIGKILL)
    grp._reap(pid)
    return True


def up(directory: Path, groups: int = 2, nodes: int = 3, nameservers: int = 1, **kwargs) -> ClusterSpec:
    """Create (or reuse) the cluster, start everything, return once every group has a leader registered."""
    cluster = create(directory, groups, nodes, nameservers, **kwargs)
    for n in cluster.nameservers:
        start_nameserver(n)
    for gname in cluster.groups:
        for spec in cluster.group(gname).nodes:
            grp.start_node(spec)
    try:
        for gname in cluster.groups:
            grp.wait_for_leader(cluster.group(gname))
        wait_registered(cluster)
    except DLedgerError:
        down(cluster)
        raise
    return cluster


def wait_registered(cluster: ClusterSpec, timeout_s: float = 20.0) -> None:
    """Until every name server lists a leader for every group."""
    deadline = time.monotonic() + timeout_s
    missing: set[str] = set(cluster.groups)
    while time.monotonic() < deadline:
        missing = set()
        for address in cluster.nameserver_addresses:
            try:
                with NameServerClient([address], timeout_s=1.0) as ns:
                    routes = {r.group: r for r in ns.route("")}
            except DLedgerError:
                missing.add(address)
                continue
            missing |= {
                f"{address}:{g}" for g in cluster.groups if not routes.get(g) or not routes[g].leader_address
            }
        if not missing:
            return
        time.sleep(0.1)
    raise UnavailableError(f"not registered with the name servers after {timeout_s:.0f} s: {sorted(missing)}")


def down(cluster: ClusterSpec) -> list[str]:
    """Stop every group's nodes, then the name servers; the names of what was running."""
    stopped = []
    for gname in cluster.groups:
        stopped += [f"{gname}/{n}" for n in grp.stop_group(cluster.group(gname))]
    for n in cluster.nameservers:
        if stop_nameserver(n):
            stopped.append(n.id)
    return stopped


def create_topic(cluster: ClusterSpec, topic: str, queues_per_group: int) -> None:
    """Create ``topic`` in every group (``queues_per_group`` queues each): a topic spans the cluster."""
    from broker_adapter.client import BrokerConnection

    for gname in cluster.groups:
        with BrokerConnection(cluster.group(gname).addresses) as conn:
            conn.create_topic(topic, queues_per_group)
