"""The ``dledger`` command line (also ``python -m dledger``).

One typer app with sub-apps, so other parts add their commands without touching these: ``app.add_typer(...)``
for a group of commands, ``@app.command()`` for one.

    dledger node --config n0.toml              run one node in the foreground
    dledger group up|down|status --dir DIR     a local group of separate node processes
    dledger member list|add|promote|remove     change a local group's members (dledger.member)
    dledger group replace-node --dir DIR NODE  replace a dead node by a new one
    dledger watch --dir DIR                    live table of roles, terms, indexes
    dledger kill-leader --dir DIR              kill -9 the leader, report failover times
    dledger snapshot --dir DIR                 every node snapshots its state machine and compacts its log
    dledger repair --dir NODE_DIR              truncate a stopped node's log at its first corrupt entry
    dledger append / get                       raw log use
    dledger demo                               the whole story in one command (registered by the broker)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from dledger import backup_commands, member
from dledger import group as grp
from dledger.cliutil import AddressesOpt, addresses_of, console, err_console
from dledger.cliutil import fail as _fail  # the name this module's many call sites use
from dledger.errors import DLedgerError
from dledger.transport.grpc import run_sync

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="dledger-py: a Raft-replicated log service."
)
group_app = typer.Typer(no_args_is_help=True, help="Run a local group of node processes on 127.0.0.1.")
app.add_typer(group_app, name="group")
member.register(app, group_app)
backup_commands.register(app)


@app.callback()
def _security_options(
    security: Annotated[
        Path | None,
        typer.Option(
            envvar="DLEDGER_SECURITY",
            help="client settings of a secure group: TOML with ca, access_key, secret_key",
        ),
    ] = None,
    ca_file: Annotated[
        Path | None, typer.Option(envvar="DLEDGER_CA_FILE", help="CA certificate (TLS)")
    ] = None,
    access_key: Annotated[str | None, typer.Option(envvar="DLEDGER_ACCESS_KEY", help="access key")] = None,
    secret_key: Annotated[
        str | None, typer.Option(envvar="DLEDGER_SECRET_KEY", help="secret key", show_default=False)
    ] = None,
) -> None:
    """Every client of this process (the commands' and the libraries') takes these from the environment
    (dledger.security.config.ClientSecurity.from_env), so each command gets them without a flag of its own."""
    for name, value in (
        ("DLEDGER_SECURITY", security),
        ("DLEDGER_CA_FILE", ca_file),
        ("DLEDGER_ACCESS_KEY", access_key),
        ("DLEDGER_SECRET_KEY", secret_key),
    ):
        if value:
            os.environ[name] = str(value)


DirOption = Annotated[
    Path, typer.Option("--dir", help="the group directory (holds group.json and one dir per node)")
]


# -- node ----------------------------------------------------------------------------------------------------------


@app.command()
def node(
    config: Annotated[Path | None, typer.Option(help="TOML config file (flags override it)")] = None,
    id: Annotated[str | None, typer.Option("--id", help="this node's id, e.g. n0")] = None,
    group: Annotated[str | None, typer.Option(help="group name")] = None,
    peers: Annotated[str | None, typer.Option(help="every voter: n0=127.0.0.1:20911,n1=...")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="directory for data/, index/, meta/")] = None,
    flush: Annotated[str | None, typer.Option(help="sync (fsync before ack) or async (page cache)")] = None,
    listen: Annotated[
        str | None, typer.Option(help="bind address (default: this node's peer address)")
    ] = None,
    election_timeout_min_ms: Annotated[int | None, typer.Option()] = None,
    election_timeout_max_ms: Annotated[int | None, typer.Option()] = None,
    heartbeat_interval_ms: Annotated[int | None, typer.Option()] = None,
    state_machine: Annotated[
        str | None,
        typer.Option(
            help="node plugin: an installed alias (kv, counter, or one a package adds) or module:factory"
        ),
    ] = None,
    metrics_listen: Annotated[
        str | None, typer.Option(help="serve Prometheus /metrics on host:port (port 0: any free one)")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
) -> None:
    """Run one node in the foreground until SIGTERM or Ctrl-C."""
    from dledger import nodeconfig
    from dledger.runtime.process import serve
    from statemachine.snapshot import SnapshotError
    from storage.errors import StorageCorruptError, StorageError

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        cfg = nodeconfig.load(
            config,
            id=id,
            group=group,
            peers=peers,
            data_dir=data_dir,
            flush=flush,
            listen=listen,
            election_timeout_min_ms=election_timeout_min_ms,
            election_timeout_max_ms=election_timeout_max_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            state_machine=state_machine,
            metrics_listen=metrics_listen,
        )
    except DLedgerError as e:
        _fail(f"bad configuration: {e}", 2)
    try:
        serve(cfg)
    except DLedgerError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"node {cfg.node_id} could not start: {e}")
    except StorageCorruptError as e:
        # Damage a crash cannot explain: starting would serve and replicate a log that is not what was written.
        lost = f"the entries from index {e.index} on" if e.index is not None else "the entries from there on"
        _fail(
            escape(
                f"node {cfg.node_id} refuses to start, its log is corrupt: {e}; "
                f"`dledger repair --dir {cfg.data_dir}` truncates the log there "
                f"(this node loses {lost} and refills them from its group)"
            )
        )
    except StorageError as e:
        _fail(escape(f"node {cfg.node_id} could not open its log in {cfg.data_dir}: {e}"))
    except SnapshotError as e:
        # No intact snapshot the log continues from: loading one would start the state machine on bad state.
        _fail(escape(f"node {cfg.node_id} refuses to start, it has no usable snapshot: {e}"))


# -- repair --------------------------------------------------------------------------------------------------------


@app.command()
def repair(
    dir: Annotated[Path, typer.Option("--dir", help="the node directory (holds data/ and index/)")],
    segment_size: Annotated[
        int | None,
        typer.Option(help="the log's segment size in bytes (default: the one its start record names)"),
    ] = None,
) -> None:
    """Truncate a stopped node's log at its first corrupt entry, so the node starts again.

    This node loses the entries from there on: run it only while the rest of the group holds them."""
    from storage import filestore
    from storage.errors import StorageError

    if not (dir / "data").is_dir():
        _fail(
            f"no log in {dir} (no data/ directory): give a node directory, the one holding data/ and index/"
        )
    size = _segment_size(dir, segment_size)
    fd = _lock_node_dir(dir)
    try:
        r = filestore.repair(str(dir), size)
    except (StorageError, OSError) as e:
        _fail(escape(f"could not repair the log in {dir}: {e}"))
    finally:
        os.close(fd)  # releases the lock: the node may start now
    t = r.tail
    end = (
        f"the log now ends at index {t.last_index} (term {t.last_term})"
        if t.last_index >= 0
        else "the log is empty"
    )
    if r.bad is None:
        msg = f"no corruption found in {dir}: dropped 0 entries; {end}"
    else:
        where = f"index {r.bad.index} (file {r.bad.path}, offset {r.bad.offset}: {r.bad.reason})"
        if r.dropped_entries:
            msg = f"dropped {r.dropped_entries} entries from {where}; {end}"
        else:  # nothing proved later entries existed: a torn tail, which a normal start cuts too
            msg = f"dropped 0 entries: cut a torn tail of {r.torn_bytes} bytes at {where}; {end}"
    if r.rebuilt_units:
        msg += f"; rebuilt {r.rebuilt_units} index units from the data"
    console.print(escape(msg), soft_wrap=True)


def _segment_size(dir: Path, given: int | None) -> int:
    """The segment size the log was written with: a repair walking it with another one would see every entry
    past the first file as misplaced and cut the log there."""
    from storage import codec
    from storage.errors import StorageError
    from storage.recovery import LogStart

    recorded = None
    # No start record (a log never opened), or an unreadable one, which the repair itself reports.
    with contextlib.suppress(StorageError):
        start = LogStart.load(str(dir / "data"))
        recorded = (start.segment_size or None) if start is not None else None
    if given is not None and recorded is not None and given != recorded:
        _fail(f"the log in {dir} was written with --segment-size {recorded}, not {given}")
    return given or recorded or codec.DEFAULT_SEGMENT_SIZE


def _lock_node_dir(dir: Path) -> int:
    """The node's own lock (``dledger.runtime.datadir.lock_data_dir``): a running node holds it, and while the repair holds
    it no node can open the log being cut (one started meanwhile names this process as the holder)."""
    from dledger.errors import DirectoryInUseError
    from dledger.runtime.datadir import lock_data_dir

    try:
        return lock_data_dir(dir)
    except DirectoryInUseError as e:
        _fail(f"{dir} is in use by a running node process (pid {e.holder}): stop the node first, then repair")
    except OSError as e:
        _fail(f"cannot take the lock of {dir}: {e}")


# -- group ---------------------------------------------------------------------------------------------------------


@group_app.command("up")
def group_up(
    dir: DirOption,
    nodes: Annotated[
        int | None, typer.Option(help="nodes of a new group (default 3; 5 also makes sense)")
    ] = None,
    base_port: Annotated[
        int | None, typer.Option(help="first port; 0 picks free ports")
    ] = grp.DEFAULT_BASE_PORT,
    flush: Annotated[str, typer.Option(help="sync or async")] = "sync",
    state_machine: Annotated[
        str, typer.Option(help="node plugin for a new group: an installed alias or module:factory")
    ] = "",
    secure: Annotated[
        bool, typer.Option("--secure", help="a new group with TLS, peer identity, users and permissions")
    ] = False,
    preferred_leader: Annotated[
        str | None,
        typer.Option(
            help="a new group's preferred leader: leadership returns to it whenever it is healthy; a node id, "
            "or 'lowest': the node whose address sorts first as a string (docs/raft.md)"
        ),
    ] = None,
) -> None:
    """Start a local group in the background; return once a leader is elected."""
    try:
        g, leader = grp.up(
            dir,
            nodes,
            None if base_port == 0 else base_port,
            flush=flush,
            state_machine=state_machine,
            secure=secure,
            preferred_leader=preferred_leader,
        )
    except DLedgerError as e:
        _fail(str(e))
    console.print(
        f"group [bold]{g.name}[/bold] is up in {dir}: leader [green]{leader.id}[/green] at term {leader.term}"
    )
    _print_status(grp.status(g))


@group_app.command("down")
def group_down(dir: DirOption) -> None:
    """Stop every node of the group (SIGTERM, then SIGKILL after 10 s)."""
    try:
        g = grp.load(dir)
    except DLedgerError as e:
        _fail(str(e))
    stopped = grp.stop_group(g)
    console.print(f"stopped {', '.join(stopped) if stopped else 'nothing (no node was running)'}")


@group_app.command("status")
def group_status(
    dir: DirOption, as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False
) -> None:
    """Each node's id, address, pid, role, term, last index, commit index, applied index and data dir."""
    try:
        g = grp.load(dir)
    except DLedgerError as e:
        _fail(str(e))
    rows = grp.status(g)
    lead = grp.configuration(g)  # the configuration is the leader's (docs/membership.md)
    conf = None
    if lead is not None:
        conf = {"voters": list(lead.voters), "learners": list(lead.learners), "conf_index": lead.conf_index}
    if as_json:
        print(json.dumps({"nodes": [r.to_json() for r in rows], "configuration": conf}))
    else:
        _print_status(rows)
        if conf is not None:
            learners = f"; learners {', '.join(conf['learners'])}" if conf["learners"] else ""
            entry = f"config entry {conf['conf_index']}" if conf["conf_index"] >= 0 else "the initial members"
            console.print(f"configuration: voters {', '.join(conf['voters'])}{learners} ({entry})")


