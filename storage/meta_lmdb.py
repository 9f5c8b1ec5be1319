"""``LmdbMetaStore``: Raft's small durable metadata in LMDB (the ``lmdb`` package).

What lives here: the hard state (current term, voted-for), the commit-index checkpoint, the applied index per
state machine and snapshot metadata, each under its own key. LMDB gives atomic multi-key transactions and
cheap reads. Every commit syncs its data pages (``sync=True``) but not the meta page (``metasync=False``): LMDB
then keeps its promise of integrity through a power cut and may only lose the last commit, while an
environment opened with ``sync=False`` may *corrupt* itself on a power cut (LMDB reuses pages of the last
synced tree once later commits free them; docs/decisions/0015-durable-against-power-cuts.md). The hard state,
and any ``put(..., sync=True)``, is followed by ``env.sync(True)`` (meta page included) before the call
returns: a vote must never be forgotten. Commits are rare (the hard state on a term or vote change, the commit
checkpoint at most once per flush interval), so the extra fdatasync per commit costs little (measured: a
synced LMDB commit costs about two fdatasyncs, ~4k/s on this machine, an unsynced one ~100k/s).
"""

from __future__ import annotations

import json
import os

import lmdb

from storage.api import HardState
from storage.errors import StorageCorruptError, StorageError, StoreClosedError

HARD_STATE_KEY = b"raft/hard_state"
_USER_PREFIX = b"kv/"


class LmdbMetaStore:
    """A ``MetaStore`` in an LMDB environment at ``path`` (a directory, created if missing)."""

    def __init__(self, path: str, map_size: int = 64 << 20, durable_commits: bool = True):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.durable_commits = (
            durable_commits  # False: the old sync=False mode (tests of what a power cut does)
        )
        try:
            self._env = lmdb.open(
                path, map_size=map_size, subdir=True, sync=durable_commits, metasync=False, max_dbs=0
            )
        except lmdb.Error as exc:
            raise StorageError(f"cannot open LMDB metadata at {path}: {exc}") from exc
        self._closed = False

    def load_hard_state(self) -> HardState:
        raw = self._get(HARD_STATE_KEY)
        if raw is None:
            return HardState()
        try:
            doc = json.loads(raw)
            hs = HardState(int(doc["term"]), doc["vote"])
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageCorruptError(
                f"unreadable hard state: {exc}", os.path.join(self.path, "data.mdb"), 0
            ) from exc
        if hs.vote is not None and not isinstance(hs.vote, str):
            raise StorageCorruptError(
                "hard state vote is not a node id", os.path.join(self.path, "data.mdb"), 0
            )
        return hs

    def save_hard_state(self, hs: HardState) -> None:
        """Durable before it returns: written and flushed (fdatasync through LMDB)."""
        if hs.term < 0:
            raise ValueError(f"term must be >= 0, got {hs.term}")
        self._put(HARD_STATE_KEY, json.dumps({"term": hs.term, "vote": hs.vote}).encode(), sync=True)

    def get(self, key: str) -> bytes | None:
        return self._get(_USER_PREFIX + key.encode())

    def put(self, key: str, value: bytes, sync: bool = False) -> None:
        if not key:
            raise ValueError("key must not be empty")
        self._put(_USER_PREFIX + key.encode(), bytes(value), sync=sync)

    def put_many(self, items: dict[str, bytes], sync: bool = False) -> None:
        """Several keys in one transaction (atomic: all or none after a crash)."""
        self._check_open()
        with self._env.begin(write=True) as txn:
            for key, value in items.items():
                txn.put(_USER_PREFIX + key.encode(), bytes(value))
        if sync:
            self._env.sync(True)

    def sync(self) -> None:
        self._check_open()
        self._env.sync(True)

    def close(self) -> None:
        self._check_open()
        self._closed = True
        self._env.sync(True)
        self._env.close()

    def _get(self, key: bytes) -> bytes | None:
        self._check_open()
        with self._env.begin() as txn:
            return txn.get(key)

    def _put(self, key: bytes, value: bytes, sync: bool) -> None:
        self._check_open()
        try:
            with self._env.begin(write=True) as txn:
                txn.put(key, value)
            if sync:
                self._env.sync(True)
        except lmdb.MapFullError as exc:
            raise StorageError(f"LMDB metadata at {self.path} is full (map_size)") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the meta store at {self.path} is closed")
