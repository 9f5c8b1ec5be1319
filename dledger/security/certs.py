"""Certificates for a local group: one CA, a certificate per node naming its node id, and client certificates.

A node's identity is its certificate's: the common name is the node id and the subject alternative names carry
it again as ``URI:dledger:node:<id>`` (beside ``DNS:localhost`` and ``IP:127.0.0.1`` so that TLS host checks pass
on a local group). A peer proves it is that node by signing with the certificate's key (docs/security.md,
"Peers"), so a certificate is only as secret as its ``.key`` file: ``write_group`` makes key files 0600.

EC P-256 keys: small, fast handshakes, supported by every gRPC TLS stack.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, mldsa, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dledger.security.identity import GROUP_URI_PREFIX, NODE_URI_PREFIX

# A service that is no node (a tenant's name server, say) carries a name of its own kind,
# ``URI:dledger:<kind>:<name>``, which names no node: its key cannot speak Raft (docs/cluster.md, "Security").
SERVICE_URI_PREFIX = "dledger:"
VALIDITY = dt.timedelta(days=825)


@dataclass(frozen=True, slots=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


# cryptography's CertificateIssuerPrivateKeyTypes as classes: the keys that can sign a certificate.
_ISSUER_KEY_CLASSES: Final = (
    ec.EllipticCurvePrivateKey,
    rsa.RSAPrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
    dsa.DSAPrivateKey,
    mldsa.MLDSA44PrivateKey,
    mldsa.MLDSA65PrivateKey,
    mldsa.MLDSA87PrivateKey,
)


def load_issuer_key(key_pem: bytes) -> CertificateIssuerPrivateKeyTypes:
    """A CA's key: ours are EC, but a CA found in a directory (``load_or_make_ca``) may have any key that signs
    certificates; another kind fails as ``CertificateBuilder.sign`` would."""
    key = serialization.load_pem_private_key(key_pem, None)
    if not isinstance(key, _ISSUER_KEY_CLASSES):
        raise TypeError(f"a {type(key).__name__} cannot sign certificates")
    return key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dledger-py"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def make_ca(name: str = "dledger local CA") -> Issued:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _issue(ca: Issued, cn: str, sans: list[x509.GeneralName], server: bool) -> Issued:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = load_issuer_key(ca.key_pem)
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _host_sans(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    return sans


def make_node_cert(
    ca: Issued,
    node_id: str,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
    group: str | None = None,
) -> Issued:
    """A node's server-and-client certificate: CN and ``URI:dledger:node:<id>`` name the node id; with ``group``
    (a cluster's nodes) ``URI:dledger:group:<group>`` binds it to its group as well."""
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_id)]
    if group is not None:
        sans.append(x509.UniformResourceIdentifier(GROUP_URI_PREFIX + group))
    return _issue(ca, node_id, sans + _host_sans(hosts), server=True)


def make_service_cert(
    ca: Issued, kind: str, name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
) -> Issued:
    """A server certificate for a service that is no node: ``URI:dledger:<kind>:<name>`` and no node id, so its
    key can neither speak Raft nor register as a node of a group."""
    if kind in ("node", "group") or not kind.isidentifier():
        raise ValueError(
            f"a service certificate's kind must be a plain word other than node and group: {kind!r}"
        )
    sans = [x509.UniformResourceIdentifier(f"{SERVICE_URI_PREFIX}{kind}:{name}"), *_host_sans(hosts)]
    return _issue(ca, name, sans, server=True)


def make_client_cert(ca: Issued, name: str) -> Issued:
    """A client certificate (for tools that want one; clients authenticate with access keys, docs/security.md)."""
    return _issue(ca, name, [x509.DNSName(name)], server=False)


def write_issued(directory: Path, name: str, issued: Issued) -> Path:
    """``<name>.pem`` and ``<name>.key`` (0600) under ``directory``; the certificate's path."""
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / f"{name}.pem", issued.cert_pem, False)
    _write(directory / f"{name}.key", issued.key_pem, True)
    return directory / f"{name}.pem"


