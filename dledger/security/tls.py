"""gRPC credentials for every port and channel, and how a peer proves which node it is.

Servers: TLS with the node's certificate. Clients: TLS trusting the group's CA, plus call credentials that sign
every call (``auth.SignaturePlugin``). Peers: TLS both ways is the aim, but gRPC Python's server credentials can
either require a client certificate on every connection or request none (there is no "request, optional"), and
one port serves peers and clients alike, including the official RocketMQ clients, which present none. So a
peer proves its identity with its certificate's key on every call instead (docs/decisions/0013-peer-identity-proofs.md):

    x-dledger-node:          the node id it declares
    x-dledger-node-cert-bin: its certificate (DER), which must chain to the group's CA and name that node id
    x-dledger-node-sig-bin:  ECDSA-SHA256 by the certificate's key over "<group>|<node id>|<x-mq-date-time>"
    x-mq-date-time:          within the skew of the receiver's clock

The channel itself is TLS that checks the receiver's certificate against the CA, so a peer only ever sends this
to a member of its group; ``PeerVerifier`` refuses another node's certificate, another CA's, a stale proof and
a bad signature, and logs who and why.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Container, Iterable, Sequence

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dledger.security import auth
from dledger.security.config import ClientSecurity
from dledger.security.identity import load_ec_key, node_group, node_identity

log = logging.getLogger("dledger.security")

NODE = "x-dledger-node"
NODE_CERT = "x-dledger-node-cert-bin"
NODE_SIG = "x-dledger-node-sig-bin"
# The CA names nodes 'localhost'/127.0.0.1; a channel to 127.0.0.1 checks the certificate against that.

Metadata = tuple[tuple[str, str | bytes], ...]  # a call's metadata: "-bin" keys carry bytes, the others text


class PeerIdentityError(Exception):
    """A peer's proof of identity failed: the message says who it claimed to be and why it was refused."""


def server_credentials(cert_pem: bytes, key_pem: bytes) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def ca_certificates(ca_pem: bytes) -> list[x509.Certificate]:
    """The CA certificates of a bundle (one CA, or several during a rotation: docs/security.md, "Rotating
    certificates"); ValueError when it holds none."""
    cas = x509.load_pem_x509_certificates(ca_pem)
    if not cas:
        raise ValueError("no certificate in the CA bundle")
    return cas


def issued_by_any(cert: x509.Certificate, cas: Sequence[x509.Certificate]) -> bool:
    """Whether one of ``cas`` signed ``cert`` directly (the group's CAs issue node certificates themselves)."""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def _proof_payload(group: str, node_id: str, when: str) -> bytes:
    return f"{group}|{node_id}|{when}".encode()


class PeerProofPlugin(grpc.AuthMetadataPlugin):
    """Call credentials of a node's outbound peer channels: its id, certificate and a fresh signature (one per
    second of date-time, reused within it: signing per call would cost the replication path for nothing)."""

    def __init__(self, group: str, node_id: str, cert_pem: bytes, key_pem: bytes):
        self._group = group
        self._id = node_id
        self._signing: tuple[bytes, ec.EllipticCurvePrivateKey]  # (certificate DER, its key)
        self._cached: tuple[str, Metadata]
        self.update(cert_pem, key_pem)

    def update(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Prove with this certificate and key from the next call on (a reload: ``rotation``). Every channel
        made with this plugin, old ones included, sends the new proof; one assignment, so a call being signed
        on gRPC's thread sees the old pair or the new one, never half of each."""
        der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
        self._signing = (der, load_ec_key(key_pem))
        self._cached = ("", ())

    def metadata(self) -> Metadata:
        when = auth.date_time()
        cached = self._cached
        if cached[0] == when:
            return cached[1]
        der, key = self._signing
        sig = key.sign(_proof_payload(self._group, self._id, when), ec.ECDSA(hashes.SHA256()))
        md: Metadata = ((NODE, self._id), (NODE_CERT, der), (NODE_SIG, sig), (auth.DATE_TIME, when))
        if self._signing[0] == der:  # not replaced meanwhile: keep it for the rest of this second
            self._cached = (when, md)
        return md

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        callback(self.metadata(), None)


_ENGINE_HOLDER: list[grpc.Channel] = []  # one channel for the life of the process (``hold_event_engine``)


def hold_event_engine() -> None:
    """Keep one channel, never used and never closed, for the life of the process. Closing the channel that holds
    the last reference to gRPC's event engine shuts the engine down while the closing thread holds the GIL, and
    waits for the engine's threads; one of them may be releasing a Python call-credentials plugin (ours below),
    which needs the GIL: the whole process froze, timeouts and all (grpc/grpc PR 42247; a test worker hung in
    ``Channel.close`` after one call with peer credentials until its CI run was killed). While this channel
    lives, no other channel's close is the last, so none shuts the engine down. It is never freed, not even as
    the interpreter exits (an extra reference): the process's end takes the engine with it."""
    if not _ENGINE_HOLDER:
        holder = grpc.insecure_channel("unix-abstract:dledger-event-engine-holder")  # never dialled
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(holder))
        _ENGINE_HOLDER.append(holder)


