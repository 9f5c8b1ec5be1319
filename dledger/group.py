"""A local group: N separate node processes on 127.0.0.1, described by files under one directory.

Layout of a group directory (everything a later command needs is on disk, so ``group down`` and
``kill-leader`` work from another shell)::

    DIR/group.json          the group: name, flush policy, nodes (id, address, data_dir, config file)
    DIR/<id>/node.toml      the node's config (``dledger node --config DIR/<id>/node.toml``)
    DIR/<id>/node.pid       pid of the running node process
    DIR/<id>/node.log       its stdout/stderr
    DIR/<id>/data, index/, meta/   the node's storage

A process is only ever signalled by the pid in its pid file, and only after checking that the process with
that pid is the node started for this directory (its command line names the node's config file).

Membership (docs/membership.md): ``add_member`` starts a new node on a new directory and port as a learner
(``join = true`` in its node.toml) and records it in group.json; ``promote_member``/``remove_member`` change its
role through the leader; ``replace_node`` does the three in a row for a dead node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from dledger import owner
from dledger.errors import ConfigError, DLedgerError, OutcomeUnknownError, UnavailableError
from dledger.ports import free_ports as free_ports  # (re-exported: callers take ports as ``grp.free_ports``)
from dledger.transport.base import NodeInfo
from dledger.transport.grpc import run_sync

DEFAULT_BASE_PORT = 20911
# ``create(preferred_leader=LOWEST)``: the node whose client address sorts first (the official RocketMQ Python
# client sorts a route's addresses as strings and dials the first).
LOWEST: Final = "lowest"
MANIFEST = "group.json"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    id: str
    address: str
    data_dir: str
    config: str


@dataclass(frozen=True, slots=True)
class GroupSpec:
    name: str
    flush: str
    nodes: tuple[NodeSpec, ...]
    state_machine: str = ""  # node plugin (dledger.plugins), e.g. "broker"
    # Proxied groups only (``create(..., proxied=True)``): (src, dst, port) for every ordered pair; node src
    # reaches dst through 127.0.0.1:port, where a fault-injecting proxy (dledger.chaos.proxy) must listen.
    links: tuple[tuple[str, str, int], ...] = ()
    # A secure group (``create(..., secure=True)``): the client settings file (CA, admin's keys) its commands use.
    security: str = ""

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    def node(self, node_id: str) -> NodeSpec:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(f"no node {node_id!r} in this group ({', '.join(n.id for n in self.nodes)})")


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One row of ``group status``: the JSON field names are fixed (scripts and tests read them)."""

    id: str
    address: str
    pid: int | None
    role: str  # "leader", "follower", "candidate", or "down"
    term: int | None
    last_index: int | None
    commit_index: int | None
    data_dir: str
    # Last index the node's state machine applied (its commit index when it runs none): the gap to
    # commit_index is the apply lag. Last, so positional construction written before it still works.
    applied_index: int | None = None
    # "voter", "learner" or "" (not in the configuration), as the leader (else the node itself) sees it.
    member: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _peer_addresses(spec: NodeSpec, group: GroupSpec) -> dict[str, str]:
    """The [peers] of ``spec``'s config: the nodes' own addresses, or for a proxied group the proxy port that
    carries this node's traffic to each other node (its own entry stays its real, listening address)."""
    via = {dst: f"127.0.0.1:{port}" for src, dst, port in group.links if src == spec.id}
    return {n.id: via.get(n.id, n.address) if n.id != spec.id else n.address for n in group.nodes}


def _node_toml(spec: NodeSpec, group: GroupSpec, raft: Mapping[str, int | str], join: bool = False) -> str:
    lines = [
        f'id = "{spec.id}"',
        f'group = "{group.name}"',
        f'data_dir = "{spec.data_dir}"',
        f'flush = "{group.flush}"',
        *([f'state_machine = "{group.state_machine}"'] if group.state_machine else []),
        *(["join = true"] if join else []),
        "",
        "[peers]",
        *[f'{pid} = "{addr}"' for pid, addr in _peer_addresses(spec, group).items()],
    ]
    if raft:  # (a string is a node id: json's quoting is TOML's)
        lines += [
            "",
            "[raft]",
            *[f"{k} = {json.dumps(v) if isinstance(v, str) else v}" for k, v in raft.items()],
        ]
    if group.security:
        tls_dir = Path(group.security).parent / "tls"
        lines += [
            "",
            "[security]",
            f'cert = "{tls_dir / spec.id}.pem"',
            f'key = "{tls_dir / spec.id}.key"',
            f'ca = "{tls_dir / "ca.pem"}"',
            f'admin = "{Path(group.security).parent / "admin.toml"}"',
        ]
    return "\n".join(lines) + "\n"


