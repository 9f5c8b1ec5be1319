"""Certificates, keys and CA bundles replaced while a node or a name server runs (docs/security.md, "Rotating
certificates").

``Reloadable`` holds the material in use (``Material``: what the certificate, key and CA files held when last
read). ``reload()`` reads the files again, checks the new material before anything uses it (``check_material``:
the key is the certificate's, one CA of the bundle issued it, it names who it must), and only then swaps it and
tells its listeners, which update what they built from it: the peer proof, the verifiers' trusted CAs, the
channels a node dials (made anew, the old ones closed after ``RETIRE_AFTER_S`` so calls in flight finish). A
material that fails the check changes nothing: the error names the file and why, and the old one stays.

The server side is gRPC's dynamic server credentials (``grpc.dynamic_ssl_server_credentials``): gRPC asks
``Reloadable`` before each new TLS handshake, so new connections get the new certificate and the ones already
open keep theirs, with no port closed and no call broken.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypedDict, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from dledger.errors import ConfigError
from dledger.security.config import read_file
from dledger.security.identity import node_group, node_identity
from dledger.security.tls import ca_certificates, issued_by_any

log = logging.getLogger("dledger.security")

RETIRE_AFTER_S: Final = 60.0  # how long a replaced channel stays open for the calls already on it


_retiring: set[asyncio.Task[None]] = set()  # held here: the loop keeps only weak references to tasks


def close_later(close: Callable[[], Awaitable[None]], after_s: float = RETIRE_AFTER_S) -> None:
    """Close what a reload replaced (channels) once the calls already on it had ``after_s`` to end: new calls
    go to its replacement at once, and closing it now would break the ones in flight."""

    async def retire() -> None:
        await asyncio.sleep(after_s)
        await close()

    task = asyncio.get_running_loop().create_task(retire(), name="retire-replaced-channels")
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)


class ReloadSummary(TypedDict):
    """What a reload answers (``dledger cert reload`` prints it)."""

    changed: bool  # False: the files held what was already in use
    certificate: str  # the certificate's subject
    issuer: str
    fingerprint: str  # SHA-256 of the certificate (hex)
    not_after: str  # ISO 8601
    cas: list[str]  # the subjects of the CA bundle's certificates


@dataclass(frozen=True, slots=True)
class Material:
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    def summary(self, changed: bool) -> ReloadSummary:
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        return {
            "changed": changed,
            "certificate": cert.subject.rfc4514_string(),
            "issuer": cert.issuer.rfc4514_string(),
            "fingerprint": cert.fingerprint(hashes.SHA256()).hex(),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "cas": [c.subject.rfc4514_string() for c in ca_certificates(self.ca_pem)],
        }


@dataclass(frozen=True, slots=True)
class MaterialFiles:
    """Where a process reads its material: ``[security]`` cert, key and ca (a node's or a name server's)."""

    cert: Path
    key: Path
    ca: Path
    prefix: str = "[security] "  # how errors name the settings: a node's config table, a name server's flags

    def read(self) -> Material:
        p = self.prefix
        return Material(
            read_file(self.cert, f"{p}cert"), read_file(self.key, f"{p}key"), read_file(self.ca, f"{p}ca")
        )


def check_material(
    m: Material, files: MaterialFiles, node_id: str | None = None, group: str | None = None
) -> None:
    """ConfigError naming the file and what is wrong, unless ``m`` can serve: the bundle holds CAs, the key is
    the certificate's, a CA of the bundle issued the certificate, it is valid now, and (``node_id``) it names
    that node and no other group than ``group``."""
    try:
        cas = ca_certificates(m.ca_pem)
    except ValueError as e:
        raise ConfigError(f"{files.prefix}ca {files.ca}: not a PEM CA bundle ({e})") from None
    for ca in cas:
        try:
            is_ca = ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise ConfigError(
                f"{files.prefix}ca {files.ca}: {ca.subject.rfc4514_string()} is not a CA certificate"
            )
    try:
        cert = x509.load_pem_x509_certificate(m.cert_pem)
    except ValueError as e:
        raise ConfigError(f"{files.prefix}cert {files.cert}: not a PEM certificate ({e})") from None
    try:
        key = serialization.load_pem_private_key(m.key_pem, None)
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"{files.prefix}key {files.key}: not an unencrypted PEM private key ({e})"
        ) from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != cert.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        raise ConfigError(
            f"{files.prefix}key {files.key} is not the key of the certificate {files.cert} (replace both files, "
            "then reload)"
        )
    if not issued_by_any(cert, cas):
        raise ConfigError(
            f"{files.prefix}cert {files.cert} ({cert.subject.rfc4514_string()}) was not issued by a CA of the bundle "
            f"{files.ca}: add its CA to the bundle first (docs/security.md, 'Rotating certificates')"
        )
    now = dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ConfigError(f"{files.prefix}cert {files.cert} is not valid now (expired or not yet valid)")
    if node_id is not None and node_identity(cert) != node_id:
        raise ConfigError(
            f"{files.prefix}cert {files.cert} names node {node_identity(cert)!r}, not this node ({node_id!r})"
        )
    bound = node_group(cert)
    if group is not None and bound is not None and bound != group:
        raise ConfigError(f"{files.prefix}cert {files.cert} is bound to group {bound!r}, not {group!r}")


def _server_config(m: Material) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(m.key_pem, m.cert_pem)])


class Reloadable:
    """The material in use, and the listeners to tell when it changes. Loaded and checked at construction, so a
    process with bad files fails at start, as before."""

    def __init__(self, read: Callable[[], Material], check: Callable[[Material], None]):
        self._read = read
        self._check = check
        material = read()
        check(material)
        self.material = material
        # (generation, server configuration): one attribute, read by gRPC's thread before each TLS handshake.
        self._served: tuple[int, grpc.ServerCertificateConfiguration] = (0, _server_config(material))
        self._fetched = 0
        self._listeners: list[Callable[[Material], None]] = []

    def on_reload(self, listener: Callable[[Material], None]) -> None:
        self._listeners.append(listener)

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS credentials whose certificate follows ``reload()`` (new connections only)."""
        # gRPC's documentation lets the fetcher answer None ("no change"); its type stub does not say so.
        fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], self._fetch)
        return grpc.dynamic_ssl_server_credentials(self._served[1], fetch)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        generation, config = self._served
        if generation == self._fetched:
            return None  # gRPC keeps what it has
        self._fetched = generation
        return config

    def reload(self) -> ReloadSummary:
        """Read the files again; swap and tell the listeners when they changed. ConfigError (nothing changed)
        when the new material cannot serve."""
        material = self._read()
        self._check(material)
        if material == self.material:
            return material.summary(False)
        self.material = material
        self._served = (self._served[0] + 1, _server_config(material))
        for listener in self._listeners:
            listener(material)
        summary = material.summary(True)
        log.info(
            "certificates reloaded: %s issued by %s (sha256 %s), trusting %s",
            summary["certificate"],
            summary["issuer"],
            summary["fingerprint"][:16],
            "; ".join(summary["cas"]),
        )
        return summary