def _status_table(rows: list[grp.NodeStatus], title: str | None = None) -> Table:
    t = Table(title=title)
    numeric = ("pid", "term", "last index", "commit index", "applied", "lag")
    columns = (
        "node",
        "address",
        "pid",
        "role",
        "member",
        "term",
        "last index",
        "commit index",
        "applied",
        "lag",
    )
    for col in (*columns, "data dir"):
        t.add_column(col, justify="right" if col in numeric else "left")
    top = max((r.commit_index for r in rows if r.commit_index is not None), default=-1)
    styles = {"leader": "bold green", "follower": "cyan", "candidate": "yellow", "down": "red"}
    for r in rows:
        lag = "" if r.commit_index is None else str(top - r.commit_index)
        t.add_row(
            r.id,
            r.address,
            str(r.pid or ""),
            f"[{styles.get(r.role, '')}]{r.role}[/]",
            r.member or "",
            "" if r.term is None else str(r.term),
            "" if r.last_index is None else str(r.last_index),
            "" if r.commit_index is None else str(r.commit_index),
            "" if r.applied_index is None else str(r.applied_index),
            lag,
            r.data_dir,
        )
    return t


def _print_status(rows: list[grp.NodeStatus]) -> None:
    console.print(_status_table(rows))


# -- watch, kill-leader --------------------------------------------------------------------------------------------


