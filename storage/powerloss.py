"""Power loss, emulated: what a node directory holds after the power comes back (issue 20, docs/storage.md).

kill -9 keeps the page cache, so a missing fdatasync never shows in a crash test. This module makes it show:

- ``PowerLossFileIO`` is a ``FileIO`` (storage/fileio.py) that performs every call for real and first appends a
  record of it to a *journal*: each write with the size before it and the bytes it overwrote, each truncation
  and preallocation, each fsync/fdatasync (which makes the file's earlier records durable), each file creation,
  removal and rename (removed files are moved to a *grave* instead, so that they can come back), each
  directory fsync (which makes the earlier namespace records of that directory durable) and each syncfs
  (which makes every earlier record but LMDB's durable).
- ``PowerLossMetaStore`` does the same for the LMDB metadata, which syncs through its own path: one record per
  write transaction (the keys and their previous values) and one per forced ``env.sync``.
- ``power_loss(node_dir, rng)`` runs after the process is dead (a real SIGKILL: the journal is in the page
  cache, which survives it) and rewrites the directory into what a disk would hold after a power cut: per
  file, everything after its last sync is undone ("drop"), or kept up to a random byte ("torn"); creations,
  removals and renames not followed by an fsync of their directory are undone; LMDB transactions not synced
  are undone. The journal and the grave are then removed: the directory is a durable state again.

The journal lives in ``<node_dir>/chaos-powerloss/``; the mode is on for a process when that directory exists
(``enable``). Records are appended before the operation they describe (an interrupted call is undone, which is
harmless) and sync records after the sync returned (a sync interrupted by the kill counts as not done), so the
part lost is never smaller than what the process had not synced. What the model does not cover: memory-mapped
stores (the index files, which are derived and rebuilt from the data; a lost index file is a lost derived file),
files written with ``open()`` instead of a ``FileIO`` (snapshots), and directory creation (directories are
taken as durable).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from storage.fileio import FileIO

if TYPE_CHECKING:
    from collections.abc import Callable

    from storage.codec import Buf
    from storage.meta_lmdb import LmdbMetaStore

STATE_DIR = "chaos-powerloss"
JOURNAL = "journal.jsonl"
GRAVE = "grave"


def state_dir(node_dir: str | os.PathLike[str]) -> Path:
    return Path(node_dir) / STATE_DIR


def enable(node_dir: str | os.PathLike[str]) -> None:
    """Turn the mode on for the next process that runs in ``node_dir`` (see ``enabled``)."""
    (state_dir(node_dir) / GRAVE).mkdir(parents=True, exist_ok=True)


def enabled(node_dir: str | os.PathLike[str]) -> bool:
    return state_dir(node_dir).is_dir()


class Journal:
    """The record of one process's unsynced operations, appended to ``<node_dir>/chaos-powerloss/journal.jsonl``.

    One per process, shared by every ``PowerLossFileIO`` and ``PowerLossMetaStore`` of it: a lock orders records
    and the operations they describe (``seq``), so a sync record covers exactly the records written before the
    sync began."""

    def __init__(self, node_dir: str | os.PathLike[str]):
        self.node_dir = os.path.abspath(node_dir)
        self.dir = state_dir(node_dir)
        (self.dir / GRAVE).mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._fd = os.open(self.dir / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._seq = _last_seq(self.dir / JOURNAL)
        self._graves = 0

    def record(self, op: str, **fields: Any) -> int:
        """Append one record (the caller holds ``lock``); returns its sequence number."""
        self._seq += 1
        os.write(self._fd, (json.dumps({"q": self._seq, "o": op, **fields}) + "\n").encode())
        return self._seq

    @property
    def seq(self) -> int:
        return self._seq

    def grave_path(self) -> str:
        self._graves += 1
        return str(self.dir / GRAVE / f"{os.getpid()}-{self._graves}")


def _last_seq(path: Path) -> int:
    """Sequence numbers continue across the incarnations of a node (kill -9 and restart keep the page cache)."""
    last = 0
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    last = max(last, int(json.loads(line)["q"]))
                except (ValueError, KeyError):
                    continue  # a record cut short by the kill
    except FileNotFoundError:
        pass
    return last


def _ino(fd: int) -> int:
    return os.fstat(fd).st_ino


class PowerLossFileIO(FileIO):
    """A ``FileIO`` that journals what a power cut would undo; every call still goes to ``inner``."""

    def __init__(self, journal: Journal, inner: FileIO | None = None):
        self.journal = journal
        self.inner = inner or FileIO()

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        j = self.journal
        with j.lock:
            existed = os.path.exists(path)
            if existed and flags & os.O_TRUNC:
                old = _read_all(path)
                st = os.stat(path)
                j.record("t", i=st.st_ino, p=path, len=0, sz=len(old), old=old.hex())
            fd = self.inner.open(path, flags, mode)
            if not existed and flags & os.O_CREAT:
                j.record("c", i=_ino(fd), p=os.path.abspath(path))
            return fd

    def close(self, fd: int) -> None:
        self.inner.close(fd)

    def pwrite(self, fd: int, data: Buf, offset: int) -> None:
        j = self.journal
        with j.lock:
            size = os.fstat(fd).st_size
            n = len(data)
            old = os.pread(fd, min(n, size - offset), offset) if offset < size else b""
            j.record("w", i=_ino(fd), off=offset, n=n, sz=size, old=old.hex())
            self.inner.pwrite(fd, data, offset)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return self.inner.pread(fd, n, offset)

    def _synced(self, sync: Callable[[], None], op: str, **fields: Any) -> None:
        """Run ``sync``, then record that what was journaled before it began is durable (``u``): a sync the kill
        interrupts counts as not done."""
        j = self.journal
        with j.lock:
            upto = j.seq
        sync()
        with j.lock:
            j.record(op, u=upto, **fields)

    def fdatasync(self, fd: int) -> None:
        self._synced(lambda: self.inner.fdatasync(fd), "s", i=_ino(fd))

    def fsync(self, fd: int) -> None:
        self._synced(lambda: self.inner.fsync(fd), "s", i=_ino(fd))

    def syncfs(self, fd: int) -> None:
        """Every file's and every directory's earlier records are durable (``S``; LMDB's are not counted)."""
        self._synced(lambda: self.inner.syncfs(fd), "S")

    def ftruncate(self, fd: int, length: int) -> None:
        j = self.journal
        with j.lock:
            size = os.fstat(fd).st_size
            old = os.pread(fd, size - length, length) if length < size else b""
            j.record("t", i=_ino(fd), len=length, sz=size, old=old.hex())
            self.inner.ftruncate(fd, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        j = self.journal
        with j.lock:
            j.record("f", i=_ino(fd), off=offset, n=length, sz=os.fstat(fd).st_size)
            self.inner.fallocate(fd, offset, length)

    def size(self, fd: int) -> int:
        return self.inner.size(fd)

    def unlink(self, path: str) -> None:
        """Moved to the grave, not removed: a power cut before the directory's fsync brings it back."""
        j = self.journal
        with j.lock:
            grave = j.grave_path()
            ino = os.stat(path).st_ino
            j.record("u", i=ino, p=os.path.abspath(path), g=grave)
            os.rename(path, grave)

    def replace(self, src: str, dst: str) -> None:
        j = self.journal
        with j.lock:
            if os.path.exists(dst):
                self.unlink(dst)  # the file it replaces comes back if the rename is undone
            j.record("r", i=os.stat(src).st_ino, src=os.path.abspath(src), dst=os.path.abspath(dst))
            self.inner.replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        self._synced(lambda: self.inner.fsync_dir(path), "d", p=os.path.abspath(path))


def _read_all(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def power_loss_meta_store(journal: Journal) -> type[LmdbMetaStore]:
    """The ``LmdbMetaStore`` class for a power-loss process: a subclass that journals every transaction."""
    from storage.meta_lmdb import LmdbMetaStore

    class PowerLossMetaStore(LmdbMetaStore):
        """Journals each write transaction (keys, previous values) and each forced sync, for ``power_loss``."""

        def _txn_record(self, keys: list[bytes]) -> None:
            with self._env.begin() as txn:
                before = [[k.hex(), None if (v := txn.get(k)) is None else bytes(v).hex()] for k in keys]
            journal.record("m", p=os.path.abspath(self.path), kv=before, durable=self.durable_commits)

        def _put(self, key: bytes, value: bytes, sync: bool) -> None:
            self._check_open()
            with journal.lock:
                self._txn_record([key])
                super()._put(key, value, sync=False)
            if sync:
                self.sync()

        def put_many(self, items: dict[str, bytes], sync: bool = False) -> None:
            self._check_open()
            with journal.lock:
                self._txn_record([b"kv/" + k.encode() for k in items])
                super().put_many(items, sync=False)
            if sync:
                self.sync()

        def sync(self) -> None:
            self._check_open()
            with journal.lock:
                upto = journal.seq
            self._env.sync(True)
            with journal.lock:
                journal.record("ms", p=os.path.abspath(self.path), u=upto)

        def close(self) -> None:
            self.sync()
            super().close()

    return PowerLossMetaStore


# -- after the power cut -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class PowerLossReport:
    """What ``power_loss`` undid, for the history and the tests."""

    mode: str
    root: str = ""
    files: dict[str, int] = field(default_factory=dict)  # path -> bytes lost (dropped or cut off)
    torn: dict[str, int] = field(default_factory=dict)  # path -> bytes of a partly kept operation
    undone_creations: list[str] = field(default_factory=list)
    restored_removals: list[str] = field(default_factory=list)
    undone_renames: list[str] = field(default_factory=list)
    meta_undone: int = 0  # LMDB transactions undone

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.root) if self.root else path

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "bytes_lost": sum(self.files.values()),
            "files": {self._rel(p): n for p, n in sorted(self.files.items()) if n},
            "torn": {self._rel(p): n for p, n in sorted(self.torn.items())},
            "undone_creations": [self._rel(p) for p in self.undone_creations],
            "restored_removals": [self._rel(p) for p in self.restored_removals],
            "undone_renames": self.undone_renames,
            "meta_undone": self.meta_undone,
        }


def read_journal(node_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = state_dir(node_dir) / JOURNAL
    out = []
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    break  # the last record, cut short by the kill: its operation never ran
    except FileNotFoundError:
        pass
    return out


def _inode_paths(root: Path) -> dict[int, str]:
    """Where each inode under ``root`` is now (the node's files and the grave)."""
    out: dict[int, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                out[os.lstat(p).st_ino] = p
            except FileNotFoundError:
                continue
    return out


def power_loss(node_dir: str | os.PathLike[str], rng: random.Random, mode: str = "drop") -> PowerLossReport:
    """Rewrite a stopped node's directory as a disk would hold it after a power cut, and reset the journal.

    ``mode="drop"``: everything not synced is lost. ``mode="torn"``: per file, the unsynced operations are kept
    up to a random one, and that one up to a random byte (a write the disk was doing when the power went).
    The process must be dead (SIGKILL); its journal says what it had not synced."""
    if mode not in ("drop", "torn"):
        raise ValueError(f"mode must be 'drop' or 'torn', got {mode!r}")
    root = Path(node_dir)
    records = read_journal(root)
    report = PowerLossReport(mode, os.path.abspath(root))
    _undo_data(root, records, rng, mode, report)
    _undo_namespace(records, report)
    _undo_meta(records, rng, mode, report)
    shutil.rmtree(state_dir(root) / GRAVE, ignore_errors=True)
    (state_dir(root) / JOURNAL).unlink(missing_ok=True)
    enable(root)  # still on for the next incarnation, with an empty journal
    return report


def _undo_data(
    root: Path, records: list[dict[str, Any]], rng: random.Random, mode: str, report: PowerLossReport
) -> None:
    ops: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        o = r["o"]
        if o == "c":
            ops[r["i"]] = []  # a new file (an inode number can be reused once the old file is really gone)
        elif o in ("w", "t", "f"):
            ops.setdefault(r["i"], []).append(r)
        elif o == "s":
            # Everything journaled before the sync began is on the disk.
            ops[r["i"]] = [x for x in ops.get(r["i"], []) if x["q"] > r["u"]]
        elif o == "S":  # a syncfs: the same for every file
            ops = {i: [x for x in pending if x["q"] > r["u"]] for i, pending in ops.items()}
    where = _inode_paths(root)
    for ino, pending in ops.items():
        path = where.get(ino)
        if not pending or path is None:
            continue
        keep = len(pending)
        partial = None
        if mode == "drop":
            keep = 0
        else:
            keep = rng.randint(0, len(pending) - 1)
            op = pending[keep]
            if op["o"] == "w" and op["n"] > 1:
                partial = rng.randint(1, op["n"] - 1)
        lost = 0
        with open(path, "r+b") as f:
            for op in reversed(pending[keep:]):
                lost += _undo_op(f, op, partial if op is pending[keep] else None)
            if partial is not None:
                report.torn[path] = partial
            f.flush()
            os.fsync(f.fileno())
        report.files[path] = lost


def _undo_op(f: BinaryIO, op: dict[str, Any], keep_bytes: int | None) -> int:
    """Undo one data operation on open file ``f`` (all of it, or all but its first ``keep_bytes``);
    returns the bytes of it that are lost."""
    kind, size_before = op["o"], op["sz"]
    if kind == "w":
        off: int = op["off"]
        n: int = op["n"]
        old = bytes.fromhex(op["old"])
        k = keep_bytes or 0
        # bytes [off + k, off + n) revert: old content inside the old size, nothing beyond it
        if k < len(old):
            f.seek(off + k)
            f.write(old[k:])
        if off + n > size_before:
            f.truncate(max(size_before, off + k))
        return n - k
    if kind == "t":
        length, old = op["len"], bytes.fromhex(op["old"])
        f.truncate(size_before)
        if old:
            f.seek(length)
            f.write(old)
        return len(old)
    if kind == "f":
        if op["off"] + op["n"] > size_before:
            f.truncate(size_before)
        return 0
    raise ValueError(f"not a data operation: {op}")


def _undo_namespace(records: list[dict[str, Any]], report: PowerLossReport) -> None:
    synced: dict[str, int] = {}  # directory -> the last sequence number its fsync covered
    everywhere = 0  # the last sequence number a syncfs covered, in every directory
    for r in records:
        if r["o"] == "d":
            synced[r["p"]] = max(synced.get(r["p"], 0), r["u"])
        elif r["o"] == "S":
            everywhere = max(everywhere, r["u"])
    pending = []
    for r in records:
        dirs = [r["p"]] if r["o"] in ("c", "u") else [r["src"], r["dst"]] if r["o"] == "r" else []
        if dirs and r["q"] > max(everywhere, min(synced.get(os.path.dirname(d), 0) for d in dirs)):
            pending.append(r)
    for r in reversed(pending):
        o = r["o"]
        try:
            if o == "c" and _is(r["p"], r["i"]):
                os.unlink(r["p"])
                report.undone_creations.append(r["p"])
            elif o == "u" and os.path.exists(r["g"]):
                os.rename(r["g"], r["p"])
                report.restored_removals.append(r["p"])
            elif o == "r" and _is(r["dst"], r["i"]):
                os.rename(r["dst"], r["src"])
                report.undone_renames.append(f"{os.path.basename(r['src'])}->{os.path.basename(r['dst'])}")
        except FileNotFoundError:
            continue


def _is(path: str, ino: int) -> bool:
    return os.path.lexists(path) and os.lstat(path).st_ino == ino


def _undo_meta(records: list[dict[str, Any]], rng: random.Random, mode: str, report: PowerLossReport) -> None:
    """LMDB after a power cut: transactions after the last forced sync are undone when the environment commits
    without syncing; when every commit syncs its data (``durable``) only the last one may be undone (LMDB's
    documented promise without metasync)."""
    by_env: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["o"] == "m":
            by_env.setdefault(r["p"], []).append(r)
        elif r["o"] == "ms":
            by_env[r["p"]] = [x for x in by_env.get(r["p"], []) if x["q"] > r["u"]]
    for path, txns in by_env.items():
        if not txns or not os.path.exists(os.path.join(path, "data.mdb")):
            continue
        undo = [t for t in txns if not t["durable"]]
        if txns[-1]["durable"] and (mode == "drop" or rng.random() < 0.5):
            undo.append(txns[-1])
        if not undo:
            continue
        import lmdb

        env = lmdb.open(path, subdir=True, max_dbs=0)
        try:
            with env.begin(write=True) as txn:
                for t in sorted(undo, key=lambda x: x["q"], reverse=True):
                    for khex, vhex in t["kv"]:
                        if vhex is None:
                            txn.delete(bytes.fromhex(khex))
                        else:
                            txn.put(bytes.fromhex(khex), bytes.fromhex(vhex))
            env.sync(True)
        finally:
            env.close()
        report.meta_undone += len(undo)
