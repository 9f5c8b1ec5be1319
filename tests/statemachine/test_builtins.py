"""Built-in state machines and snapshot files: commands, snapshots round trip, corruption never loads."""

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statemachine import kv
from statemachine.api import CommittedEntry, StateMachine
from statemachine.counter import Counter, encode_add
from statemachine.snapshot import SnapshotCorruptError, SnapshotInfo, SnapshotStore


def _entries(bodies, start=0):
    return [CommittedEntry(start + i, 1, i * 100, b) for i, b in enumerate(bodies)]


def test_builtins_satisfy_the_protocol():
    assert isinstance(kv.KVStore(), StateMachine)
    assert isinstance(Counter(), StateMachine)


def test_kv_put_get_delete_results():
    s = kv.KVStore()
    res = s.apply(
        _entries(
            [
                kv.encode_put(b"a", b"1"),
                kv.encode_put(b"a", b"2"),
                kv.encode_delete(b"a"),
                kv.encode_delete(b"a"),
                kv.encode_put(b"b", b""),
            ]
        )
    )
    assert res == [None, b"1", True, False, None]
    assert s.get(b"a") is None and s.get(b"b") == b""


def test_kv_bad_command_is_rejected_the_same_way_everywhere():
    s = kv.KVStore()
    (res,) = s.apply(_entries([b"X\x00\x01k"]))
    assert isinstance(res, kv.KVCommandError) and "opcode" in str(res)
    (res,) = s.apply(_entries([b"P\x00\x09k"]))
    assert isinstance(res, kv.KVCommandError) and "key length" in str(res)
    with pytest.raises(kv.KVCommandError):
        kv.encode_put(b"", b"v")
    assert len(s) == 0


@given(st.dictionaries(st.binary(min_size=1, max_size=30), st.binary(max_size=100), max_size=50))
def test_kv_snapshot_round_trip(data):
    s = kv.KVStore()
    s.apply(_entries([kv.encode_put(k, v) for k, v in data.items()]))
    buf = io.BytesIO()
    s.save_snapshot(buf)
    t = kv.KVStore()
    t.load_snapshot(io.BytesIO(buf.getvalue()))
    assert dict(t.items()) == data


def test_counter_applies_deltas_and_snapshots():
    c = Counter()
    assert c.apply(_entries([encode_add(5), encode_add(-2), b"bad"]))[:2] == [5, 3]
    buf = io.BytesIO()
    c.save_snapshot(buf)
    d = Counter()
    d.load_snapshot(io.BytesIO(buf.getvalue()))
    assert (d.value, d.applied_count) == (3, 2)


def _save(store, index, payload=b"state"):
    return store.save(index, 2, 0xABC, index * 10, "kv", lambda f: f.write(payload))


def test_snapshot_store_keeps_last_n_and_verifies(tmp_path):
    store = SnapshotStore(tmp_path / "snapshot", keep=2)
    for i in (10, 20, 30):
        _save(store, i, f"s{i}".encode())
    assert [s.index for s in store.infos()] == [20, 30]
    latest = store.latest()
    assert latest.index == 30 and latest.chain_crc == 0xABC and latest.end_pos == 300
    assert b"".join(store.chunks(latest)) == b"s30"


def test_corrupt_snapshot_falls_back_or_refuses(tmp_path):
    store = SnapshotStore(tmp_path / "snapshot", keep=3)
    _save(store, 10, b"old")
    newest = _save(store, 20, b"new")
    data = tmp_path / "snapshot" / newest.dirname / "data"
    data.write_bytes(b"NEW")  # same size, other bytes
    assert store.latest().index == 10  # falls back to the intact older one
    with pytest.raises(SnapshotCorruptError, match="not usable"):
        store.latest(usable=lambda info: info.index >= 20)
    (tmp_path / "snapshot" / "00000000000000000010-00000000000000000002" / "meta.json").write_text("{")
    with pytest.raises(SnapshotCorruptError, match="checksum mismatch"):
        store.latest()


def test_chunked_install_verifies_before_publishing(tmp_path):
    src = SnapshotStore(tmp_path / "a")
    info = _save(src, 5, b"x" * 5000)
    dst = SnapshotStore(tmp_path / "b")
    inst = dst.begin_install(info)
    off = 0
    for chunk in src.chunks(info, chunk_size=1024):
        inst.write(off, chunk)
        off += len(chunk)
    assert inst.commit() == info
    assert dst.latest() == info

    bad = dst.begin_install(SnapshotInfo(6, 2, 0, 0, "kv", 3, "0" * 64))
    bad.write(0, b"abc")
    with pytest.raises(SnapshotCorruptError):
        bad.commit()
    assert dst.latest() == info  # the interrupted install left the follower as it was
    inst2 = dst.begin_install(info)
    with pytest.raises(Exception, match="expected 0"):
        inst2.write(10, b"zz")
    inst2.abort()
