"""Users and their permissions, replicated through the log so that every node agrees and a failover keeps them.

A user command is a log entry shaped like the broker's commands (docs/formats.md)::

    0   TOTALSIZE  4
    4   MAGIC      4   0x444C5343 ("DLSC")
    8   OP         1   1 add, 2 remove, 3 grant, 4 revoke
    9   INDEX      8   the entry's own log index (filled in by the leader's prepare)
    17  SIGNATURE  64  ECDSA P-256 r||s by the proposing node's certificate key over
                       "DLSC1|<group>|" + INDEX + OP + CERT + PAYLOAD
    81  CERTLEN    2
    83  CERT       n   the proposing node's certificate (DER)
    ..  PAYLOAD        UTF-8 JSON object

Only a node can sign one (with its certificate's key, which chains to the group's CA and names a node), and the
signature binds the entry's index, so bytes a client manages to place in an entry (a KV key, a raw append) can
neither forge a command nor replay an old one. ``SecuredStateMachine`` wraps the node's own state machine
(broker, kv, counter or none): a verified user command goes to the ``UserStore``, every other entry (an
unverifiable one included) to the wrapped machine, in log order; a snapshot holds both.

Permissions (docs/security.md, "Permissions"): ``admin`` (topics, users, snapshots, leadership, membership, the
raw log), ``publish:<topic>`` and ``subscribe:<topic>:<group>``; ``*`` matches any topic or group.
The bootstrap admin comes from the node's config, not the log (it is how the first user gets added).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final, TypedDict

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

from dledger.core.messages import Prepare
from dledger.security.identity import load_ec_key, node_identity
from dledger.security.tls import ca_certificates, issued_by_any
from statemachine.api import CommittedEntry, StateMachine

USER_MAGIC: Final = 0x444C5343  # b"DLSC"
_HEAD: Final = struct.Struct(">iIB")
OP_ADD: Final = 1
OP_REMOVE: Final = 2
OP_GRANT: Final = 3
OP_REVOKE: Final = 4
OP_REVOKE_CERT: Final = 5  # a node certificate no peer accepts any more (its SHA-256 fingerprint)
_FINGERPRINT_RE: Final = re.compile(r"^[0-9a-f]{64}$")
_SNAPSHOT_MAGIC: Final = b"DLSCSNP1"
ACCESS_KEY_RE: Final = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_NAME_RE: Final = re.compile(r"^(\*|[%|a-zA-Z0-9_-]{1,127})$")


class UserError(ValueError):
    """A user command that cannot be applied (unknown user, bad permission): every node refuses it alike."""


def parse_permission(text: str) -> str:
    """A permission's canonical form; UserError saying what is accepted otherwise."""
    parts = text.strip().split(":")
    ok = (
        (parts == ["admin"])
        or (len(parts) == 2 and parts[0] == "publish" and _NAME_RE.match(parts[1]))
        or (len(parts) == 3 and parts[0] == "subscribe" and all(_NAME_RE.match(p) for p in parts[1:]))
    )
    if not ok:
        raise UserError(
            f"permission {text!r} is not admin, publish:<topic> or subscribe:<topic>:<group> ('*' for any)"
        )
    return ":".join(parts)


class PublicUser(TypedDict):
    """A user as ``user list`` shows it: never the secret."""

    access_key: str
    permissions: list[str]


class RevokedCertificate(TypedDict):
    fingerprint: str  # SHA-256 of the certificate's DER, hex
    node: str  # the node id it named


class UserListing(TypedDict):
    """The answer of ListUsers (``dledger user list``)."""

    users: list[PublicUser]
    bootstrap_admin: str
    revoked_certificates: list[RevokedCertificate]


@dataclass
class User:
    access_key: str
    secret_key: str = field(repr=False)
    permissions: set[str] = field(default_factory=set)

    def allows(self, permission: str) -> bool:
        if "admin" in self.permissions or permission in self.permissions:
            return True
        kind, _, rest = permission.partition(":")
        want = rest.split(":")
        for p in self.permissions:
            pk, _, prest = p.partition(":")
            have = prest.split(":")
            if (
                pk == kind
                and len(have) == len(want)
                and all(h in ("*", w) for h, w in zip(have, want, strict=True))
            ):
                return True
        return False

    def public(self) -> PublicUser:
        """What ``user list`` shows: never the secret."""
        return {"access_key": self.access_key, "permissions": sorted(self.permissions)}


