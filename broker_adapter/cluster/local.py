"""A local cluster: name servers plus several broker groups on 127.0.0.1, described by files under one directory.

Layout (everything later commands need is on disk, so ``cluster status`` and ``cluster down`` work from another
shell)::

    DIR/cluster.json         the cluster: name, name servers (id, address), groups (names)
    DIR/ns<i>/nameserver.pid  a name server's pid; nameserver.log its output
    DIR/<group>/             one broker group, exactly as ``dledger group`` lays it out (dledger/group.py),
                             with ``[broker] nameservers`` and ``cluster`` in every node's config

A secure cluster (``secure=True``, ``cluster up --secure``) adds, from one CA (docs/cluster.md, "Security")::

    DIR/tls/ca.pem, ca.key   the cluster's CA; DIR/tls/ns<i>.pem/.key each name server's certificate
    DIR/admin.toml           the bootstrap admin, the same in every group and on every name server
    DIR/client.toml          what clients and the CLI use for the whole cluster (ca, access_key, secret_key)
    DIR/<group>/tls/         the group's node certificates, issued by the cluster's CA and naming their group

Across machines nothing here is needed: run ``dledger nameserver`` on a few hosts and give every broker node
the same ``[broker] nameservers`` list in its config (docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from broker_adapter.nameserver.client import NameServerClient
from dledger import group as grp
from dledger.errors import ConfigError, DLedgerError, UnavailableError
from dledger.security import certs
from dledger.security.bootstrap import write_secure_group
from dledger.security.config import ClientSecurity

MANIFEST = "cluster.json"


@dataclass(frozen=True, slots=True)
class NameServerSpec:
    id: str
    address: str
    dir: str
    consumer_expiry_ms: int = 10_000
    secure: bool = False  # TLS with DIR/tls/<id>.pem, and every call checked (nameserver/guard.py)

    @property
    def pid_file(self) -> Path:
        return Path(self.dir) / "nameserver.pid"

    def security_args(self) -> list[str]:
        """``dledger nameserver`` options of a secure cluster's name server (its files are under DIR)."""
        if not self.secure:
            return []
        base = Path(self.dir).parent
        tls_dir = base / "tls"
        return [
            *("--cert", str(tls_dir / f"{self.id}.pem"), "--key", str(tls_dir / f"{self.id}.key")),
            *("--ca", str(tls_dir / "ca.pem"), "--admin", str(base / "admin.toml")),
        ]


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    directory: str
    nameservers: tuple[NameServerSpec, ...]
    groups: tuple[str, ...]
    security: str = ""  # a secure cluster: its client settings file (DIR/client.toml)

    @property
    def nameserver_addresses(self) -> list[str]:
        return [n.address for n in self.nameservers]

    def client_security(self) -> ClientSecurity | None:
        """The cluster's client settings (CA, bootstrap admin), or None for a plain cluster."""
        return ClientSecurity.from_file(Path(self.security)) if self.security else None

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
    secure: bool = False,
    proxied: bool = False,
    preferred_leader: str | None = None,
) -> ClusterSpec:
    """Write the manifest, the name servers' directories and every group (a group per ``g<i>``). An existing
    cluster in ``directory`` is reused; asking for another shape is an error, not a silent surprise.
    ``secure``: TLS and authentication everywhere, every certificate from one CA (``_secure``). ``proxied``:
    each group's node-to-node traffic goes through proxy ports (``dledger.group.create``; ``dledger chaos
    --cluster`` listens there). ``preferred_leader``: each group's (``dledger.group.create``; ``"lowest"``: in
    each group, the node whose address sorts first)."""
    directory = directory.resolve()
    existing = load(directory, missing_ok=True)
    if existing is not None:
        if len(existing.groups) != groups or len(existing.nameservers) != nameservers:
            raise ConfigError(
                f"the cluster in {directory} has {len(existing.groups)} groups and {len(existing.nameservers)} "
                f"name servers: use another --dir (or `cluster down` and delete it) to change its shape"
            )
        if bool(existing.security) != secure:
            raise ConfigError(
                f"the cluster in {directory} is {'secure' if existing.security else 'not secure'}: use another "
                "--dir (or `cluster down` and delete it) to change that"
            )
        return existing
    if not 1 <= groups <= 16:
        raise ConfigError(f"--groups must be in 1..16, got {groups}")
    if not 1 <= nameservers <= 5:
        raise ConfigError(f"--nameservers must be in 1..5, got {nameservers}")
    grp.check_preferred_leader(preferred_leader, nodes)
    ns_ports = grp.free_ports(nameservers)
    ns = tuple(
        NameServerSpec(f"ns{i}", f"127.0.0.1:{p}", str(directory / f"ns{i}"), consumer_expiry_ms, secure)
        for i, p in enumerate(ns_ports)
    )
    addresses = ", ".join(f'"{n.address}"' for n in ns)
    names = tuple(f"g{i}" for i in range(groups))
    directory.mkdir(parents=True, exist_ok=True)
    for n in ns:
        Path(n.dir).mkdir(parents=True, exist_ok=True)
    security = str(_secure_cluster(directory, ns)) if secure else ""
    for gname in names:
        g = grp.create(
            directory / gname,
            nodes,
            None,
            name=gname,
            flush=flush,
            raft=raft,
            state_machine="broker",
            secure=secure,
            proxied=proxied,
            preferred_leader=preferred_leader,
        )
        if secure:
            _join_cluster_ca(directory, g)
        for spec in g.nodes:
            with open(spec.config, "a") as f:
                f.write(
                    f'\n[broker]\nnameservers = [{addresses}]\ncluster = "{name}"\n'
                    f"nameserver_heartbeat_ms = {heartbeat_ms}\n"
                )
    manifest = {
        "name": name,
        "nameservers": [
            {
                "id": n.id,
                "address": n.address,
                "dir": n.dir,
                "consumer_expiry_ms": n.consumer_expiry_ms,
                **({"secure": True} if n.secure else {}),
            }
            for n in ns
        ],
        "groups": list(names),
        **({"security": security} if security else {}),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return ClusterSpec(name, str(directory), ns, names, security)


def _secure_cluster(directory: Path, ns: tuple[NameServerSpec, ...]) -> Path:
    """The cluster's CA, bootstrap admin and client settings (``bootstrap.write_secure_group`` with no node: the
    same files ``group up --secure`` writes), and each name server's certificate; returns ``client.toml``."""
    client = write_secure_group(directory, [], [])
    ca = certs.load_or_make_ca(directory / "tls")
    for n in ns:
        host = n.address.rsplit(":", 1)[0]
        hosts = tuple(dict.fromkeys(("localhost", "127.0.0.1", host)))
        certs.write_issued(directory / "tls", n.id, certs.make_service_cert(ca, "nameserver", n.id, hosts))
    return client


def _join_cluster_ca(directory: Path, g: grp.GroupSpec) -> None:
    """Re-issue a secure group's files under the cluster's CA: node certificates that name their group too (one
    CA signs every group, and node ids repeat across groups), the cluster's CA as the group's, and the cluster's
    admin as its bootstrap admin (one set of client settings reaches every group). The group's own CA goes."""
    ca = certs.load_or_make_ca(directory / "tls")
    group_dir = directory / g.name
    tls_dir = group_dir / "tls"
    hosts = ("localhost", "127.0.0.1", certs.multi_address_authority(list(g.addresses)))
    for spec in g.nodes:
        certs.write_issued(tls_dir, spec.id, certs.make_node_cert(ca, spec.id, hosts, group=g.name))
    shutil.copyfile(directory / "tls" / "ca.pem", tls_dir / "ca.pem")
    (tls_dir / "ca.key").unlink(missing_ok=True)
    for name in ("admin.toml", "client.toml"):
        shutil.copy(directory / name, group_dir / name)  # keeps mode 0600


def issue_member_certificate(cluster: ClusterSpec, group: str, node_id: str) -> Path:
    """A certificate for a node about to join ``group`` of a secure cluster, from the cluster's CA and naming
    the group (``member add`` finds it in the group's ``tls/`` and uses it: docs/security.md, "Adding a node")."""
    directory = Path(cluster.directory)
    ca = certs.load_or_make_ca(directory / "tls")
    tls_dir = directory / group / "tls"
    addresses = list(cluster.group(group).addresses)
    hosts = ("localhost", "127.0.0.1", certs.multi_address_authority(addresses))
    return certs.write_issued(tls_dir, node_id, certs.make_node_cert(ca, node_id, hosts, group=group))


def load(directory: Path, missing_ok: bool = False) -> ClusterSpec | None:
    path = directory.resolve() / MANIFEST
    if not path.exists():
        if missing_ok:
            return None
        raise ConfigError(f"no cluster in {directory} (no {MANIFEST}): start one with `dledger cluster up`")
    try:
        raw = json.loads(path.read_text())
        ns = tuple(
            NameServerSpec(
                n["id"],
                n["address"],
                n["dir"],
                int(n.get("consumer_expiry_ms", 10_000)),
                bool(n.get("secure", False)),
            )
            for n in raw["nameservers"]
        )
        return ClusterSpec(
            raw["name"], str(directory.resolve()), ns, tuple(raw["groups"]), str(raw.get("security", ""))
        )
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
            *spec.security_args(),
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
    security = cluster.client_security()
    missing: set[str] = set(cluster.groups)
    while time.monotonic() < deadline:
        missing = set()
        for address in cluster.nameserver_addresses:
            try:
                with NameServerClient([address], timeout_s=1.0, security=security) as ns:
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
        with BrokerConnection(cluster.group(gname).addresses, security=cluster.client_security()) as conn:
            conn.create_topic(topic, queues_per_group)
    # Routable through every name server before this returns (each group registers a new topic at once).
    with NameServerClient(cluster.nameserver_addresses, security=cluster.client_security()) as ns:
        ns.wait_routable(topic, list(cluster.groups), queues_per_group)