def create(
    directory: Path,
    nodes: int | None = None,
    base_port: int | None = DEFAULT_BASE_PORT,
    *,
    name: str = "dledger",
    flush: str = "sync",
    raft: dict[str, int] | None = None,
    state_machine: str = "",
    proxied: bool = False,
    secure: bool = False,
    preferred_leader: str | None = None,
) -> GroupSpec:
    """Write the manifest and node configs (default 3 nodes). An existing group in ``directory`` is reused as
    it is; asking for a different size is an error rather than a silent surprise.

    ``preferred_leader``: a node id written as every node's ``[raft] preferred_leader`` (DLedger's
    preferredLeaderIds: leadership returns to it whenever it is healthy, docs/raft.md), or ``"lowest"``: the
    node whose client address sorts first as a string, the one the official RocketMQ Python client dials
    (docs/rocketmq.md, "Endpoints").

    ``proxied=True`` routes node-to-node traffic through one proxy port per ordered pair (``GroupSpec.links``,
    also in group.json); the nodes cannot reach each other until something listens there
    (``dledger.chaos.proxy.Network``). Clients still use the nodes' own addresses."""
    directory = directory.resolve()
    existing = load(directory, missing_ok=True)
    if existing is not None:
        if nodes is not None and nodes != len(existing.nodes):
            raise ConfigError(
                f"the group in {directory} has {len(existing.nodes)} nodes, not {nodes}: "
                "use another --dir (or `group down` and delete it) to change its size"
            )
        return existing
    nodes = 3 if nodes is None else nodes
    if not 1 <= nodes <= 9:
        raise ConfigError(f"--nodes must be in 1..9, got {nodes}")
    check_preferred_leader(preferred_leader, nodes)
    ports = free_ports(nodes) if base_port is None else [base_port + i for i in range(nodes)]
    specs = tuple(
        NodeSpec(
            id=f"n{i}",
            address=f"127.0.0.1:{port}",
            data_dir=str(directory / f"n{i}"),
            config=str(directory / f"n{i}" / "node.toml"),
        )
        for i, port in enumerate(ports)
    )
    links: tuple[tuple[str, str, int], ...] = ()
    if proxied:
        pairs = [(a.id, b.id) for a in specs for b in specs if a.id != b.id]
        link_ports = free_ports(len(pairs) + nodes)
        link_ports = [p for p in link_ports if p not in ports][: len(pairs)]
        if len(link_ports) < len(pairs):
            raise ConfigError("could not find free ports for the proxy links")
        links = tuple((a, b, p) for (a, b), p in zip(pairs, link_ports, strict=True))
    security = ""
    directory.mkdir(parents=True, exist_ok=True)
    if secure:  # TLS + authentication: certificates, the bootstrap admin, the CLI's settings (security.md)
        from dledger.security.bootstrap import write_secure_group

        security = str(write_secure_group(directory, [s.id for s in specs], [s.address for s in specs]))
    group = GroupSpec(name, flush, specs, state_machine, links, security)
    if preferred_leader == LOWEST:
        preferred_leader = min(specs, key=lambda n: n.address).id
    for spec in specs:
        Path(spec.data_dir).mkdir(parents=True, exist_ok=True)
        settings: dict[str, int | str] = {**(raft or {})}
        if preferred_leader is not None:
            settings["preferred_leader"] = preferred_leader
        Path(spec.config).write_text(_node_toml(spec, group, settings))
    _write_manifest(directory, group)
    return group


def check_preferred_leader(preferred_leader: str | None, nodes: int) -> None:
    """``create``'s ``preferred_leader`` for a group of ``nodes`` nodes: None, a node id or ``LOWEST``."""
    if preferred_leader not in (None, LOWEST, *(f"n{i}" for i in range(nodes))):
        raise ConfigError(
            f"--preferred-leader {preferred_leader!r} is neither a node of the group (n0..n{nodes - 1}) "
            f"nor {LOWEST!r}"
        )