@app.command()
def watch(
    dir: DirOption,
    interval: Annotated[float, typer.Option(help="refresh period in seconds")] = 0.2,
    duration: Annotated[
        float | None, typer.Option(help="stop after this many seconds (default: Ctrl-C)")
    ] = None,
) -> None:
    """A live table of the group: roles change before your eyes when a leader dies."""
    try:
        g = grp.load(dir)
    except DLedgerError as e:
        _fail(str(e))
    end = None if duration is None else time.monotonic() + duration
    try:
        with Live(_status_table(grp.status(g)), console=console, refresh_per_second=10) as live:
            while end is None or time.monotonic() < end:
                time.sleep(interval)
                live.update(_status_table(grp.status(g, timeout_s=interval), title=time.strftime("%H:%M:%S")))
    except KeyboardInterrupt:
        pass


@app.command("kill-leader")
def kill_leader(dir: DirOption) -> None:
    """kill -9 the leader and report the time to a new leader and to the next successful append."""
    try:
        g = grp.load(dir)
        f = run_sync(grp.kill_leader_async(g))
    except DLedgerError as e:
        _fail(str(e))
    console.print(
        f"killed leader [red]{f.killed}[/red] (pid {f.pid}); new leader [green]{f.new_leader}[/green] after "
        f"[bold]{f.to_leader_s * 1000:.0f} ms[/bold]; appends succeed again after "
        f"[bold]{f.to_append_s * 1000:.0f} ms[/bold]"
    )


