"""The files a secure local group starts from (``dledger group up --secure``; docs/security.md, "Bootstrap").

    DIR/tls/ca.pem, ca.key           the group's CA (``certs.write_group``)
    DIR/tls/<id>.pem, <id>.key       each node's certificate, naming its node id
    DIR/admin.toml                   the bootstrap admin: access_key and a random secret_key (mode 0600); every
                                     node's [security] admin names it
    DIR/client.toml                  what the CLI uses for this group: ca, access_key, secret_key (mode 0600)

An existing file is kept (a restarted group keeps its keys); a new node gets its certificate from the same CA.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from dledger.errors import ConfigError
from dledger.security import certs

BOOTSTRAP_ADMIN = "admin"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def issue_node_certificate(directory: Path, node_id: str, addresses: list[str]) -> Path:
    """A certificate for a new member of the secure group in ``directory`` from the group's own CA (its key in
    ``tls/ca.key``, as ``group up --secure`` leaves it); the certificate's path. A group whose CA key lives
    elsewhere (a cluster's, or one kept offline) issues by hand: docs/security.md, "Adding a node"."""
    tls_dir = directory / "tls"
    if (tls_dir / f"{node_id}.pem").exists():  # issued by hand (the path this function's refusal names)
        return tls_dir / f"{node_id}.pem"
    if not (tls_dir / "ca.key").exists():
        raise ConfigError(
            f"the group's CA key is not in {tls_dir} (a cluster's groups, or a CA kept offline): issue {node_id}'s "
            f"certificate by hand (`dledger certs --dir <CA dir> --nodes {node_id} [--group G]`, then copy "
            f"{node_id}.pem and {node_id}.key into {tls_dir}) and add it again"
        )
    return certs.write_group(tls_dir, [node_id], clients=(), addresses=addresses)[node_id]


def write_secure_group(directory: Path, node_ids: list[str], addresses: list[str]) -> Path:
    """Certificates, the bootstrap admin and the CLI's settings under ``directory``; returns ``client.toml``."""
    tls_dir = directory / "tls"
    missing = [n for n in node_ids if not (tls_dir / f"{n}.pem").exists()]
    if missing or not (tls_dir / "ca.pem").exists():
        certs.write_group(tls_dir, missing or node_ids, clients=(), addresses=addresses)
    admin, client = directory / "admin.toml", directory / "client.toml"
    if not admin.exists():
        secret = secrets.token_urlsafe(24)
        _write_private(admin, f'access_key = "{BOOTSTRAP_ADMIN}"\nsecret_key = "{secret}"\n')
        _write_private(
            client,
            f'ca = "{tls_dir / "ca.pem"}"\naccess_key = "{BOOTSTRAP_ADMIN}"\nsecret_key = "{secret}"\n',
        )
    return client
