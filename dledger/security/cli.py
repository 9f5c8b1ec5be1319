"""``dledger certs`` and ``dledger user add|remove|grant|revoke|list`` (docs/security.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dledger.cliutil import AddressesOpt, DirOpt, addresses_of, console, fail
from dledger.errors import DLedgerError

if TYPE_CHECKING:  # the commands import what they use when they run: the CLI starts without cryptography
    from dledger.security.users import UserListing

user_app = typer.Typer(no_args_is_help=True, help="Users and permissions of a secure group (replicated).")


def certs(
    dir: Annotated[Path, typer.Option("--dir", help="where to write ca.pem/.key and one .pem/.key per name")],
    nodes: Annotated[
        str, typer.Option(help="node ids, comma separated (their certificates name them)")
    ] = "n0,n1,n2",
    clients: Annotated[str, typer.Option(help="client certificate names, comma separated")] = "",
    addresses: Annotated[
        str,
        typer.Option(
            help="the nodes' client addresses, comma separated (for clients dialling all in one target)"
        ),
    ] = "",
    group: Annotated[
        str,
        typer.Option(help="bind the node certificates to this group (a cluster's groups under one CA)"),
    ] = "",
) -> None:
    """Create a CA (or reuse the one in --dir) and certificates for nodes and clients of a local group."""
    from dledger.security.certs import write_group

    node_ids = [n.strip() for n in nodes.split(",") if n.strip()]
    addrs = [a.strip() for a in addresses.split(",") if a.strip()] or None
    clients_ = tuple(c.strip() for c in clients.split(",") if c.strip())
    out = write_group(dir, node_ids, clients_, addrs, group.strip() or None)
    for name, path in out.items():
        console.print(f"{name:>8}  {path}")


def _call(dir: Path | None, addresses: str | None, method: str, request: dict[str, Any]) -> Any:
    """The method's JSON answer (its shape is the method's: ``users.UserListing`` for ListUsers)."""
    from dledger.security.client import call_once

    try:
        return call_once(addresses_of(dir, addresses), method, request)
    except DLedgerError as e:
        fail(str(e))


@user_app.command("add")
def user_add(
    access_key: Annotated[str, typer.Argument(help="the user's access key (its name)")],
    secret_key: Annotated[str, typer.Option(help="the user's secret key (8-256 printable characters)")],
    permission: Annotated[
        list[str] | None,
        typer.Option("--permission", "-p", help="admin, publish:TOPIC, subscribe:TOPIC:GROUP"),
    ] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Add a user (through the log: every node knows it once this returns)."""
    r = {"access_key": access_key, "secret_key": secret_key, "permissions": permission or []}
    console.print(json.dumps(_call(dir, addresses, "AddUser", r)))


@user_app.command("remove")
def user_remove(access_key: str, dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """Remove a user."""
    console.print(json.dumps(_call(dir, addresses, "RemoveUser", {"access_key": access_key})))


@user_app.command("grant")
def user_grant(
    access_key: str,
    permission: Annotated[
        str, typer.Argument(help="admin, publish:TOPIC or subscribe:TOPIC:GROUP ('*': any)")
    ],
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Grant a user a permission."""
    r = {"access_key": access_key, "permission": permission}
    console.print(json.dumps(_call(dir, addresses, "Grant", r)))


@user_app.command("revoke")
def user_revoke(access_key: str, permission: str, dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """Take a permission back."""
    r = {"access_key": access_key, "permission": permission}
    console.print(json.dumps(_call(dir, addresses, "Revoke", r)))


@user_app.command("list")
def user_list(dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """Every user and its permissions (never a secret)."""
    out: UserListing = _call(dir, addresses, "ListUsers", {})
    console.print(f"bootstrap admin (from the nodes' config): {out['bootstrap_admin']}")
    for u in out["users"]:
        console.print(f"{u['access_key']:<24} {', '.join(u['permissions']) or '-'}")
    for r in out.get("revoked_certificates", []):
        console.print(f"revoked certificate of {r['node'] or '?'}: sha256 {r['fingerprint']}")


def revoke_cert(
    cert: Annotated[Path, typer.Argument(help="the node certificate (PEM) no peer may accept any more")],
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Revoke a node certificate (through the log): every member refuses its peer proof from the moment the entry
    is in its log, though the CA still vouches for it (docs/security.md, "Revocation")."""
    try:
        pem = cert.read_text()
    except OSError as e:
        fail(f"cannot read {cert}: {e}")
    out = _call(dir, addresses, "RevokeCertificate", {"certificate": pem})
    console.print(f"revoked the certificate of {out['node'] or '?'} (sha256 {out['fingerprint']})")


def register(app: typer.Typer) -> None:
    app.command("certs")(certs)
    app.command("revoke-cert")(revoke_cert)
    app.add_typer(user_app, name="user")
