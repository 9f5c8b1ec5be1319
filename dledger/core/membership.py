"""Group membership: who votes (voters), who only receives the log (learners), and the one-at-a-time changes.

A configuration travels in the log as a config entry (``storage.codec.MAGIC_CONFIG``) whose body is the whole new
configuration, not a delta: the configuration in effect at any index is simply the last one at or before it, so
recomputing it after a restart, a truncation or a snapshot needs no replay. The rules (Raft thesis chapter 4,
single-server changes; why each one: docs/decisions/0017-membership.md):

- a configuration takes effect on a node as soon as its entry is in that node's log, committed or not;
- a change adds or removes at most one voter, so any majority of the old voters overlaps any majority of the new
  (``majorities_overlap``); a learner is added first and promoted once it has caught up;
- learners receive entries and snapshots but never vote, never campaign and never count toward a quorum.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass

from dledger.core.quorum import quorum_size
from dledger.errors import InvalidRequestError

__all__ = [
    "ConfChange",
    "ConfChangeKind",
    "ConfCheckpoint",
    "Configuration",
    "ConfigurationError",
    "majorities_overlap",
]

_FORMAT = 1  # the config entry body's format version


class ConfigurationError(ValueError):
    """A config entry body that does not decode (a corrupt frame, or a newer format than this node reads)."""


class ConfChangeKind(enum.Enum):
    ADD_LEARNER = "add-learner"  # a new node that receives the log and never votes
    ADD_VOTER = "add-voter"  # a new voter at once (allowed; a learner first, then PROMOTE, is the safe habit)
    PROMOTE = "promote"  # a learner becomes a voter
    REMOVE = "remove"  # a voter or a learner leaves the group


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One change; ``address`` (host:port) goes with an added node into the configuration, so every member (and
    any later leader) learns where the newcomer listens from the log itself."""

    kind: ConfChangeKind
    node: str
    address: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value} {self.node}"