@app.command()
def snapshot(dir: DirOption) -> None:
    """Ask every running node of a local group to snapshot its state machine now and compact its log."""
    try:
        g = grp.load(dir)
    except DLedgerError as e:
        _fail(str(e))
    failed = []
    for spec, outcome in run_sync(_snapshot_all(g)):
        if isinstance(outcome, BaseException):
            failed.append(spec.id)
            err_console.print(f"[red]error:[/red] {spec.id} at {spec.address}: {outcome}")
            continue
        what = "took a snapshot" if outcome.taken else "had nothing new since its snapshot"
        where = f"at index {outcome.index} ({outcome.size} bytes)" if outcome.index >= 0 else "(none yet)"
        console.print(f"{spec.id} {what} {where}; its log starts at {outcome.first_index}")
    if failed:
        _fail(f"{len(failed)} node(s) did not take a snapshot: {', '.join(failed)}")


async def _snapshot_all(g: grp.GroupSpec) -> list[tuple[grp.NodeSpec, object]]:
    import grpc

    from dledger.security.tls import client_credentials
    from dledger.transport.grpc import open_channel
    from dledger.v1 import client_pb2, client_pb2_grpc

    credentials = client_credentials(grp.client_security(g.security).get("security"))

    async def one(spec: grp.NodeSpec):
        async with open_channel(spec.address, credentials=credentials) as channel:
            stub = client_pb2_grpc.DLedgerStub(channel)
            try:
                return await stub.TakeSnapshot(client_pb2.TakeSnapshotRequest(group=g.name), timeout=60)
            except grpc.aio.AioRpcError as e:  # reported per node by the caller
                return DLedgerError(f"{e.code().name}: {e.details()}")

    results = await asyncio.gather(*(one(spec) for spec in g.nodes))
    return list(zip(g.nodes, results, strict=True))


# -- append, get ---------------------------------------------------------------------------------------------------


@app.command()
def append(
    bodies: Annotated[list[str], typer.Argument(help="bodies to append (UTF-8 text), one entry each")],
    dir: Annotated[Path | None, typer.Option("--dir", help="a local group directory")] = None,
    addresses: AddressesOpt = None,
) -> None:
    """Append entries; prints index and pos of each once committed."""
    from dledger.client import DLedgerClient

    with DLedgerClient(addresses_of(dir, addresses)) as c:
        try:
            results = c.append_batch([b.encode() for b in bodies])
        except DLedgerError as e:
            _fail(f"{type(e).__name__}: {e}")
    for r in results:
        console.print(f"index {r.index} pos {r.pos} term {r.term}")


@app.command()
def get(
    index: Annotated[int, typer.Argument(help="log index")],
    dir: Annotated[Path | None, typer.Option("--dir", help="a local group directory")] = None,
    addresses: AddressesOpt = None,
) -> None:
    """Print a committed entry."""
    from dledger.client import DLedgerClient

    with DLedgerClient(addresses_of(dir, addresses)) as c:
        try:
            e = c.get(index)
        except DLedgerError as err:
            _fail(f"{type(err).__name__}: {err}")
    kind = {1: "normal", 2: "no-op", 3: "config"}.get(e.magic, str(e.magic))
    console.print(f"index {e.index} term {e.term} pos {e.pos} {kind} {len(e.body)} bytes: {e.body!r}")


