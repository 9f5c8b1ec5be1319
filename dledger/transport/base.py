"""The transport seam between a node and the network, in both directions.

Outbound, a node sees a ``PeerTransport``: deliver one Raft message to its destination and get back the
messages the destination's core produced in answer. Inbound, the transport's server calls the node through
``PeerHandler`` (Raft traffic) and ``ClientHandler`` (the client service). The gRPC adapter
(``dledger.transport.grpc``) implements all three; a test can stand in with plain Python objects. No Raft
decision lives in a transport: it converts, applies deadlines and reports unreachable peers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dledger.core.messages import InstallSnapshot, Message
from storage.codec import Entry

if TYPE_CHECKING:
    from statemachine.snapshot import SnapshotInfo


class PeerUnreachableError(Exception):
    """A message could not be delivered (connection refused, deadline, peer shutting down).

    Raft tolerates lost messages: the sender logs it (rate-limited) and the core retries by its own timers."""

    def __init__(self, peer: str, address: str, detail: str):
        super().__init__(f"peer {peer} at {address} unreachable: {detail}")
        self.peer = peer
        self.address = address
        self.detail = detail


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """A piece of one snapshot file (a meta-only snapshot has none)."""

    file: str
    offset: int
    data: bytes
    last: bool = False


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended body landed: entry ``index`` at byte ``pos`` (its body starts at ``pos + 48``)."""

    index: int
    pos: int
    term: int


@dataclass(frozen=True, slots=True)
class AppendedRun:
    """The entries one append request became: consecutive indexes from ``first_index``, all in ``term``."""

    first_index: int
    term: int
    positions: tuple[int, ...]

    def results(self) -> list[AppendResult]:
        first, term = self.first_index, self.term
        return [AppendResult(first + i, pos, term) for i, pos in enumerate(self.positions)]


@dataclass(frozen=True, slots=True)
class PeerInfo:
    id: str
    address: str
    match_index: int = -1
    member: str = ""  # "voter", "learner", or "" (an address known, not in the configuration)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What ``Metadata`` reports about one node (roles: "leader", "follower", "candidate")."""

    group: str
    node_id: str
    address: str
    role: str
    term: int
    leader_id: str | None
    leader_address: str | None
    last_index: int
    commit_index: int
    applied_index: int
    peers: tuple[PeerInfo, ...] = field(default=())
    data_dir: str = ""
    pid: int = 0
    flush: str = ""
    voters: tuple[str, ...] = ()  # the configuration in effect on this node (docs/membership.md)
    learners: tuple[str, ...] = ()
    conf_index: int = -1


@runtime_checkable
class PeerTransport(Protocol):
    """Outbound Raft traffic of one node."""

    def set_reply_handler(self, handler: Callable[[list[Message]], None]) -> None:
        """Where answers that arrive on pipes (``deliver``) go; set once, before the first ``deliver``."""
        ...

    async def deliver(self, dst: str, messages: list[Message]) -> None:
        """Write ``messages`` (in order) on the pipe to ``dst`` without waiting for answers; they arrive later
        through the reply handler. Returns once written (flow control); raises ``PeerUnreachableError``."""
        ...

    async def call(self, msg: Message) -> list[Message]:
        """Deliver ``msg`` to ``msg.dst``; return the messages the peer produced for us in answer.

        Raises ``PeerUnreachableError`` when it could not be delivered."""
        ...

    async def install_snapshot(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk] | None = None
    ) -> list[Message]:
        """Send a snapshot (its meta, then its files in chunks) to ``msg.dst``."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class PeerHandler(Protocol):
    """The node as the peer server sees it."""

    group: str

    async def handle_message(self, msg: Message) -> list[Message]:
        """Step ``msg`` into the core; return the answers addressed to its sender once they are persisted."""
        ...

    def handle_batch(self, messages: list[Message]) -> Awaitable[list[Message]]:
        """Step ``messages`` in order (all of them before the first await); the awaitable gives the answers
        to their senders once persisted (the node returns a future it resolves itself; a coroutine works
        too)."""
        ...

    async def handle_snapshot(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk]
    ) -> list[Message]:
        """Receive and verify a snapshot's files, then step ``msg``; return the answers for the sender."""
        ...


@runtime_checkable
class ClientHandler(Protocol):
    """The node as the client service sees it. Methods raise ``dledger.errors.DLedgerError`` subclasses."""

    group: str

    async def append(self, bodies: list[bytes]) -> AppendedRun: ...

    def get(self, index: int) -> Entry: ...

    def metadata(self) -> NodeInfo: ...

    async def transfer_leadership(self, target: str) -> str: ...

    async def change_membership(
        self, kind: str, node_id: str, address: str
    ) -> tuple[int, int, tuple[str, ...], tuple[str, ...]]:
        """(index, term, voters, learners) once the config entry committed."""
        ...

    async def snapshot_now(self) -> tuple[bool, SnapshotInfo | None, int]:
        """Take a snapshot now: (taken, the newest snapshot, the first log index afterwards)."""
        ...

    def backup(self) -> AsyncIterator[tuple[str, int, bytes]]:
        """An online backup as this node holds it: (file, offset, data) chunks (docs/operations.md)."""
        ...

    def address_of(self, node_id: str) -> str | None:
        """A member's client address (for not-leader hints)."""
        ...
