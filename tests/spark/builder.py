"""Build node directories for the audit tests, byte for byte per docs/formats.md, and seed faults into them.

Entries are encoded with ``storage.codec`` and placed by ``codec.place`` as a leader does, then written by the real
``storage.filestore.FileLogStore`` (data segments with blank fillers, index files); messages are encoded by
``broker_adapter.core.message`` (QUEUEOFFSET and PHYSICALOFFSET patched in as the leader does); ConsumeQueues are written
by ``broker_adapter.core.consumequeue.ConsumeQueue``; hard state and the commit checkpoint by ``storage.meta_lmdb``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from broker_adapter.core import message
from broker_adapter.core.consumequeue import ConsumeQueue
from storage import codec
from storage.api import HardState
from storage.filestore import FileLogStore
from storage.meta_lmdb import LmdbMetaStore

SEGMENT_SIZE = 4096
INDEX_UNITS = 40  # small index segments so the index spans files too
COMMIT_INDEX_KEY = "commit_index"  # dledger.runtime.datadir.COMMIT_INDEX_KEY


@dataclass(frozen=True, slots=True)
class Item:
    """One entry to write: a body (bytes) or a message (routed to a queue; offsets assigned when laid out)."""

    term: int
    body: bytes = b""
    msg: message.Message | None = None
    magic: int = codec.MAGIC_NORMAL


@dataclass(slots=True)
class Laid:
    index: int
    term: int
    pos: int
    size: int
    body: bytes
    msg: message.Message | None = None


@dataclass(slots=True)
class Written:
    root: Path
    entries: list[Laid] = field(default_factory=list)

    def data_file(self, pos: int) -> tuple[Path, int]:
        start = pos - pos % SEGMENT_SIZE
        return self.root / "data" / f"{start:020d}", pos - start


def lay_out(items: list[Item]) -> list[Laid]:
    """Assign index, pos and (for messages) queue offsets, as a leader would."""
    out: list[Laid] = []
    end = 0
    next_q: dict[tuple[str, int], int] = {}
    for i, it in enumerate(items):
        if it.msg is not None:
            key = (it.msg.topic, it.msg.queue_id)
            raw = bytearray(message.encode(it.msg))
            size = codec.HEADER_SIZE + len(raw)
            pos = codec.place(end, size, SEGMENT_SIZE)
            q = next_q.get(key, 0)
            next_q[key] = q + 1
            message.patch_placement(raw, q, pos + codec.HEADER_SIZE)
            body = bytes(raw)
        else:
            body = it.body
            size = codec.HEADER_SIZE + len(body)
            pos = codec.place(end, size, SEGMENT_SIZE)
        out.append(Laid(i, it.term, pos, size, body, it.msg))
        end = pos + size
    return out


def write_node(root: Path, laid: list[Laid], commit: int | None, queues: bool = True) -> Written:
    """Write one node with the real writers: ``FileLogStore`` (data and index), ``LmdbMetaStore``, ConsumeQueues."""
    store = FileLogStore.open(str(root), segment_size=SEGMENT_SIZE, flush="async", index_units=INDEX_UNITS)
    try:
        chain = 0
        batch = bytearray()
        for e in laid:
            frame = codec.encode(e.index, e.term, e.pos, e.body, chain, magic=_magic(e))
            chain = codec.decode_header(frame).chain_crc
            batch += frame
            if len(batch) > 8192:
                store.append(bytes(batch))
                batch.clear()
        if batch:
            store.append(bytes(batch))
        store.sync()
    finally:
        store.close()
    meta = LmdbMetaStore(str(root / "meta"))
    try:
        meta.save_hard_state(HardState(laid[-1].term if laid else 0, "n0"))
        if commit is not None:
            meta.put(COMMIT_INDEX_KEY, str(commit).encode(), sync=True)
    finally:
        meta.close()
    if queues:
        for e in laid:
            if e.msg is not None and (commit is None or e.index <= commit):
                m = message.decode(e.body)
                cq = ConsumeQueue(root / "consumequeue", m.topic, m.queue_id, units_per_file=16)
                cq.append(e.pos + codec.HEADER_SIZE, len(e.body), message.tags_code(m.tags))
                cq.close()
    return Written(root, laid)


def _magic(e: Laid) -> int:
    return codec.MAGIC_NOOP if not e.body and e.msg is None else codec.MAGIC_NORMAL


def write_meta_commit(root: Path, commit: int) -> None:
    """Rewrite a node's commit checkpoint (as the node does, through ``LmdbMetaStore``)."""
    meta = LmdbMetaStore(str(root / "meta"))
    try:
        meta.put(COMMIT_INDEX_KEY, str(commit).encode(), sync=True)
    finally:
        meta.close()