def peer_channel_credentials(
    group: str,
    node_id: str,
    cert_pem: bytes,
    key_pem: bytes,
    ca_pem: bytes,
    proof: PeerProofPlugin | None = None,
) -> grpc.ChannelCredentials:
    """TLS trusting only the group's CA (bundle), presenting the node's certificate, with the peer proof on every
    call: ``proof`` when given (a node shares one, which a reload updates), else a new one for this certificate."""
    hold_event_engine()
    tls = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
    plugin = proof if proof is not None else PeerProofPlugin(group, node_id, cert_pem, key_pem)
    return grpc.composite_channel_credentials(tls, grpc.metadata_call_credentials(plugin))


def client_channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials:
    """TLS trusting ``security.ca_file``; with an access key, every call signed (``auth.SignaturePlugin``)."""
    tls = grpc.ssl_channel_credentials(security.ca_file.read_bytes())
    if not security.access_key:
        return tls
    hold_event_engine()
    return grpc.composite_channel_credentials(
        tls, grpc.metadata_call_credentials(auth.SignaturePlugin(security.access_key, security.secret_key))
    )


class PeerVerifier:
    """Checks a peer's proof against the group's CA and members; remembers certificates it has verified."""

    def __init__(
        self,
        group: str,
        ca_pem: bytes,
        members: Callable[[], Container[str]],
        skew_s: int = auth.DEFAULT_SKEW_S,
        revoked: Callable[[], Container[str]] = frozenset,
    ):
        """``ca_pem`` may hold several CAs (a rotation); ``members()`` and ``revoked()`` (fingerprints of revoked
        certificates, ``users.fingerprint``) are asked on every call, so a membership change or a revocation is
        seen at once."""
        self._revoked = revoked
        self._group = group
        self._members = members
        self._skew = skew_s
        self._cas: list[x509.Certificate] = []
        self._certs: dict[bytes, tuple[str, ec.EllipticCurvePublicKey]] = {}  # DER -> (node id it names, key)
        self._proofs: dict[bytes, tuple[str, bytes]] = {}  # signatures verified: (node id, certificate)
        self.set_ca(ca_pem)

    def set_ca(self, ca_pem: bytes) -> None:
        """Trust the CAs of this bundle from now on (a reload): what was verified against the old ones is
        forgotten, so a certificate of a CA no longer in the bundle is refused from the next call on."""
        self._cas = ca_certificates(ca_pem)
        self._certs = {}
        self._proofs = {}

    def _certificate(self, der: bytes, claimed: str) -> tuple[str, ec.EllipticCurvePublicKey]:
        hit = self._certs.get(der)
        if hit is not None:
            return hit
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError as e:
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r} sent an unreadable certificate: {e}"
            ) from None
        if not issued_by_any(cert, self._cas):
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r} presented a certificate ({cert.subject.rfc4514_string()}) "
                "not issued by this group's CA"
            )
        now = dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise PeerIdentityError(f"peer claiming to be {claimed!r} presented an expired certificate")
        identity = node_identity(cert)
        if identity is None:
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r} presented a certificate that names no node"
            )
        bound = node_group(cert)  # a cluster's CA signs every group's nodes: g0's n0 is not g1's
        if bound is not None and bound != self._group:
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r} presented the certificate of {identity!r} of group {bound!r}, "
                f"not of this group ({self._group!r}): refused"
            )
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):  # a proof is an ECDSA signature
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r} presented a certificate whose key cannot check an ECDSA proof"
            )
        self._certs[der] = (identity, key)
        return identity, key

    def verify(self, metadata: Iterable[tuple[str, str | bytes]]) -> str:
        """The node id a call's metadata proves; PeerIdentityError saying who and why otherwise."""
        md = dict(metadata)
        claimed, when = _text(md.get(NODE)), _text(md.get(auth.DATE_TIME))
        der, sig = _binary(md.get(NODE_CERT)), _binary(md.get(NODE_SIG))
        if not claimed or not der or not sig or not when:
            raise PeerIdentityError(
                f"a peer call without a node proof (node {claimed!r}): only members with the group's "
                "certificates may speak the peer protocol"
            )
        try:
            stamp = dt.datetime.strptime(when, auth.DATE_FORMAT).replace(tzinfo=dt.UTC)
        except ValueError:
            raise PeerIdentityError(f"peer {claimed!r}: bad {auth.DATE_TIME} {when[:32]!r}") from None
        if abs((dt.datetime.now(dt.UTC) - stamp).total_seconds()) > self._skew:
            raise PeerIdentityError(f"peer {claimed!r}: proof dated {when} is outside the allowed clock skew")
        # Membership first, on every call: a node removed from the group is refused at once, even with a proof
        # verified a moment ago.
        if claimed not in self._members():
            raise PeerIdentityError(
                f"node {claimed!r} is not a member of this group (a valid certificate is not enough)"
            )
        revoked = self._revoked()
        if revoked and hashlib.sha256(der).hexdigest() in revoked:
            raise PeerIdentityError(f"node {claimed!r} presented a revoked certificate: refused")
        proofs = self._proofs  # the caches of the CAs trusted now (``set_ca`` replaces them)
        if proofs.get(sig) == (claimed, der):  # verified before, and still within the skew
            return claimed
        identity, key = self._certificate(der, claimed)
        if identity != claimed:
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r} presented the certificate of node {identity!r}: refused"
            )
        try:
            key.verify(sig, _proof_payload(self._group, claimed, when), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise PeerIdentityError(
                f"peer claiming to be {claimed!r}: the signature does not match its certificate's key"
            ) from None
        if len(proofs) > 4096:
            proofs.clear()
        proofs[sig] = (claimed, der)
        return claimed


def _text(value: str | bytes | None) -> str | None:
    return value if isinstance(value, str) else None


def _binary(value: str | bytes | None) -> bytes | None:
    return value if isinstance(value, bytes) else None


class _AnyNode:
    """Every node id is a "member" for a verifier outside the groups (``NodeProofVerifier``)."""

    def __contains__(self, node_id: object) -> bool:
        return True


class NodeProofVerifier:
    """Checks the same per-call proof as ``PeerVerifier``, outside any group: a cluster's name servers accept a
    registration from any node of any group whose certificate chains to the cluster's CA and names its group
    (``identity.node_group``). Membership is each group's business; what the caller may do with the proven
    (group, node id) is the name server's (broker_adapter/nameserver/guard.py)."""

    def __init__(self, ca_pem: bytes, skew_s: int = auth.DEFAULT_SKEW_S):
        self._ca_pem = ca_pem
        self._skew = skew_s
        self._by_group: dict[str, PeerVerifier] = {}
        self.set_ca(ca_pem)

    def set_ca(self, ca_pem: bytes) -> None:
        """Trust the CAs of this bundle from now on (a reload; ``PeerVerifier.set_ca``)."""
        ca_certificates(ca_pem)  # refuse a bundle without a certificate before forgetting the old one
        self._ca_pem = ca_pem
        self._by_group = {}

    def verify(self, metadata: Iterable[tuple[str, str | bytes]]) -> tuple[str, str]:
        """(group, node id) that a call's metadata proves; PeerIdentityError saying who and why otherwise."""
        md = list(metadata)
        fields = dict(md)
        claimed, der = fields.get(NODE), fields.get(NODE_CERT)
        if not claimed or not isinstance(der, bytes):
            raise PeerIdentityError(
                f"a call without a node proof (node {claimed!r}): only nodes with a certificate from "
                "the cluster's CA may do this"
            )
        try:
            group = node_group(x509.load_der_x509_certificate(der))
        except ValueError as e:
            raise PeerIdentityError(
                f"node claiming to be {claimed!r} sent an unreadable certificate: {e}"
            ) from None
        if group is None:
            raise PeerIdentityError(
                f"node claiming to be {claimed!r} presented a certificate that names no group (a cluster's "
                "node certificates name theirs: `dledger cluster up --secure`, `dledger certs --group`)"
            )
        verifier = self._by_group.get(group)
        if verifier is None:
            if len(self._by_group) > 1024:
                self._by_group.clear()
            verifier = self._by_group[group] = PeerVerifier(group, self._ca_pem, _AnyNode, self._skew)
        return group, verifier.verify(md)


def client_credentials(security: ClientSecurity | None = None) -> grpc.ChannelCredentials | None:
    """A client's channel credentials: from ``security``, else from the environment (``ClientSecurity.from_env``);
    None means plaintext (a group without security)."""
    security = security if security is not None else ClientSecurity.from_env()
    return client_channel_credentials(security) if security is not None else None


def sync_channel(
    address: str, credentials: grpc.ChannelCredentials | None, options: Sequence[tuple[str, int | str]]
) -> grpc.Channel:
    """A blocking channel: TLS with ``credentials``, else plaintext."""
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=options)
    return grpc.insecure_channel(address, options=options)
