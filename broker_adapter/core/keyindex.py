"""The key and message-id index: which CommitLog positions hold a message with a given key or message id, so a
query by key or id reads a few messages instead of scanning the log (RocketMQ's IndexFile; docs/formats.md
section 9).

An SQLite database beside the ConsumeQueues (``<node dir>/keyindex/keys.sqlite``), written by the dispatcher on
every node: one row per (hash of ``kind:value``, position) in a table clustered on that pair, so a lookup is
one B-tree range. The dispatcher adds a message's rows as it dispatches it and commits them with the chunk
(one transaction per apply chunk, written by a thread of its own; WAL, ``synchronous=OFF``: never synced,
since it is rebuilt rather than recovered: a process crash keeps a prefix of the chunks, and a database that
cannot be opened after a power loss is deleted and rebuilt from the log). The
database records the last position it indexed (``meta.last_pos``): positions grow with the log, so a message
at or below it is never indexed twice, and at start the node indexes the log's messages past it (a missing or
deleted database is rebuilt from what the log holds). It is derived data, like the ConsumeQueues: a snapshot
does not hold it.

Hashes collide (64 bits) and rows outlive what they point at (a message deleted by retention, a message of a
deleted topic): a query reads each candidate message and keeps those whose key or id matches and that their
ConsumeQueue still points at (``core/admin.py``).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final

KEY: Final = "k"
MSG_ID: Final = "i"
FILE_NAME: Final = "keys.sqlite"

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS entries (h INTEGER NOT NULL, pos INTEGER NOT NULL, PRIMARY KEY (h, pos))"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",
)


def key_hash(kind: str, value: str) -> int:
    """The row's key: the first 8 bytes of BLAKE2b over ``kind:value`` (UTF-8), as a signed 64-bit integer."""
    return int.from_bytes(
        hashlib.blake2b(f"{kind}:{value}".encode(), digest_size=8).digest(), "big", signed=True
    )


class KeyIndex:
    def __init__(self, directory: str | Path, cache_kib: int = 8192):
        self.path = Path(directory) / FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._open(cache_kib)
            row = self._db.execute("SELECT v FROM meta WHERE k = 'last_pos'").fetchone()
        except sqlite3.DatabaseError:  # torn by a power loss: it is derived, so start it again
            for p in self.path.parent.glob(FILE_NAME + "*"):
                p.unlink()
            self._db = self._open(cache_kib)
            row = None
        self.last_pos: int = int(row[0]) if row else -1  # committed
        self._pending_pos = self.last_pos
        self._rows: list[tuple[int, int]] = []
        self.added = 0  # rows committed since start
        # Chunks are written by one thread of their own (SQLite releases the GIL while it works), in order, so
        # the dispatcher's event loop does not wait for the B-tree; a lookup first waits for what was handed over.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keyindex")
        self._written: Future[None] | None = None

    def _open(self, cache_kib: int) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        db.execute(f"PRAGMA cache_size=-{int(cache_kib)}")
        for statement in _SCHEMA:
            db.execute(statement)
        return db

    def add(self, pos: int, msg_id: str | None, keys: Iterable[str]) -> None:
        """Index the message at CommitLog position ``pos`` (ignored at or below the last one indexed)."""
        if pos <= self._pending_pos:
            return
        self._pending_pos = pos
        rows = self._rows
        if msg_id:
            rows.append((key_hash(MSG_ID, msg_id), pos))
        for k in keys:
            if k:
                rows.append((key_hash(KEY, k), pos))

    def commit(self) -> None:
        """Hand what ``add`` gathered and the last position to the writer thread, as one transaction."""
        if self._pending_pos == self.last_pos:
            return
        rows, self._rows = self._rows, []
        self.last_pos = self._pending_pos
        self.added += len(rows)
        self._written = self._writer.submit(self._write, rows, self.last_pos)

    def _write(self, rows: list[tuple[int, int]], last_pos: int) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany("INSERT OR IGNORE INTO entries (h, pos) VALUES (?, ?)", rows)
            db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('last_pos', ?)", (last_pos,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def wait(self) -> None:
        """Until every chunk handed over is written (a failed write raises here)."""
        self.commit()
        written, self._written = self._written, None
        if written is not None:
            written.result()

    def lookup(self, kind: str, value: str, limit: int) -> list[int]:
        """Positions of messages that may carry ``value`` as a key (``KEY``) or message id (``MSG_ID``),
        newest first, at most ``limit``."""
        self.wait()
        cur = self._db.execute(
            "SELECT pos FROM entries WHERE h = ? ORDER BY pos DESC LIMIT ?", (key_hash(kind, value), limit)
        )
        return [int(r[0]) for r in cur]

    def prune_below(self, pos: int) -> int:
        """Forget rows of messages before ``pos`` (the log no longer holds them); returns how many went."""
        self.wait()
        cur = self._db.execute("DELETE FROM entries WHERE pos < ?", (pos,))
        return int(cur.rowcount)

    def rows(self) -> int:
        self.wait()
        return int(self._db.execute("SELECT count(*) FROM entries").fetchone()[0])

    def close(self) -> None:
        self.wait()
        self._writer.shutdown()
        self._db.close()
