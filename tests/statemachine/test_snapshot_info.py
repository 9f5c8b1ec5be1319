"""SnapshotInfo travels as JSON ahead of the data in an InstallSnapshot stream: it round-trips exactly, and
anything malformed from a peer is a ``SnapshotError`` (never a half-filled info)."""

from __future__ import annotations

import json

import pytest

from statemachine.snapshot import SnapshotError, SnapshotInfo, SnapshotStore

INFO = SnapshotInfo(41, 3, 0xDEADBEEF, 9000, "kv", 123, "ab" * 32)


def test_round_trip_and_meta_file_use_the_same_encoding(tmp_path):
    assert SnapshotInfo.from_json(INFO.to_json()) == INFO
    store = SnapshotStore(tmp_path)
    info = store.save(7, 2, 5, 100, "counter", lambda f: f.write(b"x" * 16))
    raw = (tmp_path / info.dirname / "meta.json").read_bytes()
    assert SnapshotInfo.from_json(raw) == info == store.infos()[-1]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("sha256"),
        lambda d: d.update(extra=1),
        lambda d: d.update(index=-2),
        lambda d: d.update(size="12"),
        lambda d: d.update(term=True),
        lambda d: d.update(sha256="short"),
        lambda d: d.update(state_machine=None),
    ],
)
def test_malformed_metadata_is_refused(mutate):
    fields = json.loads(INFO.to_json())
    mutate(fields)
    with pytest.raises(SnapshotError):
        SnapshotInfo.from_json(json.dumps(fields))


def test_not_json_is_refused():
    with pytest.raises(SnapshotError, match="malformed"):
        SnapshotInfo.from_json(b"\x00not json")
