"""MetaStore contract over the LMDB store and its in-memory twin; the LMDB one also across reopen."""

from __future__ import annotations

import pytest

from storage.api import HardState, MetaStore
from storage.errors import StoreClosedError
from storage.memory import MemoryMetaStore
from storage.meta_lmdb import LmdbMetaStore


@pytest.fixture(params=["memory", "lmdb"])
def make(request, tmp_path):
    if request.param == "memory":
        shared = MemoryMetaStore()
        return lambda: shared
    return lambda: LmdbMetaStore(str(tmp_path / "meta"))


def test_hard_state_and_values(make):
    m = make()
    assert isinstance(m, MetaStore)
    assert m.load_hard_state() == HardState(0, None)
    m.save_hard_state(HardState(7, "n2"))
    m.put("commit", b"\x00\x01", sync=True)
    m.put("applied/kv", b"42")
    assert m.load_hard_state() == HardState(7, "n2")
    assert m.get("commit") == b"\x00\x01" and m.get("missing") is None
    if isinstance(m, LmdbMetaStore):
        m.close()
        m = make()
        assert m.load_hard_state() == HardState(7, "n2")
        assert m.get("applied/kv") == b"42"
    m.save_hard_state(HardState(8, None))
    assert m.load_hard_state() == HardState(8, None)
    with pytest.raises(ValueError):
        m.save_hard_state(HardState(-1, None))
    m.close()
    with pytest.raises(StoreClosedError):
        m.close()
    with pytest.raises(StoreClosedError):
        m.get("commit")


def test_lmdb_put_many_is_atomic_and_durable(tmp_path):
    m = LmdbMetaStore(str(tmp_path / "meta"))
    m.put_many({"snapshot/index": b"10", "snapshot/term": b"3"}, sync=True)
    m.close()
    m = LmdbMetaStore(str(tmp_path / "meta"))
    assert (m.get("snapshot/index"), m.get("snapshot/term")) == (b"10", b"3")
    m.close()