_INDEX: Final = struct.Struct(">q")
_SIG_AT: Final = _HEAD.size + _INDEX.size  # 17
_SIG_SIZE: Final = 64
_CERT_AT: Final = _SIG_AT + _SIG_SIZE + 2  # 83


def encode(op: int, payload: dict[str, Any], cert_der: bytes) -> bytes:
    """An unsigned command (index and signature zero) proposed by the node whose certificate is ``cert_der``."""
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    body = _INDEX.pack(0) + bytes(_SIG_SIZE) + struct.pack(">H", len(cert_der)) + cert_der + raw
    return _HEAD.pack(_HEAD.size + len(body), USER_MAGIC, op) + body


def _signed_bytes(group: str, body: bytes | bytearray | memoryview) -> bytes:
    b = bytes(body)
    return b"DLSC1|" + group.encode() + b"|" + b[_HEAD.size : _SIG_AT] + b[8:9] + b[_SIG_AT + _SIG_SIZE :]


def signer(group: str, key_pem: bytes) -> Prepare:
    """The leader's ``prepare`` for user commands: writes the entry's index and signs it (same length)."""
    key = load_ec_key(key_pem)

    def prepare(index: int, pos: int, body: bytes) -> bytes:
        b = bytearray(body)
        _INDEX.pack_into(b, _HEAD.size, index)
        r, s_ = decode_dss_signature(key.sign(_signed_bytes(group, b), ec.ECDSA(hashes.SHA256())))
        b[_SIG_AT : _SIG_AT + _SIG_SIZE] = r.to_bytes(32, "big") + s_.to_bytes(32, "big")
        return bytes(b)

    return prepare


