"""What a node's certificate and key say about it, as a running node reads them: its node id, the group it is
bound to, its ECDSA key. Issuing certificates is tooling (``dledger.security.certs``, ``dledger certs``); this
is what the library needs of them (docs/security.md).
"""

from __future__ import annotations

from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

NODE_URI_PREFIX: Final = "dledger:node:"
# A cluster's node certificates also name their group (one CA signs every group's nodes, and node ids repeat
# across groups: g0's n0 must not pass for g1's n0).
GROUP_URI_PREFIX: Final = "dledger:group:"


def load_ec_key(key_pem: bytes) -> ec.EllipticCurvePrivateKey:
    """A node's key, which signs with ECDSA (peer proofs, user commands): this module makes only EC keys, and
    another kind fails as its ECDSA ``sign`` would, only sooner."""
    key = serialization.load_pem_private_key(key_pem, None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"a {type(key).__name__} cannot sign with ECDSA")
    return key


def node_identity(cert: x509.Certificate) -> str | None:
    """The node id a certificate names (its ``URI:dledger:node:<id>``), or None for a non-node certificate."""
    return _named(cert, NODE_URI_PREFIX)


def node_group(cert: x509.Certificate) -> str | None:
    """The group a node certificate is bound to (its ``URI:dledger:group:<group>``), or None when it names none
    (a single group's certificates, ``write_group``) or several."""
    return _named(cert, GROUP_URI_PREFIX)


def _named(cert: x509.Certificate, prefix: str) -> str | None:
    """What the certificate's one ``URI:<prefix><name>`` names; None when it has none or several."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    names = [
        u.removeprefix(prefix)
        for u in sans.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(prefix)
    ]
    return names[0] if len(names) == 1 else None
