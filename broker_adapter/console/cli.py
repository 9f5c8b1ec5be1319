"""``dledger console``: the web console of a group or a cluster (docs/console.md).

Registered by ``broker_adapter.cli.register``; Starlette, uvicorn and Jinja2 are imported only when it runs.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dledger import group as grp
from dledger.cliutil import AddressesOpt, DirOpt, addresses_of, console, fail
from dledger.errors import DLedgerError
from dledger.security.config import ClientSecurity

if TYPE_CHECKING:  # the poller (and its clients) are imported when the console runs, not at every CLI start
    from broker_adapter.console.poller import GroupTarget

    Discovery = Callable[[], tuple[list[GroupTarget], dict[str, list[str]]]]


def _targets_of_cluster_dir(d: Path) -> tuple[list[GroupTarget], list[str], ClientSecurity | None]:
    from broker_adapter.cluster import local as cl
    from broker_adapter.console.poller import GroupTarget

    c = cl.load(d)
    assert c is not None
    sec = c.client_security()
    targets = []
    for name in c.groups:
        g = c.group(name)
        ids = tuple(n.id for n in g.nodes)
        targets.append(GroupTarget(name, tuple(g.addresses), sec, Path(c.directory) / name, ids))
    return targets, c.nameserver_addresses, sec


def _discoverer(
    nameservers: list[str], security: ClientSecurity | None, fixed: list[GroupTarget] | None
) -> Discovery:
    """Called by the poller every round: the groups the name servers know (or ``fixed``) and the consumer
    groups' members."""
    from broker_adapter.console.poller import GroupTarget
    from broker_adapter.nameserver.client import NameServerClient

    def discover() -> tuple[list[GroupTarget], dict[str, list[str]]]:
        try:
            with NameServerClient(nameservers, timeout_s=1.0, security=security) as ns:
                info = ns.cluster_info()
        except DLedgerError:
            return list(fixed or []), {}
        members = {m.group: list(m.client_ids) for m in info.consumer_groups}
        if fixed is not None:
            return list(fixed), members
        by_group: dict[str, set[str]] = {}
        for b in info.brokers:
            by_group.setdefault(b.registration.group, set()).add(b.registration.address)
        return [GroupTarget(g, tuple(sorted(a)), security) for g, a in sorted(by_group.items())], members

    return discover


def _console_cert(security: ClientSecurity, hosts: tuple[str, ...]) -> tuple[Path, Path] | None:
    """A certificate for the console from the group's own CA, when its key is at hand (a local group)."""
    from dledger.security.certs import load_or_make_ca, make_service_cert, write_issued

    tls_dir = Path(security.ca_file).parent
    if not (tls_dir / "ca.key").exists():
        return None
    cert, key = tls_dir / "console.pem", tls_dir / "console.key"
    if not (cert.exists() and key.exists()):
        write_issued(
            tls_dir, "console", make_service_cert(load_or_make_ca(tls_dir), "console", "console", hosts)
        )
    return cert, key