class CommandVerifier:
    """Is an entry a user command a node of this group signed for exactly this index? Deterministic: every node
    answers alike for the same entry (same CA, same group), so every node routes it alike."""

    def __init__(self, group: str, ca_pem: bytes):
        self._group = group
        self._cas: list[x509.Certificate] = []
        self._keys: dict[bytes, Any] = {}  # certificate DER -> public key, for certificates that passed
        self.add_ca(ca_pem)

    def add_ca(self, ca_pem: bytes) -> None:
        """Trust the CAs of this bundle too (a reload, docs/security.md "Rotating certificates"). None is ever
        dropped while the node runs: a command's verdict must not depend on when a node reloaded, and the
        commands the old CA's nodes signed stay valid; after a restart only the configured bundle counts (take
        a snapshot before dropping a CA)."""
        known = {c.fingerprint(hashes.SHA256()) for c in self._cas}
        self._cas += [c for c in ca_certificates(ca_pem) if c.fingerprint(hashes.SHA256()) not in known]

    def _key(self, der: bytes) -> Any | None:
        if der in self._keys:
            return self._keys[der]
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return None
        if not issued_by_any(cert, self._cas):
            return None
        if node_identity(cert) is None:
            return None
        self._keys[der] = key = cert.public_key()
        return key

    def verify(self, body: bytes | memoryview, index: int) -> bool:
        if not is_user_command(body) or len(body) < _CERT_AT:
            return False
        b = bytes(body)
        if _INDEX.unpack_from(b, _HEAD.size)[0] != index:
            return False
        (n,) = struct.unpack_from(">H", b, _CERT_AT - 2)
        key = self._key(b[_CERT_AT : _CERT_AT + n])
        if key is None:
            return False
        sig = b[_SIG_AT : _SIG_AT + _SIG_SIZE]
        der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
        try:
            key.verify(der, _signed_bytes(self._group, b), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True


def payload(body: bytes | memoryview) -> tuple[int, dict[str, Any]]:
    """(op, payload) of a user command."""
    b = bytes(body)
    (n,) = struct.unpack_from(">H", b, _CERT_AT - 2)
    return b[8], json.loads(b[_CERT_AT + n :])


def is_user_command(body: bytes | memoryview) -> bool:
    return len(body) >= _HEAD.size and struct.unpack_from(">I", body, 4)[0] == USER_MAGIC


def fingerprint(cert_der: bytes) -> str:
    """A certificate's SHA-256 fingerprint (hex): how the revocation list names it."""
    return hashlib.sha256(cert_der).hexdigest()


class UserStore:
    """Access key -> ``User``, and the revoked node certificates; changed only by applying committed user
    commands."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.revoked_certs: dict[str, str] = {}  # fingerprint -> the node id it named (a label)

    def apply_one(self, body: bytes | memoryview) -> Any:
        """Apply a verified user command (``CommandVerifier``); its result, or a ``UserError``."""
        try:
            op, p = payload(body)
            if op == OP_REVOKE_CERT:
                fp = str(p["fingerprint"])
                if not _FINGERPRINT_RE.match(fp):
                    return UserError(f"a certificate fingerprint is 64 hex digits (SHA-256), got {fp[:80]!r}")
                self.revoked_certs[fp] = str(p.get("node", ""))
                return {"fingerprint": fp, "node": self.revoked_certs[fp], "revoked": True}
            ak = p["access_key"]
            if op == OP_ADD:
                if ak in self.users:
                    return UserError(f"user {ak!r} exists; remove it first to change its secret")
                self.users[ak] = User(
                    ak, p["secret_key"], {parse_permission(x) for x in p.get("permissions", [])}
                )
                return self.users[ak].public()
            user = self.users.get(ak)
            if user is None:
                return UserError(f"no user {ak!r}")
            if op == OP_REMOVE:
                del self.users[ak]
                return {"access_key": ak, "removed": True}
            if op in (OP_GRANT, OP_REVOKE):
                perm = parse_permission(p["permission"])
                (user.permissions.add if op == OP_GRANT else user.permissions.discard)(perm)
                return user.public()
            return UserError(f"unknown user command op {op}")
        except UserError as e:
            return e
        except (ValueError, KeyError, TypeError, struct.error) as e:
            return UserError(f"malformed user command: {type(e).__name__}: {e}")

    def to_json(self) -> bytes:
        users = {ak: [u.secret_key, sorted(u.permissions)] for ak, u in sorted(self.users.items())}
        if not self.revoked_certs:  # the format of snapshots taken before revocations existed
            return json.dumps(users).encode()
        return json.dumps(
            {"v": 2, "users": users, "revoked_certs": dict(sorted(self.revoked_certs.items()))}
        ).encode()

    def load_json(self, raw: bytes) -> None:
        doc = json.loads(raw)
        if isinstance(doc.get("v"), int):  # an access key's entry is a list, never a number
            users, self.revoked_certs = doc["users"], dict(doc.get("revoked_certs", {}))
        else:
            users, self.revoked_certs = doc, {}
        self.users = {ak: User(ak, sk, set(perms)) for ak, (sk, perms) in users.items()}


class SecuredStateMachine:
    """The node's state machine with the user store beside it (same name, so existing snapshots still load)."""

    def __init__(self, inner: StateMachine | None, users: UserStore, verifier: CommandVerifier):
        self.inner = inner
        self.users = users
        self.verifier = verifier
        self.name = inner.name if inner is not None else "users"

    def __getattr__(self, attr: str) -> Any:  # e.g. the broker's applied_index, read by tools
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(attr)
        return getattr(inner, attr)

    def apply(self, entries: Sequence[CommittedEntry]) -> list[Any]:
        results: list[Any] = []
        run: list[CommittedEntry] = []
        for e in entries:
            if is_user_command(e.body) and self.verifier.verify(e.body, e.index):
                if run:
                    results.extend(self._inner(run))
                    run = []
                results.append(self.users.apply_one(e.body))
            else:
                run.append(e)
        if run:
            results.extend(self._inner(run))
        return results

    def _inner(self, run: list[CommittedEntry]) -> list[Any]:
        return self.inner.apply(run) if self.inner is not None else [None] * len(run)

    def save_snapshot(self, writer: BinaryIO) -> None:
        raw = self.users.to_json()
        writer.write(_SNAPSHOT_MAGIC + struct.pack(">I", len(raw)) + raw)
        if self.inner is not None:
            self.inner.save_snapshot(writer)

    def load_snapshot(self, reader: BinaryIO) -> None:
        head = reader.read(len(_SNAPSHOT_MAGIC))
        if head == _SNAPSHOT_MAGIC:
            (n,) = struct.unpack(">I", reader.read(4))
            self.users.load_json(reader.read(n))
        else:  # a snapshot taken before security was on: the wrapped machine's alone
            reader.seek(0)
            self.users.users, self.users.revoked_certs = {}, {}
        if self.inner is not None:
            self.inner.load_snapshot(reader)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
