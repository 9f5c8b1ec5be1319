"""The apply layer's contract: what a user's state machine implements, and what it is given.

A state machine sees only committed *normal* entries (magic 1), each exactly once and in log order; no-op and
configuration entries are consumed by the apply loop. Its durable state is whatever its latest snapshot holds:
after a restart the node restores the newest valid snapshot and replays the log from the entry after it, so the
applied index is derivable from the state machine's own durable state and nothing is applied twice or skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, runtime_checkable


@dataclass(slots=True)
class CommittedEntry:
    """One committed normal entry: ``pos`` is the entry's byte position (a message's CommitLog offset is
    ``pos + 48``); ``body`` may be a view into storage, so copy it if you keep it. Not frozen (treat it as read-only):
    one is built for every entry on every node, and a frozen dataclass costs about five times as much to build."""

    index: int
    term: int
    pos: int
    body: bytes | memoryview


@runtime_checkable
class StateMachine(Protocol):
    """Implement these; the apply loop calls them from one task, never concurrently."""

    name: str

    def apply(self, entries: Sequence[CommittedEntry]) -> list[Any]:
        """Apply a run of committed entries in order; return one result per entry (sent to the proposer)."""
        ...

    def save_snapshot(self, writer: BinaryIO) -> None:
        """Write the whole state as of the last applied entry."""
        ...

    def load_snapshot(self, reader: BinaryIO) -> None:
        """Replace the whole state with one written by ``save_snapshot``."""
        ...

    def close(self) -> None: ...