# -- demo ----------------------------------------------------------------------------------------------------------


def run_demo(dir: Path, entries: int) -> int:
    """The demo's story, step by step; the group is always stopped at the end. Returns an exit code."""
    from dledger.client import DLedgerClient

    def step(text: str) -> None:
        console.rule(f"[bold]{text}")

    g = grp.create(dir, 3, None)
    try:
        step("1. start a three-node group (separate processes on 127.0.0.1)")
        t0 = time.monotonic()
        for spec in g.nodes:
            grp.start_node(spec)
        leader = grp.wait_for_leader(g)
        console.print(f"leader [green]{leader.id}[/green] elected {time.monotonic() - t0:.2f} s after start")
        _print_status(grp.wait_for_all(g))

        step(f"2. append {entries} entries of 1 KiB (batches of 100)")
        with DLedgerClient(g.addresses, g.name) as c:
            t0 = time.monotonic()
            last = None
            for i in range(0, entries, 100):
                n = min(100, entries - i)
                last = c.append_batch([bytes([65 + (i + k) % 26]) * 1024 for k in range(n)])[-1]
            dt = time.monotonic() - t0
            console.print(
                f"{entries} entries committed in {dt:.2f} s ({entries / dt:,.0f}/s); last index {last.index}"
            )

        step("3. kill -9 the leader")
        f = run_sync(grp.kill_leader_async(g))
        console.print(
            f"killed [red]{f.killed}[/red] (pid {f.pid}); [green]{f.new_leader}[/green] leads after "
            f"[bold]{f.to_leader_s * 1000:.0f} ms[/bold]; appends succeed again after "
            f"[bold]{f.to_append_s * 1000:.0f} ms[/bold]"
        )
        with DLedgerClient([n.address for n in g.nodes if n.id != f.killed], g.name) as c:
            last = c.append_batch([b"written while " + f.killed.encode() + b" was down"] * 100)[-1]
        console.print(f"100 more entries committed without {f.killed}; commit index {last.index}")
        _print_status(grp.status(g))

        step(f"4. restart {f.killed} and watch it catch up")
        t0 = time.monotonic()
        grp.start_node(g.node(f.killed))
        row = grp.wait_caught_up(g, f.killed, last.index)
        if row is None or row.commit_index is None or row.commit_index < last.index:
            console.print(f"[red]{f.killed} did not catch up within 30 s[/red]")
            return 1
        console.print(f"{f.killed} caught up to index {row.commit_index} in {time.monotonic() - t0:.2f} s")
        _print_status(grp.status(g))
        return 0
    except DLedgerError as e:
        err_console.print(f"[red]demo failed:[/red] {e}")
        return 1
    finally:
        step("5. stop the group")
        stopped = grp.stop_group(g)
        console.print(f"stopped {', '.join(stopped)}; no node process is left running")


# Commands of other layers (the KV store, the broker, the audit, chaos, the demo) register themselves as entry
# points of the group ``dledger.cli`` (pyproject.toml): each names a ``register(app)`` function, so this module
# imports none of them and the layers' arrows keep pointing one way.
CLI_ENTRY_POINTS = "dledger.cli"


def register_extensions(target: typer.Typer) -> list[str]:
    """Call every installed ``dledger.cli`` entry point's ``register(target)``; returns their names."""
    from importlib.metadata import entry_points

    names = []
    for ep in sorted(entry_points(group=CLI_ENTRY_POINTS), key=lambda e: e.name):
        try:
            register = ep.load()
        except (
            ImportError
        ) as e:  # a stale install naming a module this tree lacks: the core commands still run
            err_console.print(
                f"[yellow]warning:[/yellow] CLI extension {ep.name} ({ep.value}) not loaded: {e}"
            )
            continue
        register(target)
        names.append(ep.name)
    return names


def main() -> None:
    from dledger import owner
    from dledger.security.cli import register as register_security  # same layer: no entry point needed

    owner.watch()  # DLEDGER_OWNER_PID: stop when the process that owns this one is gone (dledger/owner.py)

    register_security(app)
    register_extensions(app)
    app()


if __name__ == "__main__":
    main()