def raw_items(terms: list[tuple[int, int]]) -> list[Item]:
    """Entries of varied sizes: for each (term, count), a no-op first (a new leader's), then normal bodies."""
    items = []
    n = 0
    for term, count in terms:
        items.append(Item(term))  # the new leader's no-op
        for _ in range(count):
            items.append(Item(term, bytes((n * 7 + k) % 251 for k in range(50 + (n * 37) % 400))))
            n += 1
    return items


def message_items(term: int, per_queue: int, topics=("orders", "audit"), queues: int = 2) -> list[Item]:
    items = [Item(term)]
    for q in range(per_queue):
        for topic in topics:
            for qid in range(queues):
                msg_id = f"{topic}-{qid}-{q}"
                items.append(
                    Item(
                        term,
                        msg=message.Message(
                            topic=topic,
                            body=f"payload {msg_id}".encode() * 3,
                            queue_id=qid,
                            properties={
                                message.PROPERTY_UNIQ_KEY: msg_id,
                                message.PROPERTY_TAGS: f"tag{q % 3}",
                            },
                        ),
                    )
                )
    return items


def build_group(tmp: Path, items: list[Item], commit: int | None, nodes: int = 3) -> list[Written]:
    laid = lay_out(items)
    return [write_node(tmp / f"n{k}", laid, commit) for k in range(nodes)]


# -- faults ----------------------------------------------------------------------------------------------------
def flip_body_byte(w: Written, index: int) -> None:
    e = w.entries[index]
    path, off = w.data_file(e.pos)
    data = bytearray(path.read_bytes())
    data[off + codec.HEADER_SIZE + 3] ^= 0xFF
    path.write_bytes(bytes(data))


def remove_entry(w: Written, index: int) -> None:
    """Cut the entry's bytes out of its segment; the rest of the segment moves up, zeros pad the end."""
    e = w.entries[index]
    path, off = w.data_file(e.pos)
    data = path.read_bytes()
    path.write_bytes(data[:off] + data[off + e.size :] + bytes(e.size))


def same_segment_pair(w: Written, start: int) -> int:
    """The first index >= start whose entry and the next one are in the same data segment."""
    a = start
    while w.entries[a].pos // SEGMENT_SIZE != w.entries[a + 1].pos // SEGMENT_SIZE:
        a += 1
    return a


def interior_entry(w: Written, start: int) -> int:
    """The first index >= start whose entry has a neighbour on both sides in its own data segment."""
    a = max(start, 1)
    seg = [e.pos // SEGMENT_SIZE for e in w.entries]
    while not seg[a - 1] == seg[a] == seg[a + 1]:
        a += 1
    return a


def swap_entries(w: Written, a: int) -> None:
    """Swap the bytes of entries a and a + 1 (in one segment; sizes may differ)."""
    x, y = w.entries[a], w.entries[a + 1]
    assert x.pos // SEGMENT_SIZE == y.pos // SEGMENT_SIZE, "pick a pair in one segment (same_segment_pair)"
    path, off = w.data_file(x.pos)
    data = path.read_bytes()
    bx = data[off : off + x.size]
    by = data[off + x.size : off + x.size + y.size]
    path.write_bytes(data[:off] + by + bx + data[off + x.size + y.size :])


def point_unit_elsewhere(
    w: Written, topic: str, queue_id: int, queue_offset: int, commitlog_offset: int
) -> None:
    qdir = w.root / "consumequeue" / topic / str(queue_id)
    byte = queue_offset * 20
    files = sorted(qdir.iterdir())
    for f in reversed(files):
        start = int(f.name)
        if start <= byte:
            data = bytearray(f.read_bytes())
            struct.pack_into(">q", data, byte - start, commitlog_offset)
            f.write_bytes(bytes(data))
            return
    raise AssertionError("no such unit")
