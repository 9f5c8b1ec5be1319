"""Users and their permissions, replicated through the log so that every node agrees and a failover keeps them.

A user command is a log entry shaped like the broker's commands (docs/formats.md): TOTALSIZE, a magic at bytes
4..8 (``DLSC``), an op byte and a UTF-8 JSON payload. ``SecuredStateMachine`` wraps the node's own state machine
(broker, kv, counter or none): user commands go to the ``UserStore``, every other entry to the wrapped machine,
in log order; a snapshot holds both. Only the Security service (``dledger.security.service``) proposes user
commands: the raw Append API refuses a body that looks like one (``is_user_command``), so no client can forge one.

Permissions (docs/security.md, "Permissions"): ``admin`` (topics, users, snapshots, leadership, membership, the
raw log), ``publish:<topic>`` and ``subscribe:<topic>:<group>``; ``*`` matches any topic or group.
The bootstrap admin comes from the node's config, not the log (it is how the first user gets added).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final

from statemachine.api import CommittedEntry, StateMachine

USER_MAGIC: Final = 0x444C5343  # b"DLSC"
_HEAD: Final = struct.Struct(">iIB")
OP_ADD: Final = 1
OP_REMOVE: Final = 2
OP_GRANT: Final = 3
OP_REVOKE: Final = 4
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


@dataclass
class User:
    access_key: str
    secret_key: str
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

    def public(self) -> dict[str, Any]:
        """What ``user list`` shows: never the secret."""
        return {"access_key": self.access_key, "permissions": sorted(self.permissions)}


def encode(op: int, payload: dict[str, Any]) -> bytes:
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return _HEAD.pack(_HEAD.size + len(raw), USER_MAGIC, op) + raw


def is_user_command(body: bytes | memoryview) -> bool:
    return len(body) >= _HEAD.size and struct.unpack_from(">I", body, 4)[0] == USER_MAGIC


class UserStore:
    """Access key -> ``User``; changed only by applying committed user commands."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    def apply_one(self, body: bytes | memoryview) -> Any:
        try:
            _, _, op = _HEAD.unpack_from(body, 0)
            p = json.loads(bytes(body[_HEAD.size :]))
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
        return json.dumps(
            {ak: [u.secret_key, sorted(u.permissions)] for ak, u in sorted(self.users.items())}
        ).encode()

    def load_json(self, raw: bytes) -> None:
        self.users = {ak: User(ak, sk, set(perms)) for ak, (sk, perms) in json.loads(raw).items()}


class SecuredStateMachine:
    """The node's state machine with the user store beside it (same name, so existing snapshots still load)."""

    def __init__(self, inner: StateMachine | None, users: UserStore):
        self.inner = inner
        self.users = users
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
            if is_user_command(e.body):
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
            self.users.users = {}
        if self.inner is not None:
            self.inner.load_snapshot(reader)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