def load_or_make_ca(directory: Path) -> Issued:
    """The CA in ``directory`` (``ca.pem``, ``ca.key``), made there first if absent."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = directory / "ca.pem", directory / "ca.key"
    if ca_cert.exists() and ca_key.exists():
        return Issued(ca_cert.read_bytes(), ca_key.read_bytes())
    ca = make_ca()
    _write(ca_cert, ca.cert_pem, False)
    _write(ca_key, ca.key_pem, True)
    return ca


def _write(path: Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


# A rotation to a new CA (docs/security.md, "Rotating certificates") keeps the new CA beside the old one until
# every certificate is issued from it: ``ca.pem`` is the bundle both are trusted through meanwhile.
NEXT_CA = "next-ca"


def begin_ca_rotation(directory: Path) -> Issued:
    """Step 1: a new CA in ``directory`` (``next-ca.pem``/``.key``, kept when there already), and ``ca.pem``
    made the bundle of the CA(s) it held and the new one; the new CA."""
    ca_cert, next_cert, next_key = (
        directory / "ca.pem",
        directory / f"{NEXT_CA}.pem",
        directory / f"{NEXT_CA}.key",
    )
    if not ca_cert.exists():
        raise FileNotFoundError(f"no CA in {directory} (ca.pem) to rotate from")
    if next_cert.exists() and next_key.exists():
        new = Issued(next_cert.read_bytes(), next_key.read_bytes())
    else:
        new = make_ca(f"dledger local CA {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S}")
        _write(next_key, new.key_pem, True)
        _write(next_cert, new.cert_pem, False)
    held = ca_cert.read_bytes()
    trusted = {c.fingerprint(hashes.SHA256()) for c in x509.load_pem_x509_certificates(held)}
    if x509.load_pem_x509_certificate(new.cert_pem).fingerprint(hashes.SHA256()) not in trusted:
        _write_atomically(ca_cert, held.rstrip(b"\n") + b"\n" + new.cert_pem, False)
    return new


def reissue(ca: Issued, cert_pem: bytes) -> Issued:
    """A new key and certificate from ``ca`` saying what ``cert_pem`` says: its subject, alternative names (node
    id, group, service name, hosts) and usages; so a node, a name server or a client keeps its identity."""
    old = x509.load_pem_x509_certificate(cert_pem)
    sans = old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    try:
        usages = list(old.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    cn = old.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return _issue(
        ca, str(cn[0].value) if cn else "", list(sans), server=ExtendedKeyUsageOID.SERVER_AUTH in usages
    )


def reissue_from_next_ca(directory: Path) -> list[str]:
    """Step 2: every certificate in ``directory`` issued anew from the new CA (``reissue``), key first, each
    file replaced atomically; the names reissued."""
    next_cert, next_key = directory / f"{NEXT_CA}.pem", directory / f"{NEXT_CA}.key"
    if not next_cert.exists() or not next_key.exists():
        raise FileNotFoundError(f"no new CA in {directory} ({NEXT_CA}.pem/.key): begin the rotation first")
    new = Issued(next_cert.read_bytes(), next_key.read_bytes())
    names = []
    for pem in sorted(directory.glob("*.pem")):
        name = pem.stem
        if name in ("ca", NEXT_CA) or not (directory / f"{name}.key").exists():
            continue
        issued = reissue(new, pem.read_bytes())
        _write_atomically(directory / f"{name}.key", issued.key_pem, True)
        _write_atomically(pem, issued.cert_pem, False)
        names.append(name)
    return names


def finish_ca_rotation(directory: Path) -> None:
    """Step 3: the new CA becomes the CA (``ca.pem`` holds it alone, ``ca.key`` is its key); the old CA's key is
    deleted, so nothing can be issued from it any more."""
    next_cert, next_key = directory / f"{NEXT_CA}.pem", directory / f"{NEXT_CA}.key"
    if not next_cert.exists() or not next_key.exists():
        raise FileNotFoundError(f"no new CA in {directory} ({NEXT_CA}.pem/.key): nothing to finish")
    _write_atomically(directory / "ca.key", next_key.read_bytes(), True)
    _write_atomically(directory / "ca.pem", next_cert.read_bytes(), False)
    next_key.unlink()
    next_cert.unlink()


def _write_atomically(path: Path, data: bytes, private: bool) -> None:
    """Replace ``path`` in one rename, so a process reloading it reads the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    _write(tmp, data, private)
    os.replace(tmp, path)


def multi_address_authority(addresses: list[str]) -> str:
    """The host name a gRPC client checks a node's certificate against when its target names several addresses
    (as the official RocketMQ 5 clients' targets and routes do): an ``ipv4:a:p,b:q`` target has the sorted list,
    joined by ',', as its authority. A node certificate that names it lets such clients verify TLS."""
    return ",".join(sorted(addresses))


def write_group(
    directory: Path,
    node_ids: list[str],
    clients: tuple[str, ...] = ("client",),
    addresses: list[str] | None = None,
    group: str | None = None,
) -> dict[str, Path]:
    """``ca.pem``/``ca.key``, ``<id>.pem``/``<id>.key`` per node and per client name, under ``directory``.
    ``addresses`` (the group's client addresses) adds ``multi_address_authority`` to the node certificates. An existing
    CA there is reused (so certificates can be added to a group later); returns the file map. ``group`` binds the
    node certificates to their group (a cluster under one CA, docs/cluster.md)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = directory / "ca.pem", directory / "ca.key"
    if ca_cert.exists() and ca_key.exists():
        ca = Issued(ca_cert.read_bytes(), ca_key.read_bytes())
    else:
        ca = make_ca()
        _write(ca_cert, ca.cert_pem, False)
        _write(ca_key, ca.key_pem, True)
    out = {"ca": ca_cert}
    hosts = ("localhost", "127.0.0.1", *([multi_address_authority(addresses)] if addresses else []))
    for name, issued in [(n, make_node_cert(ca, n, hosts, group)) for n in node_ids] + [
        (c, make_client_cert(ca, c)) for c in clients
    ]:
        _write(directory / f"{name}.pem", issued.cert_pem, False)
        _write(directory / f"{name}.key", issued.key_pem, True)
        out[name] = directory / f"{name}.pem"
    return out
