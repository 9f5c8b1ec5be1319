"""The storage interfaces: a log of encoded entries and a small metadata store.

Storage knows no roles, leaders or peers: it stores frames it is given (already encoded by ``storage.codec``,
with index, term and pos assigned by the Raft core), reports facts about them, and keeps them durable per its
flush policy. Every implementation (``storage.filestore.FileLogStore`` for real nodes,
``storage.memory.MemoryLogStore`` for the simulator) passes the same contract tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from storage.codec import MAGIC_NORMAL, Entry

# One entry as a bulk reader needs it (``LogStore.entry_fields``): (magic, index, term, pos, body).
EntryFields = tuple[int, int, int, int, bytes | memoryview]


@dataclass(frozen=True, slots=True)
class HardState:
    """Raft's durable election state: it must reach disk before any message that depends on it leaves."""

    term: int = 0
    vote: str | None = None


@dataclass(frozen=True, slots=True)
class LogPosition:
    """Where the log ends: the next entry gets ``last_index + 1`` and is placed at or after ``end_pos``.

    An empty log (or one compacted up to a snapshot) reports the snapshot's last index/term/chain_crc and
    the end position that follows it; a fresh log is ``LogPosition(-1, 0, 0, 0)``.
    """

    last_index: int
    last_term: int
    end_pos: int
    chain_crc: int


@runtime_checkable
class LogStore(Protocol):
    """A log of consecutive encoded entries, first_index..last_index, with DLedger's positions.

    Errors: reading an index outside [first_index, last_index] raises ``storage.errors.IndexOutOfRange``
    (``Compacted`` below first_index); a bad frame raises ``storage.codec.FrameError`` and writes nothing;
    a full disk raises ``storage.errors.DiskFullError`` and leaves the log as it was; any use after
    ``close()`` raises ``storage.errors.StoreClosedError``.
    """

    segment_size: int

    @property
    def first_index(self) -> int:
        """The first index still held (after compaction); ``last_index + 1`` when the log is empty."""
        ...

    @property
    def last_index(self) -> int:
        """The last index held, or (snapshot index, or -1) when the log is empty."""
        ...

    def tail(self) -> LogPosition:
        """Last index, term, end position and chain_crc: what the next append must follow."""
        ...

    def snapshot_point(self) -> LogPosition:
        """The position just before ``first_index``: the last compacted (snapshot) entry, or the fresh-log
        origin ``LogPosition(-1, 0, 0, 0)``; ``term(first_index - 1)`` answers from it."""
        ...

    def append(self, frames: bytes | memoryview) -> list[int]:
        """Validate and append consecutive encoded entries that follow ``tail()``; return each entry's pos.

        The frames must continue the log exactly (index last_index + 1, pos per ``codec.place``, chain from
        the tail's chain_crc). Under the ``sync`` policy the entries are on disk when this returns; under
        ``async`` they are in the page cache and ``sync()`` (or the flusher) makes them durable.
        """
        ...

    def entry(self, index: int) -> Entry:
        """The entry at ``index``."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries lo..hi-1, stopping early once ``max_bytes`` is reached (always at least one entry)."""
        ...

    def entry_fields(self, lo: int, hi: int, max_bytes: int | None = None) -> list[EntryFields]:
        """``entries`` as plain (magic, index, term, pos, body) tuples, read and checked the same way: a reader
        that passes over every entry once (the apply loop) need not pay for an ``Entry`` and a ``Header`` each."""
        ...

    def raw(self, lo: int, hi: int, max_bytes: int | None = None) -> bytes:
        """The encoded frames of entries lo..hi-1 (same early stop as ``entries``), ready to replicate."""
        ...

    def bodies_at(self, positions: Sequence[int], lengths: Sequence[int], magic: int = MAGIC_NORMAL) -> bytes:
        """The bodies of the entries that start at ``positions`` (each ``lengths[i]`` bytes, of ``magic``),
        concatenated in that order: a reader holding positions (the broker's ConsumeQueue) reads many entries
        without an index lookup or an ``Entry`` per entry. Each body is checked as ``entries`` checks it.

        A position before the log's first entry raises ``Compacted``, one past its end ``IndexOutOfRange``;
        no entry of that magic and length starting there raises ``storage.errors.NoEntryError``.
        """
        ...

    def term(self, index: int) -> int:
        """The term of ``index``; also answers for the snapshot's last index after compaction."""
        ...

    def truncate_suffix(self, index: int) -> None:
        """Remove entries ``index`` and after (a follower resolving a conflict with its leader)."""
        ...

    def compact_prefix(self, index: int) -> None:
        """Forget entries before ``index`` (after a snapshot); whole segments are deleted when possible."""
        ...

    def reset_to_snapshot(self, meta_index: int, meta_term: int, chain_crc: int, end_pos: int) -> None:
        """Drop every entry and make the log empty, continuing after a snapshot's last included entry.

        Afterwards ``tail()`` is ``LogPosition(meta_index, meta_term, end_pos, chain_crc)``, ``first_index`` is
        ``meta_index + 1`` and ``term(meta_index)`` answers ``meta_term`` (a follower installing a snapshot).
        """
        ...

    def sync(self) -> None:
        """Make everything appended so far durable (fdatasync)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class MetaStore(Protocol):
    """Small durable metadata: hard state, commit checkpoint, applied index per state machine, snapshot meta."""

    def load_hard_state(self) -> HardState: ...

    def save_hard_state(self, hs: HardState) -> None:
        """Durable (synced) before it returns: a vote must never be forgotten."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes, sync: bool = False) -> None: ...

    def close(self) -> None: ...
