"""``dledger nameserver`` and ``dledger cluster up|status|watch|down|topic|certs`` (registered by ``dledger.cli``).

A cluster is name servers plus broker groups (``broker_adapter.cluster.local``); see docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from broker_adapter.cluster import local as cl
from broker_adapter.nameserver.client import NameServerClient
from dledger import group as grp
from dledger.cliutil import console, fail
from dledger.errors import DLedgerError

cluster_app = typer.Typer(
    no_args_is_help=True, help="Run a local cluster: name servers and several broker groups on 127.0.0.1."
)
ClusterDir = Annotated[Path, typer.Option("--dir", help="the cluster's directory")]


def nameserver(
    listen: Annotated[str, typer.Option(help="host:port to serve on")] = f"127.0.0.1:{9876}",
    broker_expiry_ms: Annotated[
        int, typer.Option(help="drop a broker node silent for this long (RocketMQ: 120 s)")
    ] = 120_000,
    consumer_expiry_ms: Annotated[
        int, typer.Option(help="drop a consumer silent for this long; its queues move to the others")
    ] = 10_000,
    cert: Annotated[
        Path | None,
        typer.Option(help="TLS: this name server's certificate (`dledger cluster certs --nameservers`)"),
    ] = None,
    key: Annotated[Path | None, typer.Option(help="TLS: its private key")] = None,
    ca: Annotated[
        Path | None, typer.Option(help="the cluster's CA: brokers register with certificates it issued")
    ] = None,
    admin: Annotated[
        Path | None, typer.Option(help="the bootstrap admin's keys (access_key, secret_key), as the nodes'")
    ] = None,
    users: Annotated[
        Path | None,
        typer.Option(
            help="more clients allowed to ask: [[user]] tables with access_key, secret_key and the "
            'consumer_groups they may join (["*"]: any)'
        ),
    ] = None,
    skew_s: Annotated[int, typer.Option(help="allowed clock distance of a signed call's date-time")] = 900,
) -> None:
    """Run a name server: broker nodes register and heartbeat, clients ask where a topic lives. With --cert,
    --key, --ca and --admin: TLS, brokers prove who they are, clients sign (docs/cluster.md, "Security")."""
    from broker_adapter.nameserver.guard import NameServerSecurity
    from broker_adapter.nameserver.registry import Registry
    from broker_adapter.nameserver.service import serve
    from dledger.nodeconfig import parse_address

    try:
        parse_address(listen, "--listen")
    except DLedgerError as e:
        fail(str(e))
    if broker_expiry_ms < 100 or consumer_expiry_ms < 100:
        fail("--broker-expiry-ms and --consumer-expiry-ms must be at least 100")
    given = {"--cert": cert, "--key": key, "--ca": ca, "--admin": admin}
    security = None
    if any(v is not None for v in given.values()) or users is not None:
        missing = [k for k, v in given.items() if v is None]
        if missing:
            fail(
                f"a secure name server needs --cert, --key, --ca and --admin: missing {', '.join(missing)}", 2
            )
        if not 1 <= skew_s <= 86_400:
            fail(f"--skew-s must be in 1..86400, got {skew_s}", 2)
        security = NameServerSecurity(cert, key, ca, admin, users, skew_s)  # type: ignore[arg-type]
        try:
            security.load()  # every file read and checked before the server starts
        except DLedgerError as e:
            fail(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = Registry(broker_expiry_ms, consumer_expiry_ms)
    try:
        asyncio.run(serve(listen, registry, security=security))
    except OSError as e:
        fail(str(e))


@cluster_app.command("up")
def cluster_up(
    dir: ClusterDir,
    groups: Annotated[int, typer.Option(help="broker groups (each a Raft group)")] = 2,
    nodes: Annotated[int, typer.Option(help="nodes per group")] = 3,
    nameservers: Annotated[int, typer.Option(help="name servers")] = 1,
    flush: Annotated[str, typer.Option(help="sync or async")] = "sync",
    secure: Annotated[
        bool,
        typer.Option(
            "--secure", help="TLS and authentication everywhere: one CA, node and name server certificates"
        ),
    ] = False,
    preferred_leader: Annotated[
        str | None,
        typer.Option(
            help="each new group's preferred leader: a node id, or 'lowest': the node whose address sorts "
            "first (the one the RocketMQ Python client dials)"
        ),
    ] = None,
) -> None:
    """Start name servers and broker groups in the background; return once every group is registered."""
    try:
        c = cl.up(
            dir, groups, nodes, nameservers, flush=flush, secure=secure, preferred_leader=preferred_leader
        )
    except DLedgerError as e:
        fail(str(e))
    console.print(
        f"cluster [bold]{c.name}[/bold] is up in {dir}: {len(c.groups)} groups, name servers "
        f"{','.join(c.nameserver_addresses)}"
    )
    if c.security:
        console.print(
            f"secure: clients use {c.security} (dledger --security {c.security} produce --nameservers ...)"
        )
    console.print(_table(c))


@cluster_app.command("down")
def cluster_down(dir: ClusterDir) -> None:
    """Stop every node of every group, then the name servers."""
    try:
        c = cl.load(dir)
    except DLedgerError as e:
        fail(str(e))
    stopped = cl.down(c)
    console.print(f"stopped {', '.join(stopped) if stopped else 'nothing (nothing was running)'}")


def _rows(c: cl.ClusterSpec) -> list[dict]:
    registered: dict[tuple[str, str], int] = {}
    try:
        with NameServerClient(c.nameserver_addresses, timeout_s=0.5, security=c.client_security()) as ns:
            for b in ns.cluster_info().brokers:
                registered[(b.registration.group, b.registration.node_id)] = b.age_ms
    except DLedgerError:
        pass  # every name server is down: the column says so
    rows = []
    for gname in c.groups:
        for r in grp.status(c.group(gname)):
            row = {"group": gname, **r.to_json()}
            row["registered_age_ms"] = registered.get((gname, r.id))
            rows.append(row)
    return rows


def _table(c: cl.ClusterSpec, title: str | None = None) -> Table:
    t = Table(title=title)
    for col in ("group", "node", "address", "role", "term", "commit index", "name server"):
        t.add_column(col, justify="right" if col in ("term", "commit index") else "left")
    styles = {"leader": "bold green", "follower": "cyan", "candidate": "yellow", "down": "red"}
    for r in _rows(c):
        age = r["registered_age_ms"]
        seen = "[red]not registered[/]" if age is None else f"seen {age / 1000:.1f} s ago"
        t.add_row(
            r["group"],
            r["id"],
            r["address"],
            f"[{styles.get(r['role'], '')}]{r['role']}[/]",
            "" if r.get("term") is None else str(r["term"]),
            "" if r.get("commit_index") is None else str(r["commit_index"]),
            seen,
        )
    return t


@cluster_app.command("status")
def cluster_status(
    dir: ClusterDir, as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False
) -> None:
    """Every node of every group (role, term, commit index) and whether the name servers have it."""
    try:
        c = cl.load(dir)
    except DLedgerError as e:
        fail(str(e))
    if as_json:
        print(json.dumps({"cluster": c.name, "nameservers": c.nameserver_addresses, "nodes": _rows(c)}))
    else:
        console.print(_table(c))


@cluster_app.command("watch")
def cluster_watch(
    dir: ClusterDir,
    interval: Annotated[float, typer.Option(help="refresh period in seconds")] = 0.5,
    duration: Annotated[
        float | None, typer.Option(help="stop after this many seconds (default: Ctrl-C)")
    ] = None,
) -> None:
    """A live table of the cluster."""
    try:
        c = cl.load(dir)
    except DLedgerError as e:
        fail(str(e))
    end = None if duration is None else time.monotonic() + duration
    try:
        with Live(_table(c), console=console, refresh_per_second=4) as live:
            while end is None or time.monotonic() < end:
                time.sleep(interval)
                live.update(_table(c, title=time.strftime("%H:%M:%S")))
    except KeyboardInterrupt:
        pass


@cluster_app.command("topic")
def cluster_topic(
    dir: ClusterDir,
    topic: Annotated[str, typer.Option("--topic", help="topic name")],
    queues: Annotated[int, typer.Option("--queues", help="queues in each group")] = 4,
) -> None:
    """Create a topic in every group of the cluster (its queues span the groups)."""
    try:
        c = cl.load(dir)
        cl.create_topic(c, topic, queues)
    except DLedgerError as e:
        fail(str(e))
    console.print(f"topic {topic}: {queues} queues in each of {len(c.groups)} groups")


@cluster_app.command("certs")
def cluster_certs(
    dir: Annotated[
        Path, typer.Option("--dir", help="the CA's directory (`dledger certs --dir`): ca.pem, ca.key")
    ],
    nameservers: Annotated[str, typer.Option(help="name server certificate names, comma separated")],
    hosts: Annotated[
        str, typer.Option(help="host names and addresses the certificates name, comma separated")
    ] = "localhost,127.0.0.1",
) -> None:
    """Certificates for a cluster's name servers from the CA in --dir (made there first if absent): they name a
    name server, never a node, so their keys can neither register as a broker node nor speak Raft."""
    from dledger.security.certs import load_or_make_ca, make_service_cert, write_issued

    ca = load_or_make_ca(dir)
    names = tuple(h.strip() for h in hosts.split(",") if h.strip())
    for name in [n.strip() for n in nameservers.split(",") if n.strip()]:
        path = write_issued(dir, name, make_service_cert(ca, "nameserver", name, names))
        console.print(f"{name:>8}  {path}")


def register(app: typer.Typer) -> None:
    app.command("nameserver")(nameserver)
    app.add_typer(cluster_app, name="cluster")
