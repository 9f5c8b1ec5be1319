"""CommitLog facade: RocketMQ's view of the replicated log, where a message is addressed by its CommitLog offset.

A message's CommitLog offset is its entry's body position (entry pos + 48). DLedger's store is addressed by
index, so the facade maps positions to indices: positions grow with the index, so a bisection over the log's
indices finds any entry, and the dispatcher's in-memory map answers for everything dispatched since start.
Every read is checked against the entry header, so a stale ConsumeQueue unit can never return the wrong bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_adapter.core import message
from broker_adapter.core.statemachine import BrokerStateMachine
from storage.api import LogStore
from storage.codec import HEADER_SIZE, MAGIC_NORMAL
from storage.errors import Compacted, IndexOutOfRange, NoEntryError


class CommitLogError(LookupError):
    """No committed message starts at that CommitLog offset (``at``: its place in a batch read, else 0)."""

    def __init__(self, message: str, at: int = 0):
        super().__init__(message)
        self.at = at


class CommitLog:
    def __init__(self, log: LogStore, dispatcher: BrokerStateMachine):
        self._log = log
        self._sm = dispatcher

    def locate(self, commitlog_offset: int, hi_index: int) -> int:
        """The index of the entry whose body starts at ``commitlog_offset`` (searching indices <= hi_index)."""
        index = self._sm.index_of(commitlog_offset)
        if index is not None:
            return index
        pos = commitlog_offset - HEADER_SIZE
        lo, hi = self._log.first_index, hi_index
        while lo <= hi:
            mid = (lo + hi) // 2
            p = self._log.entry(mid).pos
            if p == pos:
                return mid
            if p < pos:
                lo = mid + 1
            else:
                hi = mid - 1
        raise CommitLogError(f"no entry starts at CommitLog offset {commitlog_offset}")

    def get(self, commitlog_offset: int, size: int, hi_index: int) -> tuple[int, bytes]:
        """(index, message bytes) at ``commitlog_offset``, checked against the entry header and ``size``."""
        try:
            index = self.locate(commitlog_offset, hi_index)
            e = self._log.entry(index)
        except (Compacted, IndexOutOfRange) as err:
            raise CommitLogError(
                f"CommitLog offset {commitlog_offset} is not in this node's log: {err}"
            ) from err
        if e.pos + HEADER_SIZE != commitlog_offset or e.header.body_length != size or e.magic != MAGIC_NORMAL:
            raise CommitLogError(
                f"CommitLog offset {commitlog_offset} (size {size}) does not match entry {index} at pos {e.pos} "
                f"(body {e.header.body_length} bytes, magic {e.magic})"
            )
        return index, bytes(e.body)

    def bodies(self, commitlog_offsets: Sequence[int], sizes: Sequence[int]) -> bytes:
        """The messages at ``commitlog_offsets`` (``sizes[i]`` bytes each), concatenated: one store call
        (``LogStore.bodies_at``) that checks each entry's header and body_crc, with no index lookup. A message
        the log does not hold as asked raises ``CommitLogError`` whose ``at`` says which one."""
        positions = [o - HEADER_SIZE for o in commitlog_offsets]
        try:
            return self._log.bodies_at(positions, sizes, MAGIC_NORMAL)
        except NoEntryError as err:
            at = positions.index(err.position)
            raise CommitLogError(
                f"CommitLog offset {commitlog_offsets[at]} (size {sizes[at]}) does not match an entry: {err}",
                at,
            ) from err
        except (Compacted, IndexOutOfRange) as err:
            first, end = self._log.snapshot_point().end_pos, self._log.tail().end_pos
            at = next(
                (
                    i
                    for i, (p, n) in enumerate(zip(positions, sizes, strict=True))
                    if p < first or p + HEADER_SIZE + n > end
                ),
                0,
            )
            raise CommitLogError(
                f"CommitLog offset {commitlog_offsets[at]} is not in this node's log: {err}", at
            ) from err

    def read_message(self, commitlog_offset: int, size: int, hi_index: int) -> message.Message:
        """The message at ``commitlog_offset``. Its BODYCRC is not checked again: the entry's body_crc covers
        every byte of the message, and the file store checks it on every read (every pulled message: hot)."""
        _, raw = self.get(commitlog_offset, size, hi_index)
        return message.decode(raw, check_crc=False)

    def message_at(self, commitlog_offset: int, hi_index: int) -> message.Message:
        """The message whose entry body starts at ``commitlog_offset``, its size read from the entry."""
        try:
            e = self._log.entry(self.locate(commitlog_offset, hi_index))
        except (Compacted, IndexOutOfRange) as err:
            raise CommitLogError(
                f"CommitLog offset {commitlog_offset} is not in this node's log: {err}"
            ) from err
        return self.read_message(commitlog_offset, e.header.body_length, hi_index)

    def max_offset(self, hi_index: int) -> int:
        """The CommitLog offset just past the entry ``hi_index`` (the committed, dispatched end: RocketMQ's
        getMaxOffset as DLedgerCommitLog confirms it): where the next committed message's entry starts."""
        point = self._log.snapshot_point()
        if hi_index <= point.last_index:
            return point.end_pos
        e = self._log.entry(hi_index)
        return e.pos + e.header.size
