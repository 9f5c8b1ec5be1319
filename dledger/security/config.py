"""What a node and a client need to know to speak securely: file paths and keys, checked once.

A node's ``[security]`` table (dledger/nodeconfig.py) turns TLS and authentication on together::

    [security]
    cert = "tls/n0.pem"       # this node's certificate (its node id in CN and URI SAN: dledger certs)
    key = "tls/n0.key"
    ca = "tls/ca.pem"         # the group's CA: peers' certificates must chain to it
    admin = "admin.toml"      # the bootstrap admin: access_key and secret_key (docs/security.md)
    skew_s = 900              # allowed distance of a client's x-mq-date-time from this node's clock

A client's settings (``ClientSecurity``) come from arguments, a TOML file (``ca``, ``access_key``,
``secret_key``) or the environment (``DLEDGER_SECURITY`` naming such a file, or ``DLEDGER_CA_FILE``,
``DLEDGER_ACCESS_KEY``, ``DLEDGER_SECRET_KEY``), so every command of the CLI takes them the same way.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.errors import ConfigError
from dledger.security.auth import DEFAULT_SKEW_S

_KEYS = {"cert", "key", "ca", "admin", "skew_s"}


def read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None


def read_credentials(path: Path) -> tuple[str, str]:
    """(access_key, secret_key) from a TOML file; ConfigError naming what is missing."""
    try:
        raw = tomllib.loads(read_file(path, "credentials file").decode())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"credentials file {path} is not valid TOML: {e}") from None
    ak, sk = raw.get("access_key"), raw.get("secret_key")
    if not isinstance(ak, str) or not ak or not isinstance(sk, str) or not sk:
        raise ConfigError(f"credentials file {path} needs access_key and secret_key (strings)")
    return ak, sk


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    cert: Path
    key: Path
    ca: Path
    admin: Path
    skew_s: int = DEFAULT_SKEW_S

    def __post_init__(self) -> None:
        if (
            isinstance(self.skew_s, bool)
            or not isinstance(self.skew_s, int)
            or not 1 <= self.skew_s <= 86_400
        ):
            raise ConfigError(f"[security] skew_s must be an integer in 1..86400, got {self.skew_s!r}")

    @classmethod
    def from_table(cls, table: Mapping[str, Any], base: Path) -> SecurityConfig:
        """From a config file's ``[security]`` table; relative paths are relative to the file's directory."""
        unknown = set(table) - _KEYS
        if unknown:
            raise ConfigError(f"[security]: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
        missing = sorted(k for k in ("cert", "key", "ca", "admin") if not table.get(k))
        if missing:
            raise ConfigError(f"[security]: missing {', '.join(missing)} (see docs/security.md)")
        paths = {k: (base / str(table[k])) for k in ("cert", "key", "ca", "admin")}
        return cls(**paths, skew_s=table.get("skew_s", DEFAULT_SKEW_S))

    def load(self) -> tuple[bytes, bytes, bytes, tuple[str, str]]:
        """(cert, key, ca) PEM bytes and the bootstrap admin's (access_key, secret_key)."""
        return (
            read_file(self.cert, "[security] cert"),
            read_file(self.key, "[security] key"),
            read_file(self.ca, "[security] ca"),
            read_credentials(self.admin),
        )


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """TLS roots and the access key pair a client signs its calls with."""

    ca_file: Path
    access_key: str = ""
    secret_key: str = ""

    def __repr__(self) -> str:  # never the secret
        return f"ClientSecurity(ca_file={str(self.ca_file)!r}, access_key={self.access_key!r})"

    @classmethod
    def from_file(cls, path: Path) -> ClientSecurity:
        try:
            raw = tomllib.loads(read_file(Path(path), "client security file").decode())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"client security file {path} is not valid TOML: {e}") from None
        if not raw.get("ca"):
            raise ConfigError(f"client security file {path} needs ca = <CA certificate file>")
        ca = Path(raw["ca"])
        if not ca.is_absolute():
            ca = Path(path).parent / ca
        return cls(ca, str(raw.get("access_key", "")), str(raw.get("secret_key", "")))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSecurity | None:
        env = os.environ if env is None else env
        if env.get("DLEDGER_SECURITY"):
            return cls.from_file(Path(env["DLEDGER_SECURITY"]))
        if env.get("DLEDGER_CA_FILE"):
            return cls(
                Path(env["DLEDGER_CA_FILE"]),
                env.get("DLEDGER_ACCESS_KEY", ""),
                env.get("DLEDGER_SECRET_KEY", ""),
            )
        return None
