"""A node's settings, from a TOML file and/or command-line flags, checked once at start.

A node that starts with a bad setting would fail later in a confusing way (an election storm, a peer that never
answers, a log placed at different positions on different nodes), so everything is validated here and every
error names the setting, the value and what would be accepted. Flags override the file.

Example file (all keys optional except ``id``, ``data_dir`` and ``peers``)::

    id = "n0"
    group = "dledger"
    data_dir = "var/n0"
    flush = "sync"            # or "async" (page cache, flushed every flush_interval_ms)
    flush_interval_ms = 10
    listen = "127.0.0.1:20911" # defaults to this node's address in [peers]
    state_machine = "broker"   # optional plugin: "kv", "counter", "broker" or "module:factory"
    metrics_listen = "127.0.0.1:9311"  # optional Prometheus /metrics endpoint
    join = false              # true: a new node joining a running group (learns its membership from the log)

    [peers]                   # every voter, this node included
    n0 = "127.0.0.1:20911"
    n1 = "127.0.0.1:20912"
    n2 = "127.0.0.1:20913"

    [dial]                    # optional: how this node reaches members added later, when not at the address
    n3 = "127.0.0.1:30914"    # their configuration entry carries (read again when a member is first seen)

    [raft]                    # dledger.core.config.RaftConfig fields
    tick_ms = 10
    election_timeout_min_ms = 150
    election_timeout_max_ms = 300
    heartbeat_interval_ms = 50

    [limits]
    max_pending_entries = 20000
    max_body_bytes = 4194304

    [security]                # TLS + authentication + permissions; see dledger/security/config.py
    cert = "tls/n0.pem"
    key = "tls/n0.key"
    ca = "tls/ca.pem"
    admin = "admin.toml"

    [storage]                 # the log's files (docs/storage.md)
    index_units_per_file = 5242880  # index units (32 bytes each) per index file: 160 MiB files, as DLedger

    [snapshot]                # when the state machine's state is saved and the log before it compacted
    entries = 100000          # entries applied since the last snapshot
    bytes = 268435456         # or body bytes applied since the last snapshot, whichever comes first
    keep = 2                  # snapshots kept on disk (older ones are deleted)
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger.core.config import RaftConfig
from dledger.errors import ConfigError
from dledger.security.config import SecurityConfig
from storage.index import DEFAULT_UNITS_PER_FILE

FLUSH_POLICIES = ("sync", "async")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # node, group and cluster names
_TOP_KEYS = {
    "id",
    "group",
    "data_dir",
    "flush",
    "flush_interval_ms",
    "listen",
    "peers",
    "raft",
    "limits",
    "state_machine",
    "snapshot",
    "metrics_listen",
    "security",
    "join",
    "storage",
    "dial",
}
_LIMIT_KEYS = {"max_pending_entries", "max_body_bytes"}
_SNAPSHOT_KEYS = {"entries": "snapshot_entries", "bytes": "snapshot_bytes", "keep": "snapshot_keep"}
_STORAGE_KEYS = {"index_units_per_file"}
INDEX_UNITS_ENV = "DLEDGER_INDEX_UNITS_PER_FILE"
INDEX_UNITS_RANGE = (1024, 1 << 27)  # 32 KiB .. 4 GiB index files


def default_index_units() -> int:
    """``[storage] index_units_per_file`` when a node's config does not give it: DLedger's 160 MiB files, unless
    the environment variable DLEDGER_INDEX_UNITS_PER_FILE says otherwise.

    Why an environment variable: the test suite creates nodes in-process (``NodeConfig(...)``), through
    ``dledger.group.create`` and through ``dledger group up`` / ``cluster up`` in child processes; the
    variable, set once in tests/conftest.py, reaches every one of them (children inherit it), so no test
    preallocates 160 MiB a node. A value in the config file wins over it (docs/storage.md)."""
    raw = os.environ.get(INDEX_UNITS_ENV, "").strip()
    if not raw:
        return DEFAULT_UNITS_PER_FILE
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{INDEX_UNITS_ENV} must be an integer, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    peers: dict[str, str]  # id -> host:port, every voter including this node
    data_dir: Path
    group: str = "dledger"
    flush: str = "sync"
    flush_interval_ms: int = 10
    listen: str = ""  # bind address; defaults to peers[node_id]
    raft: RaftConfig = field(default_factory=RaftConfig)
    max_pending_entries: int = 20_000  # appends accepted but not yet committed (backpressure bound)
    max_body_bytes: int = 4 << 20
    state_machine: str = ""  # plugin: a built-in ("kv", "counter", "broker") or "module:factory"
    snapshot_entries: int = 100_000  # take a snapshot after this many applied entries ...
    snapshot_bytes: int = 256 << 20  # ... or this many applied body bytes, whichever comes first
    snapshot_keep: int = 2  # snapshots kept on disk
    metrics_listen: str = (
        ""  # host:port of the Prometheus /metrics endpoint (port 0: any free one); off if ""
    )
    # [security] TLS on the port, peer identity, users and permissions; None (no table): off (docs/security.md)
    security: SecurityConfig | None = None
    # A node started to join a running group (``dledger group replace-node``, ``member add``): with an empty log
    # it knows no configuration and never campaigns until the leader's log or snapshot tells it its membership
    # (docs/membership.md). [peers] then lists the members it may hear from, itself included.
    join: bool = False
    # The tables of the file this config does not know itself, by name: they belong to the node's plugin, which
    # reads and checks its own (the broker's [broker]: broker_adapter/settings.py); one that no part of the node
    # reads stops it at start (``Node``). Compared, not hashed.
    sections: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    # [storage] index units (32 bytes each) per index file; the files are preallocated whole (storage/index.py)
    index_units_per_file: int = field(default_factory=default_index_units)
    # [dial] id -> host:port: where this node dials a member that joins later instead of the address the member's
    # configuration entry carries (one address for every node), e.g. through a proxy or another network. Unlike
    # [peers], never part of the starting configuration. ``dial_address`` reads the file again for it.
    dial: dict[str, str] = field(default_factory=dict)
    # The file this config was read from (None: built in code).
    source: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not ID_RE.match(self.node_id):
            raise ConfigError(
                f"node id {self.node_id!r} is invalid: use 1-64 letters, digits, '_', '.', '-' (e.g. n0)"
            )
        if not isinstance(self.group, str) or not ID_RE.match(self.group):
            raise ConfigError(f"group {self.group!r} is invalid: use 1-64 letters, digits, '_', '.', '-'")
        if not self.peers:
            raise ConfigError("peers is empty: list every voter as id=host:port, this node included")
        for pid, addr in self.peers.items():
            if not ID_RE.match(pid):
                raise ConfigError(f"peer id {pid!r} is invalid: use letters, digits, '_', '.', '-'")
            parse_address(addr, f"peer {pid}")
        if len(set(self.peers.values())) != len(self.peers):
            raise ConfigError(f"two peers share an address: {self.peers}")
        if self.node_id not in self.peers:
            raise ConfigError(
                f"this node ({self.node_id}) is not among the peers ({', '.join(sorted(self.peers))}): "
                "list every voter, this node included"
            )
        for pid, addr in self.dial.items():
            _check_dial(pid, addr)
        if self.listen:
            parse_address(self.listen, "listen")
        if self.metrics_listen:
            parse_address(self.metrics_listen, "metrics_listen", allow_any_port=True)
        if self.flush not in FLUSH_POLICIES:
            raise ConfigError(f"flush must be one of {', '.join(FLUSH_POLICIES)}, got {self.flush!r}")
        if not isinstance(self.join, bool):
            raise ConfigError(f"join must be true or false, got {self.join!r}")
        if not 1 <= self.flush_interval_ms <= 10_000:
            raise ConfigError(f"flush_interval_ms must be in 1..10000, got {self.flush_interval_ms}")
        if self.max_pending_entries < 1:
            raise ConfigError(f"max_pending_entries must be at least 1, got {self.max_pending_entries}")
        if not 1 <= self.max_body_bytes <= self.raft.segment_size // 2:
            raise ConfigError(
                f"max_body_bytes must be in 1..{self.raft.segment_size // 2} (half a segment), "
                f"got {self.max_body_bytes}"
            )
        for name, lo in (("snapshot_entries", 1), ("snapshot_bytes", 1), ("snapshot_keep", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(
                    f"[snapshot] {name.removeprefix('snapshot_')} must be an integer >= {lo}, got {v!r}"
                )
        u, (lo, hi) = self.index_units_per_file, INDEX_UNITS_RANGE
        if isinstance(u, bool) or not isinstance(u, int) or not lo <= u <= hi:
            raise ConfigError(f"[storage] index_units_per_file must be an integer in {lo}..{hi}, got {u!r}")
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise ConfigError(f"data_dir {self.data_dir} exists and is not a directory")

    @property
    def address(self) -> str:
        return self.peers[self.node_id]

    @property
    def bind(self) -> str:
        return self.listen or self.address

    @property
    def voters(self) -> list[str]:
        return sorted(self.peers)


def parse_address(addr: str, what: str, allow_any_port: bool = False) -> tuple[str, int]:
    """``host:port``; ``allow_any_port`` accepts port 0 (the system picks a free one)."""
    host, sep, port = str(addr).rpartition(":")
    lo = 0 if allow_any_port else 1
    if not sep or not host or not port.isdigit() or not lo <= int(port) < 65536:
        raise ConfigError(f"{what}: address {addr!r} is not host:port with a port in {lo}..65535")
    return host, int(port)


def _check_dial(pid: object, addr: object) -> None:
    if not isinstance(pid, str) or not ID_RE.match(pid):
        raise ConfigError(f"[dial]: node id {pid!r} is invalid: use letters, digits, '_', '.', '-'")
    if not isinstance(addr, str):
        raise ConfigError(f"[dial] {pid}: address {addr!r} is not a host:port string")
    parse_address(addr, f"[dial] {pid}")


def dial_address(config: NodeConfig, node_id: str) -> str | None:
    """Where this node dials ``node_id``, a member it has just learned of, by its config's ``[dial]`` table as
    the file says now (the table may have been written after the node started, as ``member add`` does in a
    proxied group: dledger/group_members.py); None when neither the file nor the config names it. A file that
    cannot be read or checked falls back to the table the node started with."""
    if config.source is not None:
        try:
            table = tomllib.loads(config.source.read_text()).get("dial", {})
            addr = table.get(node_id) if isinstance(table, dict) else None
            if addr is not None:
                _check_dial(node_id, addr)
                return str(addr)
            return None
        except (OSError, tomllib.TOMLDecodeError, ConfigError):
            pass
    return config.dial.get(node_id)


def valid_id(text: str) -> bool:
    """A node or group id: 1-64 letters, digits, '_', '.', '-' (what node.toml accepts)."""
    return isinstance(text, str) and ID_RE.match(text) is not None


def parse_peers(text: str) -> dict[str, str]:
    """``n0=127.0.0.1:20911,n1=127.0.0.1:20912`` -> {"n0": "127.0.0.1:20911", ...}."""
    peers: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        pid, sep, addr = part.partition("=")
        if not sep or not pid or not addr:
            raise ConfigError(f"peers: {part!r} is not id=host:port (e.g. n0=127.0.0.1:20911)")
        if pid in peers:
            raise ConfigError(f"peers: {pid} is listed twice")
        peers[pid.strip()] = addr.strip()
    return peers


def load(path: Path | None = None, **overrides: Any) -> NodeConfig:
    """Build a config from an optional TOML file and flag overrides (None means "not given")."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        unknown = {k for k in set(raw) - _TOP_KEYS if not isinstance(raw[k], dict)}
        if unknown:
            raise ConfigError(
                f"config file {path}: unknown keys {sorted(unknown)}; known: {sorted(_TOP_KEYS)}"
            )
    raft_raw = dict(raw.get("raft", {}))
    snapshot = dict(raw.get("snapshot", {}))
    bad_snapshot = set(snapshot) - set(_SNAPSHOT_KEYS)
    if bad_snapshot:
        raise ConfigError(f"[snapshot]: unknown keys {sorted(bad_snapshot)}; known: {sorted(_SNAPSHOT_KEYS)}")
    storage = dict(raw.get("storage", {}))
    bad_storage = set(storage) - _STORAGE_KEYS
    if bad_storage:
        raise ConfigError(f"[storage]: unknown keys {sorted(bad_storage)}; known: {sorted(_STORAGE_KEYS)}")
    limits = dict(raw.get("limits", {}))
    bad_limits = set(limits) - _LIMIT_KEYS
    if bad_limits:
        raise ConfigError(f"[limits]: unknown keys {sorted(bad_limits)}; known: {sorted(_LIMIT_KEYS)}")
    for key in [k for k in overrides if k in {f.name for f in dataclasses.fields(RaftConfig)}]:
        value = overrides.pop(key)
        if value is not None:
            raft_raw[key] = value
    known_raft = {f.name for f in dataclasses.fields(RaftConfig)}
    bad_raft = set(raft_raw) - known_raft
    if bad_raft:
        raise ConfigError(f"[raft]: unknown keys {sorted(bad_raft)}; known: {sorted(known_raft)}")
    try:
        raft = RaftConfig(**raft_raw)
    except TypeError as e:
        raise ConfigError(f"[raft]: {e}") from None

    def pick(name: str, default: Any = None) -> Any:
        v = overrides.get(name)
        if v is not None:
            return v
        if name in raw:
            return raw[name]
        return limits.get(name, default)

    peers = pick("peers")
    if isinstance(peers, str):
        peers = parse_peers(peers)
    node_id = pick("id")
    data_dir = pick("data_dir")
    missing = [n for n, v in (("id", node_id), ("data_dir", data_dir), ("peers", peers)) if not v]
    if missing:
        raise ConfigError(
            f"missing required settings: {', '.join(missing)} (give them as flags or in the file)"
        )
    kwargs: dict[str, Any] = {
        "node_id": str(node_id),
        "peers": dict(peers),
        "data_dir": Path(data_dir),
        "raft": raft,
    }
    for name in (
        "group",
        "flush",
        "flush_interval_ms",
        "listen",
        "max_pending_entries",
        "max_body_bytes",
        "state_machine",
        "metrics_listen",
        "join",
    ):
        v = pick(name)
        if v is not None:
            kwargs[name] = v
    sections = {k: dict(v) for k, v in raw.items() if k not in _TOP_KEYS and isinstance(v, dict)}
    if sections:
        kwargs["sections"] = sections
    dial = raw.get("dial", {})
    if not isinstance(dial, dict):
        raise ConfigError('[dial] must be a table of id = "host:port"')
    if dial:
        kwargs["dial"] = dict(dial)
    if path is not None:
        kwargs["source"] = Path(path)
    for name in _STORAGE_KEYS:
        v = overrides.get(name, storage.get(name))
        if v is not None:
            kwargs[name] = v
    for key, name in _SNAPSHOT_KEYS.items():
        v = overrides.get(name)
        if v is None:
            v = snapshot.get(key)
        if v is not None:
            kwargs[name] = v
    for name in ("flush_interval_ms", "max_pending_entries", "max_body_bytes"):
        if name in kwargs and not isinstance(kwargs[name], int):
            raise ConfigError(f"{name} must be an integer, got {kwargs[name]!r}")
    if overrides.get("security") is not None:
        kwargs["security"] = overrides["security"]
    elif raw.get("security"):
        assert path is not None  # raw is the file's
        kwargs["security"] = SecurityConfig.from_table(raw["security"], Path(path).resolve().parent)
    return NodeConfig(**kwargs)
