"""The core's view of the log: what storage holds, plus the entries the runtime has not persisted yet.

The core never writes to storage (etcd-io/raft ``log.go`` + ``log_unstable.go``). Entries it creates (a leader's
proposals, encoded here with ``storage.codec`` so every node stores byte-identical frames at identical positions)
or receives (a follower's AppendEntries frames, kept as the leader's raw bytes) live in an in-memory tail until
the runtime has persisted them. The view answers ``term(i)``, ``last_index`` and frame reads from that tail and
the store, so the core never waits for I/O.

Index space, oldest first::

    [ compacted ... ][ store: first_index .. offset-1 ][ memory: offset .. last_index ]
                                                         |-- handed --|-- new --|

"handed" entries were given to the runtime in a ``Ready`` that has not been advanced yet: the runtime may be
writing them right now, so the view keeps answering for them from memory until ``stable()`` says they are durable.
A conflict found by a follower may cut the memory tail or reach into the store; the store part is then removed by
the next ``Ready.truncate_from``. Because only the memory tail and a pending snapshot can be newer than the store,
any index below ``offset`` is read from the store, whose content below ``offset`` no in-flight Ready touches.

The view also tracks the group's configuration (``dledger.core.membership``): every config entry it holds, and
the configuration at its base (the snapshot point, or the group's initial members). A configuration takes effect
once its entry is in the log (Raft thesis §4.1), so ``configuration`` is the last config entry's, committed or
not, and a truncation that drops a config entry brings back the one before it.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from typing import Final

from dledger.core.frames import count_frames, decode_conf, scan
from dledger.core.membership import ConfCheckpoint, Configuration, ConfigurationError
from dledger.core.messages import Prepare, SnapshotMeta
from storage import codec
from storage.api import LogStore
from storage.errors import Compacted, IndexOutOfRange

_MAGIC_SIZE: Final = struct.Struct(">ii")
_CONFIG: Final = codec.MAGIC_CONFIG
_STORE_SCAN_BYTES: Final = 4 << 20  # read size when looking for config entries in the store at start
_CHAIN_CRC: Final = struct.Struct(">I")
_MIN_BLANK: Final = codec.MIN_BLANK_LEN
_HEADER_SIZE: Final = codec.HEADER_SIZE


class LogConflictError(RuntimeError):
    """The leader asked to overwrite an entry this node already knows is committed: Raft's safety is broken
    (or storage lost data). The node must stop rather than diverge."""


class RaftLog:
    """Store prefix + in-memory tail. Mutated only by the core; the store is only read."""

    __slots__ = (
        "_base",
        "_buf",
        "_cache_bytes",
        "_confs",
        "_end_pos",
        "_handed_to",
        "_last_chain",
        "_last_index",
        "_last_term",
        "_offs",
        "_offset",
        "_read_memo",
        "_segment_size",
        "_snapshot",
        "_snapshot_handed",
        "_terms",
        "_truncate_from",
        "_unhanded",
        "committed",
        "durable_index",
        "store",
    )

    def __init__(
        self,
        store: LogStore,
        segment_size: int,
        cache_bytes: int = 0,
        base_conf: Configuration | None = None,
        checkpoint: ConfCheckpoint | None = None,
    ):
        """``base_conf`` is the configuration as of the store's snapshot point (``first_index - 1``): the one a
        snapshot recorded, or the group's initial members; config entries in the store are found and applied
        over it. ``checkpoint`` (the last snapshot's) lists them up to its index: when the store holds that very
        entry, only the entries after it are read."""
        self.store = store
        self._cache_bytes = cache_bytes
        self._segment_size = segment_size
        tail = store.tail()
        self._last_index = tail.last_index
        self._last_term = tail.last_term
        self._end_pos = tail.end_pos
        self._last_chain = tail.chain_crc
        self._offset = tail.last_index + 1  # index of the first entry held in memory
        self._buf = bytearray()  # frames of the memory tail, back to back
        self._base = 0  # virtual byte offset of _buf[0]; _offs hold virtual offsets
        self._offs: list[int] = []  # virtual byte offset of each memory entry
        self._terms: list[int] = []  # term of each memory entry
        self._handed_to = self._offset - 1  # last memory index given to a Ready not yet advanced
        self._truncate_from: int | None = None  # store suffix to drop before the next append
        self._snapshot: SnapshotMeta | None = None  # installed in memory, not yet advanced
        self._snapshot_handed = False
        self.committed = store.first_index - 1
        # The last index the runtime has reported durable (``stable``): a leader's own copy of an entry counts
        # towards its commit as soon as it is appended, but a configuration change waits for this too.
        self.durable_index = tail.last_index
        # Copy avoidance: the frames of the one message whose entries are all that is not handed out yet (a
        # follower's usual case: the Ready hands those very bytes on), and the last replication read (a leader
        # reads the same range for every follower in step).
        self._unhanded: bytes | None = None
        self._read_memo: tuple[int, int, int, bytes, int] | None = None
        # (index of the config entry, configuration), oldest first; the first is the base (snapshot point).
        first = store.first_index
        self._confs: list[tuple[int, Configuration]] = [
            (first - 1, base_conf if base_conf is not None else Configuration(()))
        ]
        if checkpoint is not None and self._store_holds(checkpoint):
            self._confs += [c for c in checkpoint.confs if first <= c[0] <= checkpoint.index]
            first = checkpoint.index + 1
        self._confs += self._store_confs(first)

    # -- configuration ---------------------------------------------------------------------------------------------

    @property
    def configuration(self) -> Configuration:
        """The configuration in effect: the last config entry in the log (committed or not), else the base."""
        return self._confs[-1][1]

    @property
    def conf_index(self) -> int:
        """Index of the entry that carries ``configuration`` (the base's snapshot point when none does)."""
        return self._confs[-1][0]

    def conf_at(self, index: int) -> Configuration:
        """The configuration in effect at ``index`` (for a snapshot taken there); the base for older indexes."""
        for i, conf in reversed(self._confs):
            if i <= index:
                return conf
        return self._confs[0][1]

    def conf_before(self, index: int) -> tuple[int, Configuration]:
        """(index, configuration) of the last config entry before ``index``, or the base (its snapshot point)."""
        for i, conf in reversed(self._confs):
            if i < index:
                return i, conf
        return self._confs[0]

    def conf_checkpoint(self, index: int, term: int, chain_crc: int) -> ConfCheckpoint:
        """The configurations through ``index`` (the entry with that term and chain CRC), for a snapshot there."""
        return ConfCheckpoint(index, term, chain_crc, tuple(c for c in self._confs if c[0] <= index))

    def _store_holds(self, cp: ConfCheckpoint) -> bool:
        """Whether the store holds the checkpoint's entry (or snapshot point): then it holds the same entries
        before it (the chain CRC covers them) and the same config entries among them."""
        store = self.store
        if cp.index == store.first_index - 1:
            p = store.snapshot_point()
            return (p.last_term, p.chain_crc) == (cp.term, cp.chain_crc)
        if not store.first_index <= cp.index <= store.last_index:
            return False
        h = store.entry(cp.index).header
        return (h.term, h.chain_crc) == (cp.term, cp.chain_crc)

    def _store_confs(self, lo: int) -> list[tuple[int, Configuration]]:
        """The config entries in the store from ``lo`` on, read by headers (the apply loop replays the same range
        at start)."""
        store = self.store
        hi = store.last_index + 1
        found: list[tuple[int, Configuration]] = []
        while lo < hi:
            data = store.raw(lo, hi, _STORE_SCAN_BYTES)
            off, n, end = 0, 0, len(data)
            while off < end:
                magic, size = _MAGIC_SIZE.unpack_from(data, off)
                if magic == _CONFIG:
                    found.append((lo + n, decode_conf(data, off, size, lo + n)))
                off += size
                n += 1
            if n == 0:
                break
            lo += n
        return found

    # -- facts ---------------------------------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def last_term(self) -> int:
        return self._last_term

    @property
    def first_index(self) -> int:
        """First index answerable with entries (not a snapshot point)."""
        if self._snapshot is not None:
            return self._snapshot.index + 1
        return self.store.first_index

    @property
    def end_pos(self) -> int:
        return self._end_pos

    def term(self, index: int) -> int:
        """Term of ``index``; also answers for the snapshot point. Raises ``Compacted`` / ``IndexOutOfRange``."""
        k = index - self._offset
        if k >= 0:
            if index > self._last_index:
                raise IndexOutOfRange(
                    f"index {index} is past the end of the log (last index {self._last_index})"
                )
            return self._terms[k]
        snap = self._snapshot
        if snap is not None:
            if index == snap.index:
                return snap.term
            raise Compacted(f"index {index} is below the installed snapshot at {snap.index}")
        return self.store.term(index)

    def match_term(self, index: int, term: int) -> bool:
        try:
            return self.term(index) == term
        except IndexOutOfRange:  # includes Compacted
            return False

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: is a log ending at (last_index, last_term) at least as up to date as ours?"""
        return last_term > self._last_term or (
            last_term == self._last_term and last_index >= self._last_index
        )

    def chain_at(self, index: int) -> int | None:
        """chain_crc of entry ``index`` when cheaply known (memory tail, store tail, snapshot point), else None."""
        if index == self._last_index:
            return self._last_chain
        k = index - self._offset
        if k >= 0:
            if index > self._last_index:
                return None
            chain: int = _CHAIN_CRC.unpack_from(
                self._buf, self._offs[k] - self._base + codec.CHAIN_CRC_OFFSET
            )[0]
            return chain
        snap = self._snapshot
        if snap is not None:
            return snap.chain_crc if index == snap.index else None
        store = self.store
        try:
            first = store.first_index
            if index >= first:
                return store.entry(index).header.chain_crc
        except IndexOutOfRange:
            return None
        if index == first - 1:
            point = self._store_snapshot_point()
            if point.index == index:
                return point.chain_crc
        return None

    def first_index_of_term(self, term: int, lo: int, hi: int) -> int:
        """Smallest index in [lo, hi] whose term equals ``term`` (term(hi) == term), by binary search: terms
        never decrease along a log."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self.term(mid) < term:
                lo = mid + 1
            else:
                hi = mid
        return hi

    def last_index_with_term_at_most(self, term: int, hi: int) -> int:
        """Largest index <= ``hi`` whose term is <= ``term``, or first_index - 1 when there is none."""
        lo = self.first_index - 1  # the snapshot point (or -1): a floor that always answers
        hi = min(hi, self._last_index)
        if hi < lo:
            return lo
        try:
            if self.term(lo) > term:
                return lo - 1
        except IndexOutOfRange:
            return lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.term(mid) <= term:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def snapshot_meta(self) -> SnapshotMeta | None:
        """Describe the compaction point (``first_index - 1``) for an InstallSnapshot, or None if unknown; it carries
        the configuration in effect there."""
        if self._snapshot is not None:
            return self._snapshot
        point = self._store_snapshot_point()
        if point.index < 0:
            return None
        return SnapshotMeta(
            point.index, point.term, point.chain_crc, point.end_pos, self.conf_at(point.index)
        )

    def _store_snapshot_point(self) -> SnapshotMeta:
        p = self.store.snapshot_point()
        return SnapshotMeta(p.last_index, p.last_term, p.chain_crc, p.end_pos)

    @property
    def cache_bytes(self) -> int:
        return self._cache_bytes

    @cache_bytes.setter
    def cache_bytes(self, value: int) -> None:
        """How many bytes of durable entries to keep in memory for replication reads (a leader's need)."""
        self._cache_bytes = max(0, value)

    # -- reads for replication -----------------------------------------------------------------------------------

    def frames_from(self, lo: int, max_bytes: int) -> tuple[bytes, int]:
        """Encoded frames from ``lo`` on (at least one entry, at most ``max_bytes`` beyond that) and the last
        index they carry. Raises ``Compacted`` when ``lo`` is below the first index held."""
        last = self._last_index
        if lo > last:
            return b"", lo - 1
        k = lo - self._offset
        if k >= 0:
            memo = self._read_memo
            if memo is not None and memo[0] == lo and memo[1] == max_bytes and memo[2] == last:
                return memo[3], memo[4]
            data, hi = self._memory_frames(k, max_bytes)
            self._read_memo = (lo, max_bytes, last, data, hi)
            return data, hi
        if self._snapshot is not None:
            raise Compacted(f"index {lo} is below the installed snapshot at {self._snapshot.index}")
        hi = self._offset  # store part only; the memory tail follows in the next message
        data = self.store.raw(lo, hi, max_bytes)
        return data, lo + count_frames(data) - 1

    def _memory_frames(self, k: int, max_bytes: int) -> tuple[bytes, int]:
        """Frames from memory entry ``k`` (list position), cut at ``max_bytes`` but at least one entry."""
        last = self._last_index
        offs = self._offs
        start = offs[k]
        end_all = self._base + len(self._buf)
        if end_all - start <= max_bytes:
            return bytes(self._buf[start - self._base :]), last
        m = bisect_right(offs, start + max_bytes, k + 1)  # entries k..m-2 end at or before the limit
        stop = max(m - 1, k + 1)
        if stop >= len(offs):  # a single entry larger than max_bytes: it goes alone
            return bytes(self._buf[start - self._base :]), last
        return bytes(self._buf[start - self._base : offs[stop] - self._base]), self._offset + stop - 1

    # -- writes: leader --------------------------------------------------------------------------------------------

    def append_new(
        self, bodies: list[bytes], term: int, magic: int, prepare: Prepare | None = None
    ) -> tuple[int, list[int]]:
        """Encode ``bodies`` as the next entries (a leader's proposals); return the first index and positions.

        ``prepare(index, pos, body)`` (optional) sees each body once its place is known and returns the body to
        store, of the same length: the broker writes a message's PHYSICALOFFSET (pos + 48) this way, as RocketMQ
        does, before the entry is encoded."""
        if term < self._last_term:
            raise ValueError(f"term {term} is below the log's last term {self._last_term}")
        seg = self._segment_size
        limit = seg - _MIN_BLANK - _HEADER_SIZE
        if bodies and max(map(len, bodies)) > limit:
            raise ValueError(
                f"an entry body of {max(map(len, bodies))} bytes does not fit a {seg}-byte segment"
            )
        if prepare is not None:
            bodies = self._prepared(bodies, prepare)
        confs = None
        if magic == _CONFIG:
            try:
                confs = [Configuration.decode(b) for b in bodies]
            except ConfigurationError as e:
                raise ValueError(str(e)) from e
        self._unhanded = None
        buf = self._buf
        add_off = self._offs.append
        encode_into = codec.encode_into
        index = self._last_index
        first = index + 1
        pos = self._end_pos
        chain = self._last_chain
        voff = self._base + len(buf)  # virtual offset of the next frame in the tail buffer
        positions: list[int] = []
        add_pos = positions.append
        for body in bodies:
            size = _HEADER_SIZE + len(body)
            room = seg - pos % seg
            if room < size + _MIN_BLANK:  # codec.place: never straddle a segment, keep room for a blank
                pos += room
            index += 1
            add_off(voff)
            chain = encode_into(buf, index, term, pos, body, chain, magic)
            add_pos(pos)
            pos += size
            voff += size
        self._terms += [term] * len(bodies)
        self._last_index = index
        self._last_term = term
        self._end_pos = pos
        self._last_chain = chain
        if confs:
            self._confs += [(first + k, c) for k, c in enumerate(confs)]
        return first, positions

    def _prepared(self, bodies: list[bytes], prepare: Prepare) -> list[bytes]:
        """Run ``prepare`` over every body at its future place before anything is appended, so a bad result
        leaves the log untouched."""
        seg = self._segment_size
        index, pos = self._last_index, self._end_pos
        out = []
        for body in bodies:
            size = _HEADER_SIZE + len(body)
            room = seg - pos % seg
            if room < size + _MIN_BLANK:
                pos += room
            index += 1
            prepared = prepare(index, pos, body)
            if len(prepared) != len(body):
                raise ValueError(
                    f"prepare changed the body of entry {index} from {len(body)} to {len(prepared)} bytes"
                )
            out.append(prepared)
            pos += size
        return out

    # -- writes: follower ------------------------------------------------------------------------------------------

    def maybe_append(self, prev_index: int, prev_term: int, frames: bytes) -> int | None:
        """Raft's AppendEntries receiver rules 2-4: None if we do not hold (prev_index, prev_term); otherwise
        drop our entries from the first conflict on, append what is new, and return the last index the message
        covers (``prev_index`` + its entries), which is the index we now agree with the leader up to."""
        if not self.match_term(prev_index, prev_term):
            return None
        if not frames:
            return prev_index
        offs, terms, confs = scan(frames, prev_index + 1)
        n = len(offs)
        last_new = prev_index + n
        # Common case: everything is new.
        if prev_index == self._last_index:
            self._append_frames(frames, offs, terms, 0)
            if confs:
                self._confs += confs
            return last_new
        # Find the first entry we lack or hold with another term (receiver rule 3).
        conflict = -1
        for k in range(n):
            idx = prev_index + 1 + k
            if idx > self._last_index or not self.match_term(idx, terms[k]):
                conflict = k
                break
        if conflict < 0:
            return last_new  # a duplicate or an older message: nothing new
        idx = prev_index + 1 + conflict
        if idx <= self._last_index:
            if idx <= self.committed:
                raise LogConflictError(
                    f"entry {idx} conflicts with the leader's (term {terms[conflict]}) but index "
                    f"{self.committed} is committed"
                )
            self._truncate(idx)
        self._append_frames(frames, offs, terms, conflict)
        if confs:
            self._confs += [c for c in confs if c[0] >= idx]
        return last_new

    def _truncate(self, index: int) -> None:
        """Forget entries ``index`` and after (in memory now, in the store with the next Ready); a configuration
        they carried is forgotten with them."""
        confs = self._confs
        while len(confs) > 1 and confs[-1][0] >= index:
            confs.pop()
        self.durable_index = min(self.durable_index, index - 1)
        self._read_memo = None
        self._unhanded = None
        k = index - self._offset
        if k >= 0:
            cut = self._offs[k] - self._base
            del self._buf[cut:]
            del self._offs[k:]
            del self._terms[k:]
            if self._handed_to >= index:
                # The runtime is writing (or wrote) those entries: the store must lose them again.
                self._handed_to = index - 1
                self._truncate_from = (
                    index if self._truncate_from is None else min(self._truncate_from, index)
                )
        else:
            if self._snapshot is not None and index <= self._snapshot.index:
                raise LogConflictError(f"cannot truncate at {index}: below the installed snapshot")
            self._buf = bytearray()
            self._base = 0
            self._offs.clear()
            self._terms.clear()
            self._offset = index
            self._handed_to = index - 1
            self._truncate_from = index
        self._last_index = index - 1

    def _append_frames(self, frames: bytes, offs: list[int], terms: list[int], k: int) -> None:
        """Append entries k.. of ``frames`` (their byte offsets and terms as ``_scan`` found them)."""
        buf = self._buf
        start = offs[k]
        shift = self._base + len(buf) - start
        whole = k == 0 and self._handed_to == self._last_index and type(frames) is bytes
        self._unhanded = frames if whole else None
        if k:
            del offs[:k]
            del terms[:k]
            buf += memoryview(frames)[start:]
        else:
            buf += frames
        if shift:
            offs = [off + shift for off in offs]
        self._offs += offs
        self._terms += terms
        h = codec.HEADER.unpack_from(frames, offs[-1] - shift)
        self._last_index = h[2]
        self._last_term = h[3]
        self._end_pos = h[4] + h[1]
        self._last_chain = h[6]

    def restore(self, snap: SnapshotMeta) -> None:
        """Reset to an installed snapshot: every entry is dropped; the log continues after ``snap``, in the
        snapshot's configuration (or the current one when the sender did not say)."""
        self._confs = [(snap.index, snap.conf if snap.conf is not None else self.configuration)]
        self._read_memo = None
        self._unhanded = None
        self._buf = bytearray()
        self._base = 0
        self._offs.clear()
        self._terms.clear()
        self._offset = snap.index + 1
        self._handed_to = snap.index
        self.durable_index = min(self.durable_index, snap.index)
        self._truncate_from = None
        self._snapshot = snap
        self._snapshot_handed = False
        self._last_index = snap.index
        self._last_term = snap.term
        self._end_pos = snap.end_pos
        self._last_chain = snap.chain_crc
        self.committed = max(self.committed, snap.index)

    def commit_to(self, index: int) -> bool:
        if index > self.committed:
            if index > self._last_index:
                raise LogConflictError(f"commit index {index} is past the last index {self._last_index}")
            self.committed = index
            return True
        return False

    # -- handing work to the runtime ---------------------------------------------------------------------------

    @property
    def has_unstable(self) -> bool:
        return (
            self._handed_to < self._last_index
            or self._truncate_from is not None
            or (self._snapshot is not None and not self._snapshot_handed)
        )

    def take_unstable(self) -> tuple[SnapshotMeta | None, int | None, bytes]:
        """(snapshot, truncate_from, frames) for the next Ready; marks them handed."""
        snap = None
        if self._snapshot is not None and not self._snapshot_handed:
            snap = self._snapshot
            self._snapshot_handed = True
        truncate_from = self._truncate_from
        self._truncate_from = None
        frames = b""
        if self._handed_to < self._last_index:
            if self._unhanded is not None:
                frames = self._unhanded
            else:
                k = self._handed_to + 1 - self._offset
                frames = bytes(self._buf[self._offs[k] - self._base :])
            self._handed_to = self._last_index
        self._unhanded = None
        return snap, truncate_from, frames

    def stable(self) -> None:
        """The Ready last taken is durable. Its entries stay in memory as a read cache (a leader sends them to
        followers from here, without a store read) until the tail exceeds ``cache_bytes``; then the oldest
        durable entries are let go. Entries not yet handed out are never dropped."""
        if self._snapshot is not None and self._snapshot_handed:
            self._snapshot = None
            self._snapshot_handed = False
        self.durable_index = self._handed_to
        durable = self._handed_to + 1 - self._offset  # memory entries that are (now) in the store
        if durable <= 0:
            return
        offs = self._offs
        base = self._base
        buf = self._buf
        excess = base + len(buf) - offs[0] - self._cache_bytes  # live bytes beyond the cache budget
        if excess <= 0:
            return
        # Drop the oldest durable entries covering at least `excess` bytes.
        n = min(durable, bisect_right(offs, offs[0] + excess - 1))
        if n == len(offs):
            self._base = base + len(buf)
            self._buf = bytearray()
            offs.clear()
            self._terms.clear()
        else:
            del offs[:n]
            del self._terms[:n]
            # Release the dead prefix only once it outweighs the live part: a bytearray that lost its front
            # copies itself on the next growth, so doing it every time would copy the whole cache per Ready.
            dead = offs[0] - base
            if dead > len(buf) - dead:
                del buf[:dead]
                self._base = base + dead
        self._offset += n

    def memory_entries(self) -> int:
        """How many entries are held in memory (not yet durable); for status and tests."""
        return len(self._offs)