def console_cmd(
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: Annotated[
        str | None, typer.Option("--nameservers", help="a cluster's name servers (host:port,...)")
    ] = None,
    listen: Annotated[str, typer.Option("--listen", help="host:port to serve on")] = "127.0.0.1:8765",
    consumer_group: Annotated[
        str, typer.Option("--consumer-group", help="consumer groups to watch, comma separated")
    ] = "",
    cert: Annotated[Path | None, typer.Option("--cert", help="TLS certificate (PEM)")] = None,
    key: Annotated[Path | None, typer.Option("--key", help="TLS private key (PEM)")] = None,
    interval: Annotated[
        float, typer.Option("--interval", help="seconds between topic and offset polls")
    ] = 1.0,
    node_interval: Annotated[
        float, typer.Option("--node-interval", help="seconds between node metadata polls")
    ] = 0.5,
    reports: Annotated[
        Path | None,
        typer.Option("--reports", help="where audits run from the console write (default DIR/audits)"),
    ] = None,
    login_attempts: Annotated[
        int,
        typer.Option(
            "--login-attempts", help="failed sign-ins in a row from one address before it must wait"
        ),
    ] = 5,
    login_backoff: Annotated[
        float,
        typer.Option("--login-backoff", help="seconds of the first wait; doubled at each failure, up to 300"),
    ] = 1.0,
) -> None:
    """A web console: groups, nodes, roles, lag, leader changes, topics, consumer groups' lag and offset reset,
    queue browsing, message search, dead-letter resend, users and the audit (docs/console.md). Served on 127.0.0.1; a secure group's console is served over TLS and
    asks an admin of the group to sign in."""
    import uvicorn

    from broker_adapter.console.app import ConsoleConfig, create_app
    from broker_adapter.console.poller import GroupTarget, Poller

    if login_attempts < 1 or login_backoff <= 0:
        fail(
            f"--login-attempts must be >= 1 and --login-backoff > 0, got {login_attempts}, {login_backoff}", 2
        )
    host, _, port_text = listen.rpartition(":")
    if not host or not port_text.isdigit():
        fail(f"--listen must be host:port, got {listen!r}", 2)
    discover = None
    audit_target: Path | None = None
    try:
        if dir is not None and (dir / "cluster.json").exists():
            targets, ns_addresses, security = _targets_of_cluster_dir(dir)
            discover = _discoverer(ns_addresses, security, targets)
            audit_target = dir
        elif nameservers:
            from broker_adapter.cli import _nameserver_list

            security = ClientSecurity.from_env()
            discover = _discoverer(_nameserver_list(nameservers), security, None)
            targets, _ = discover()
            if not targets:
                fail("the name servers know no broker group yet")
        else:
            nodes = addresses_of(
                dir, addresses, state_machine="broker"
            )  # sets DLEDGER_SECURITY for a secure --dir
            security = ClientSecurity.from_env()
            name, ids = "group", tuple[str, ...]()
            if dir is not None:
                spec = grp.load(dir)
                name, ids = dir.resolve().name, tuple(n.id for n in spec.nodes) if spec else ()
            targets = [GroupTarget(name, tuple(nodes), security, dir, ids if not addresses else ())]
            audit_target = dir
    except DLedgerError as e:
        fail(str(e))
    if security is not None and not security.access_key:
        fail("a secure group's console needs the access keys it polls with (DLEDGER_SECURITY or --dir)", 2)
    if security is not None and cert is None:
        made = _console_cert(security, ("localhost", host))
        if made is None:
            fail("a secure group's console is served over TLS: give --cert and --key", 2)
        cert, key = made
    if (cert is None) != (key is None):
        fail("give both --cert and --key", 2)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and cert is None:
        fail(f"a console on {host} would be served in the clear to other machines: give --cert and --key", 2)

    poller = Poller(
        targets,
        consumer_groups=[g.strip() for g in consumer_group.split(",") if g.strip()],
        interval_s=interval,
        node_interval_s=node_interval,
        discover=discover,
    )
    if reports is None and audit_target is not None:
        reports = audit_target / "audits"
    config = ConsoleConfig(
        poller,
        security=security,
        https=cert is not None,
        audit_target=audit_target,
        reports_dir=reports,
        refresh_ms=max(250, int(interval * 1000)),
        session_secret=os.environ.get("DLEDGER_CONSOLE_SECRET") or secrets.token_urlsafe(32),
        login_attempts=login_attempts,
        login_backoff_s=login_backoff,
    )
    scheme = "https" if cert is not None else "http"
    console.print(f"console on {scheme}://{host}:{port_text}/ ({len(targets)} group(s))", highlight=False)
    uvicorn.run(
        create_app(config),
        host=host,
        port=int(port_text),
        ssl_certfile=str(cert) if cert else None,
        ssl_keyfile=str(key) if key else None,
        log_level="warning",
        loop="asyncio",
        lifespan="on",
    )