def _write_manifest(directory: Path, group: GroupSpec) -> None:
    manifest = {
        "name": group.name,
        "flush": group.flush,
        "state_machine": group.state_machine,
        "nodes": [asdict(s) for s in group.nodes],
        **({"links": [list(lk) for lk in group.links]} if group.links else {}),
        **({"security": group.security} if group.security else {}),
    }
    tmp = Path(directory) / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, Path(directory) / MANIFEST)


def load(directory: Path, missing_ok: bool = False) -> GroupSpec | None:
    path = Path(directory).resolve() / MANIFEST
    if not path.exists():
        if missing_ok:
            return None
        raise ConfigError(
            f"no group in {directory} ({path} is missing): run `dledger group up --dir {directory}`"
        )
    raw = json.loads(path.read_text())
    return GroupSpec(
        raw["name"],
        raw["flush"],
        tuple(NodeSpec(**n) for n in raw["nodes"]),
        raw.get("state_machine", ""),
        tuple((str(a), str(b), int(p)) for a, b, p in raw.get("links", ())),
        raw.get("security", ""),
    )


# -- processes ---------------------------------------------------------------------------------------------------


def _pid_file(spec: NodeSpec) -> Path:
    return Path(spec.data_dir) / "node.pid"


def read_pid(spec: NodeSpec) -> int | None:
    try:
        return int(_pid_file(spec).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def is_running(spec: NodeSpec, pid: int | None = None) -> bool:
    """True if ``pid`` (default: the pid file's) is alive and is this node's process."""
    pid = read_pid(spec) if pid is None else pid
    if pid is None or not owner.alive(pid):  # gone, or a zombie waiting to be reaped
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return spec.config.encode() in cmdline


def start_node(spec: NodeSpec, module: str = "dledger", python: Path | None = None) -> int:
    """Start one node process in the background (its own session, output to node.log); returns its pid.

    ``module`` is the ``python -m`` entry that runs ``node --config``: a fault-injection launcher
    (``dledger.chaos.faultnode``) runs the same node with a file layer that can be told to fail. ``python``: run
    it with that interpreter and what is installed beside it instead of this code (another release in its own
    venv, for an upgrade); neither the working directory nor PYTHONPATH then reaches its imports."""
    if is_running(spec):
        pid = read_pid(spec)
        assert pid is not None
        return pid
    env = None
    if python is not None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONSAFEPATH"] = "1"
    argv = [
        str(python) if python is not None else sys.executable,
        "-m",
        module,
        "node",
        "--config",
        spec.config,
    ]
    pid = _spawn_detached(argv, Path(spec.data_dir) / "node.log", env)
    _pid_file(spec).write_text(f"{pid}\n")
    # Until the child has exec'd, /proc shows the parent's command line and is_running() would say "not
    # running": a caller that checked right away would start the node a second time. Wait for the exec.
    deadline = time.monotonic() + 10.0
    while not is_running(spec, pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break  # it exited already (a bad config): node.log says why
        time.sleep(0.001)
    return pid


def _spawn_detached(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in its own session with stdin from /dev/null and stdout and stderr appended to
    ``log_path``; returns its pid. A node outlives the command that started it and is tracked by its pid file,
    so no ``Popen`` object claims it (one dropped while the child runs warns "subprocess is still running").
    Only descriptors 0-2 reach the child, as with ``close_fds``."""
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        actions: list[tuple] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, out, 2),
        ]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds() if fd > 2]
        return os.posix_spawn(argv[0], argv, env or os.environ, file_actions=actions, setsid=True)
    finally:
        os.close(out)


def _inheritable_fds() -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if os.get_inheritable(int(name)):
                fds.append(int(name))
    return fds


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child (it is when this process started the group)."""
    with contextlib.suppress(ChildProcessError):  # not our child: its parent (or init) reaps it
        os.waitpid(pid, os.WNOHANG)


def signal_node(spec: NodeSpec, sig: int) -> int | None:
    """Send ``sig`` to the node's process if it is running; returns the pid signalled."""
    pid = read_pid(spec)
    if pid is None or not is_running(spec, pid):
        return None
    os.kill(pid, sig)
    _reap(pid)
    return pid


def stop_node(spec: NodeSpec, timeout_s: float = 10.0) -> bool:
    """SIGTERM, wait for a clean exit, SIGKILL after ``timeout_s``. True if it was running."""
    pid = signal_node(spec, signal.SIGTERM)
    if pid is None:
        _pid_file(spec).unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_running(spec, pid):
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        for _ in range(250):
            _reap(pid)
            if not is_running(spec, pid):
                break
            time.sleep(0.02)
    _pid_file(spec).unlink(missing_ok=True)
    return True


def kill_node(spec: NodeSpec) -> int | None:
    """SIGKILL (kill -9) the node; returns the pid killed. The pid file stays (status shows the node down)."""
    pid = signal_node(spec, signal.SIGKILL)
    if pid is not None:
        for _ in range(250):
            _reap(pid)
            if not is_running(spec, pid):
                break
            time.sleep(0.01)
    return pid


def stop_group(group: GroupSpec, timeout_s: float = 10.0) -> list[str]:
    """Stop every node (in parallel: SIGTERM all, then wait). Returns the ids that were running."""
    running = [n for n in group.nodes if is_running(n)]
    for n in running:
        signal_node(n, signal.SIGTERM)
    for n in running:
        stop_node(n, timeout_s)
    for n in group.nodes:
        if not is_running(n):
            _pid_file(n).unlink(missing_ok=True)
    return [n.id for n in running]


# -- observing ---------------------------------------------------------------------------------------------------


async def _metadata(address: str, timeout_s: float, security: str = "") -> NodeInfo | None:
    from dledger.client import AsyncDLedgerClient

    client = AsyncDLedgerClient(
        [address], timeout_s=timeout_s, rpc_timeout_s=timeout_s, **client_security(security)
    )
    try:
        return await client.metadata(address)
    except DLedgerError:
        return None
    finally:
        await client.close()


def _member(node_id: str, info: NodeInfo | None, view: NodeInfo | None) -> str | None:
    view = view or info
    if view is None:
        return None
    return "voter" if node_id in view.voters else "learner" if node_id in view.learners else ""


async def status_async(group: GroupSpec, timeout_s: float = 0.5) -> list[NodeStatus]:
    infos = await asyncio.gather(*[_metadata(n.address, timeout_s, group.security) for n in group.nodes])
    leaders = [i for i in infos if i is not None and i.role == "leader"]
    view = max(leaders, key=lambda i: i.term) if leaders else None
    rows = []
    for spec, info in zip(group.nodes, infos, strict=True):
        pid = read_pid(spec)
        alive = is_running(spec, pid)
        if info is None or not alive:
            rows.append(
                NodeStatus(
                    spec.id,
                    spec.address,
                    pid,
                    "down",
                    None,
                    None,
                    None,
                    spec.data_dir,
                    None,
                    _member(spec.id, None, view),
                )
            )
        else:
            rows.append(
                NodeStatus(
                    spec.id,
                    spec.address,
                    pid,
                    info.role,
                    info.term,
                    info.last_index,
                    info.commit_index,
                    spec.data_dir,
                    info.applied_index,
                    _member(spec.id, info, view),
                )
            )
    return rows


def configuration(group: GroupSpec, timeout_s: float = 0.5) -> NodeInfo | None:
    """The leader's metadata (its ``voters``, ``learners`` and ``conf_index`` are the group's configuration),
    or None when no leader answers."""

    async def ask() -> NodeInfo | None:
        infos = await asyncio.gather(*[_metadata(n.address, timeout_s, group.security) for n in group.nodes])
        leaders = [i for i in infos if i is not None and i.role == "leader"]
        return max(leaders, key=lambda i: i.term) if leaders else None

    return run_sync(ask())


def status(group: GroupSpec, timeout_s: float = 0.5) -> list[NodeStatus]:
    return run_sync(status_async(group, timeout_s))


def client_security(path: str) -> dict:
    """``security=`` for a client of a secure group (its settings file), or nothing for a plain one."""
    if not path:
        return {}
    from dledger.security.config import ClientSecurity

    return {"security": ClientSecurity.from_file(Path(path))}


def leader_of(rows: list[NodeStatus]) -> NodeStatus | None:
    """The leader with the highest term (a deposed leader may not know yet)."""
    leaders = [r for r in rows if r.role == "leader"]
    return max(leaders, key=lambda r: r.term or 0) if leaders else None


async def wait_for_leader_async(
    group: GroupSpec, timeout_s: float = 15.0, exclude: str | None = None
) -> NodeStatus:
    """Poll until a live node other than ``exclude`` is leader; raise ``UnavailableError`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        rows = await status_async(group, timeout_s=0.3)
        lead = leader_of([r for r in rows if r.id != exclude])
        if lead is not None:
            return lead
        await asyncio.sleep(0.01)
    raise UnavailableError(
        f"no leader elected within {timeout_s} s; see the node.log files under the group dir"
    )


def wait_for_leader(group: GroupSpec, timeout_s: float = 15.0, exclude: str | None = None) -> NodeStatus:
    return run_sync(wait_for_leader_async(group, timeout_s, exclude))


def wait_for_all(group: GroupSpec, timeout_s: float = 10.0) -> list[NodeStatus]:
    """Poll until every node answers (none is "down"); returns the last status either way."""
    deadline = time.monotonic() + timeout_s
    rows = status(group)
    while any(r.role == "down" for r in rows) and time.monotonic() < deadline:
        time.sleep(0.05)
        rows = status(group)
    return rows


def wait_caught_up(group: GroupSpec, node_id: str, index: int, timeout_s: float = 30.0) -> NodeStatus | None:
    """Poll until ``node_id`` has committed ``index`` (a restarted node refilling its log); its last status row,
    or None when it never answered."""
    deadline = time.monotonic() + timeout_s
    row = None
    while time.monotonic() < deadline:
        row = next(r for r in status(group, 0.3) if r.id == node_id)
        if row.commit_index is not None and row.commit_index >= index:
            break
        time.sleep(0.05)
    return row


def up(
    directory: Path, nodes: int | None = None, base_port: int | None = DEFAULT_BASE_PORT, **kwargs
) -> tuple[GroupSpec, NodeStatus]:
    """Create (or reuse) the group in ``directory``, start every node, return once a leader is elected and every
    node answers (a quorum elects while the last node may still be starting: a caller that dials it at once was
    refused; a node that does not come up within 30 s is left to ``status`` to show)."""
    group = create(directory, nodes, base_port, **kwargs)
    for spec in group.nodes:
        start_node(spec)
    try:
        leader = wait_for_leader(group)
    except UnavailableError:
        stop_group(group)
        raise
    wait_for_all(group, 30.0)
    return group, leader


@dataclass(frozen=True, slots=True)
class Failover:
    killed: str
    pid: int
    new_leader: str
    to_leader_s: float  # from SIGKILL to a new leader being reported
    to_append_s: float  # from SIGKILL to the first successful append


async def kill_leader_async(group: GroupSpec, timeout_s: float = 15.0) -> Failover:
    """SIGKILL the leader, then measure until another node leads and until an append succeeds again."""
    from dledger.client import AsyncDLedgerClient

    leader = await wait_for_leader_async(group, timeout_s)
    spec = group.node(leader.id)
    survivors = [n.address for n in group.nodes if n.id != leader.id]
    client = AsyncDLedgerClient(
        survivors,
        group.name,
        timeout_s=timeout_s,
        rpc_timeout_s=0.5,
        backoff_s=(0.005, 0.02),
        **client_security(group.security),
    )
    try:
        t0 = time.monotonic()
        pid = kill_node(spec)
        if pid is None:
            raise UnavailableError(f"leader {leader.id} is not running")
        loop = asyncio.get_running_loop()
        new_leader: list[tuple[str, float]] = []

        async def watch_leader() -> None:
            while not new_leader and loop.time() < t0 + timeout_s:
                rows = await status_async(
                    GroupSpec(
                        group.name,
                        group.flush,
                        tuple(n for n in group.nodes if n.id != leader.id),
                        group.state_machine,
                        security=group.security,
                    ),
                    0.2,
                )
                lead = leader_of(rows)
                if lead is not None:
                    new_leader.append((lead.id, time.monotonic() - t0))
                    return
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch_leader())
        while True:
            try:
                await client.append(f"after-kill-{leader.id}-{time.time_ns()}".encode())
                break
            except OutcomeUnknownError:
                # A survivor changed roles while answering: this append may or may not count; try another.
                if time.monotonic() - t0 > timeout_s:
                    raise
        t_append = time.monotonic() - t0
        await asyncio.wait_for(watcher, timeout_s)
        if not new_leader:
            raise UnavailableError("appends succeeded but no new leader was reported")
        lead_id, t_lead = new_leader[0]
        return Failover(leader.id, pid, lead_id, min(t_lead, t_append), t_append)
    finally:
        await client.close()
