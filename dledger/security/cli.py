"""``dledger certs``, ``dledger cert reload|rotate-ca`` and ``dledger user add|remove|grant|revoke|list``
(docs/security.md)."""

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


cert_app = typer.Typer(
    no_args_is_help=True, help="Reload certificates without a restart; rotate a CA (docs/security.md)."
)


@cert_app.command("reload")
def cert_reload(dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """Every node given reads its certificate, key and CA bundle again and uses them, without a restart (as
    SIGHUP does). Each node answers for itself; a node whose files cannot serve keeps its old ones and the
    command exits 1 naming it and the file."""
    from dledger.security.client import call_once

    failed = []
    for address in addresses_of(dir, addresses):
        try:
            out = call_once([address], "ReloadCertificates", {})
        except DLedgerError as e:
            console.print(f"{address}: NOT reloaded: {e}", soft_wrap=True)
            failed.append(address)
            continue
        state = "reloaded" if out["changed"] else "unchanged"
        console.print(
            f"{address}: {state}: {out['certificate']} issued by {out['issuer']}; trusts {out['cas']}"
        )
    if failed:
        fail(f"not reloaded on {', '.join(failed)}")


@cert_app.command("rotate-ca")
def cert_rotate_ca(
    dir: Annotated[
        Path, typer.Option("--dir", help="the CA's directory (ca.pem, ca.key), or a local group's (its tls/)")
    ],
    step: Annotated[
        str,
        typer.Option(
            help="trust: a new CA, ca.pem the bundle of old and new; issue: every certificate anew from the new "
            "CA; finish: the new CA alone. Reload every node (and name server) after each step."
        ),
    ],
) -> None:
    """One step of a rotation to a new CA (docs/security.md, "Rotating certificates")."""
    from dledger.security import certs as c

    tls_dir = dir / "tls" if (dir / "tls" / "ca.pem").exists() else dir
    try:
        if step == "trust":
            c.begin_ca_rotation(tls_dir)
            console.print(f"{tls_dir / 'ca.pem'}: trusts the old and the new CA ({tls_dir / c.NEXT_CA}.pem)")
        elif step == "issue":
            names = c.reissue_from_next_ca(tls_dir)
            console.print(f"issued from the new CA: {', '.join(names) or 'nothing'}")
        elif step == "finish":
            c.finish_ca_rotation(tls_dir)
            console.print(f"{tls_dir / 'ca.pem'}: the new CA alone; the old CA's key is deleted")
        else:
            fail(f"--step must be trust, issue or finish, not {step!r}", 2)
    except FileNotFoundError as e:
        fail(str(e), 2)
    console.print("now reload every node and name server: dledger cert reload --dir ... (or SIGHUP)")


def register(app: typer.Typer) -> None:
    app.command("certs")(certs)
    app.add_typer(cert_app, name="cert")
    app.command("revoke-cert")(revoke_cert)
    app.add_typer(user_app, name="user")