@dataclass(frozen=True, slots=True)
class Configuration:
    """The voters and learners of a group, in the order they were added (the order is shown, never relied on),
    and the members' addresses where known ((id, host:port) pairs, sorted: the core never reads them, the runtime
    dials them)."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    addresses: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for n in self.voters + self.learners:
            if not n or not isinstance(n, str):
                raise InvalidRequestError(f"a member id must be a non-empty string, got {n!r}")
            if n in seen:
                raise InvalidRequestError(
                    f"{n!r} appears twice in the configuration (voters {list(self.voters)}, learners "
                    f"{list(self.learners)})"
                )
            seen.add(n)
        for n, _ in self.addresses:
            if n not in seen:
                raise InvalidRequestError(f"an address is given for {n!r}, which is not a member")

    @classmethod
    def of(
        cls, voters: Iterable[str], learners: Iterable[str] = (), addresses: dict[str, str] | None = None
    ) -> Configuration:
        voters, learners = tuple(voters), tuple(learners)
        members = set(voters) | set(learners)
        addrs = tuple(sorted((n, a) for n, a in (addresses or {}).items() if n in members))
        return cls(voters, learners, addrs)

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    def is_voter(self, node: str) -> bool:
        return node in self.voters

    def is_learner(self, node: str) -> bool:
        return node in self.learners

    def is_member(self, node: str) -> bool:
        return node in self.voters or node in self.learners

    def address(self, node: str) -> str | None:
        for n, a in self.addresses:
            if n == node:
                return a
        return None

    def apply(self, change: ConfChange) -> Configuration:
        """The configuration after ``change``; ``InvalidRequestError`` with a reason when it does not apply."""
        n = change.node
        kind = change.kind
        addrs = tuple((m, a) for m, a in self.addresses if m != n)
        if kind is ConfChangeKind.ADD_LEARNER or kind is ConfChangeKind.ADD_VOTER:
            if self.is_member(n):
                role = "voter" if self.is_voter(n) else "learner"
                hint = (
                    " (promote it instead)" if role == "learner" and kind is ConfChangeKind.ADD_VOTER else ""
                )
                raise InvalidRequestError(f"cannot {kind.value} {n!r}: it is already a {role}{hint}")
            if change.address:
                taken = [m for m, a in addrs if a == change.address]
                if taken:
                    raise InvalidRequestError(
                        f"cannot {kind.value} {n!r} at {change.address}: member {taken[0]} listens there"
                    )
                addrs = tuple(sorted((*addrs, (n, change.address))))
            if kind is ConfChangeKind.ADD_LEARNER:
                return Configuration(self.voters, (*self.learners, n), addrs)
            return Configuration((*self.voters, n), self.learners, addrs)
        if kind is ConfChangeKind.PROMOTE:
            if not self.is_learner(n):
                what = "already a voter" if self.is_voter(n) else "not a member"
                raise InvalidRequestError(
                    f"cannot promote {n!r}: it is {what}; only a learner can be promoted"
                )
            return Configuration((*self.voters, n), tuple(x for x in self.learners if x != n), self.addresses)
        if kind is ConfChangeKind.REMOVE:
            if not self.is_member(n):
                raise InvalidRequestError(f"cannot remove {n!r}: it is not a member of {self.describe()}")
            if self.voters == (n,):
                raise InvalidRequestError(f"cannot remove {n!r}: it is the last voter")
            return Configuration(
                tuple(x for x in self.voters if x != n), tuple(x for x in self.learners if x != n), addrs
            )
        raise InvalidRequestError(f"unknown configuration change {kind!r}")

    def describe(self) -> str:
        learners = f" learners {','.join(self.learners)}" if self.learners else ""
        return f"voters {','.join(self.voters) or '-'}{learners}"

    # -- the config entry body -----------------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The body of the config entry that carries this configuration (JSON: small, readable in a dump)."""
        doc: dict[str, object] = {
            "format": _FORMAT,
            "voters": list(self.voters),
            "learners": list(self.learners),
        }
        if self.addresses:
            doc["addresses"] = dict(self.addresses)
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, body: bytes | memoryview) -> Configuration:
        try:
            doc = json.loads(bytes(body))
            fmt = doc["format"]
            voters, learners = doc["voters"], doc["learners"]
            addresses = doc.get("addresses", {})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigurationError(f"config entry body is not a configuration: {e}") from e
        if fmt != _FORMAT:
            raise ConfigurationError(f"config entry format {fmt!r} is not {_FORMAT} (a newer node wrote it?)")
        if not isinstance(voters, list) or not isinstance(learners, list) or not isinstance(addresses, dict):
            raise ConfigurationError("config entry voters and learners must be lists, addresses a map")
        try:
            return cls(tuple(voters), tuple(learners), tuple(sorted(addresses.items())))
        except (InvalidRequestError, TypeError) as e:
            raise ConfigurationError(f"config entry holds a bad configuration: {e}") from e


@dataclass(frozen=True, slots=True)
class ConfCheckpoint:
    """The configurations of a log through ``index`` (a snapshot point): its base and every config entry at or
    before ``index``, with the entry's term and chain CRC there, so a restart that finds the same entry in its log
    (same chain, so the same entries before it) reads config entries only after it instead of from the log's
    first index (docs/membership.md, "Durability")."""

    index: int
    term: int
    chain_crc: int
    confs: tuple[tuple[int, Configuration], ...]

    def encode(self) -> bytes:
        doc = {
            "index": self.index,
            "term": self.term,
            "chain_crc": self.chain_crc,
            "confs": [[i, json.loads(c.encode())] for i, c in self.confs],
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ConfCheckpoint:
        try:
            doc = json.loads(raw)
            confs = tuple((int(i), Configuration.decode(json.dumps(c).encode())) for i, c in doc["confs"])
            return cls(int(doc["index"]), int(doc["term"]), int(doc["chain_crc"]), confs)
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigurationError(f"not a configuration checkpoint: {e}") from e


def majorities_overlap(a: Configuration, b: Configuration) -> bool:
    """True when every majority of ``a``'s voters shares a node with every majority of ``b``'s: two disjoint
    majorities (two leaders of one term, or two different commits at one index) are then impossible. Disjoint
    majorities exist exactly when the two quorum sizes fit side by side in the union of the voters."""
    va, vb = set(a.voters), set(b.voters)
    if not va or not vb:
        return True  # a configuration without voters elects and commits nothing
    return quorum_size(len(va)) + quorum_size(len(vb)) > len(va | vb)
