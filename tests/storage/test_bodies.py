"""``LogStore.bodies_at``: entry bodies read by position, checked as ``entries`` checks them (both stores)."""

from __future__ import annotations

import os

import pytest

from storage import codec
from storage.errors import Compacted, IndexOutOfRange, NoEntryError, StorageCorruptError
from storage.filestore import FileLogStore
from tests.storage.conftest import INDEX_UNITS, SEGMENT
from tests.storage.helpers import append, body_for
from tests.storage.test_contract import now_and_reopened


def filled(store, n: int = 60) -> tuple[list[int], list[bytes]]:
    bs = [body_for(i, 5) for i in range(n)]
    return append(store, bs, 2), bs


def test_bodies_at_returns_the_bodies_in_the_order_asked(factory, store):
    pos, bs = filled(store)
    assert len({p // SEGMENT for p in pos}) > 3, "the test must cross data files"
    for s in now_and_reopened(factory, store):
        every_third = list(range(1, 60, 3))
        assert s.bodies_at([pos[i] for i in every_third], [len(bs[i]) for i in every_third]) == b"".join(
            bs[i] for i in every_third
        )
        assert s.bodies_at(pos, [len(b) for b in bs]) == b"".join(bs)
        backwards = [7, 3, 59, 0]
        assert s.bodies_at([pos[i] for i in backwards], [len(bs[i]) for i in backwards]) == b"".join(
            bs[i] for i in backwards
        )
        assert s.bodies_at([], []) == b""
        store = s
    if factory.kind != "memory":
        store.close()


def test_bodies_at_refuses_what_is_not_there(store):
    pos, bs = filled(store)
    with pytest.raises(NoEntryError) as e:
        store.bodies_at([pos[4], pos[5]], [len(bs[4]), len(bs[5]) + 1])
    assert e.value.position == pos[5]
    with pytest.raises(NoEntryError):
        store.bodies_at([pos[5] + 1], [len(bs[5]) - 1])  # inside an entry
    with pytest.raises(NoEntryError):
        store.bodies_at([pos[5]], [len(bs[5])], magic=codec.MAGIC_CONFIG)
    end = store.tail().end_pos
    with pytest.raises(IndexOutOfRange):
        store.bodies_at([end], [0])
    with pytest.raises(ValueError):
        store.bodies_at([pos[0]], [])
    store.compact_prefix(10)
    with pytest.raises(Compacted):
        store.bodies_at([pos[9]], [len(bs[9])])
    assert store.bodies_at([pos[10]], [len(bs[10])]) == bs[10]


def corrupt(store: FileLogStore, pos: int, delta: int) -> str:
    """Flip one byte ``delta`` bytes into the entry at ``pos``; returns the data file's path."""
    path = os.path.join(store.directory, "data", f"{pos - pos % SEGMENT:020d}")
    with open(path, "r+b") as f:
        f.seek(pos % SEGMENT + delta)
        b = f.read(1)
        f.seek(pos % SEGMENT + delta)
        f.write(bytes([b[0] ^ 0xFF]))
    return path


@pytest.mark.parametrize(
    ("delta", "words"),
    [(codec.HEADER_SIZE + 2, "body_crc"), (codec.POS_OFFSET + 7, "does not match the index")],
)
def test_a_corrupt_entry_is_named(tmp_path, delta, words):
    store = FileLogStore.open(str(tmp_path / "n"), segment_size=SEGMENT, index_units=INDEX_UNITS)
    try:
        pos, bs = filled(store)
        i = next(i for i in range(20, 60) if len(bs[i]) > 4)
        path = corrupt(store, pos[i], delta)
        with pytest.raises(StorageCorruptError) as e:
            store.bodies_at(pos[i - 2 : i + 2], [len(b) for b in bs[i - 2 : i + 2]])
        assert words in str(e.value)
        assert (e.value.path, e.value.offset, e.value.index) == (path, pos[i] % SEGMENT, i)
    finally:
        store.close()
