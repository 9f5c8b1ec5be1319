"""Snapshot files: a state machine's whole state as of one log index, with enough metadata to resume the log.

Layout under a node's ``snapshot/`` directory, one folder per snapshot, named so they sort by index:

    snapshot/00000000000000012345-00000000000000000007/   (last included index, term)
        data        the bytes ``StateMachine.save_snapshot`` wrote
        meta.json   index, term, chain_crc, end_pos, state machine name, data size and sha256

A snapshot is written to a ``.tmp-*`` folder, fsynced, then renamed into place, so a crash leaves either the
whole snapshot or none. Its files are written through the storage's file layer (``storage.fileio.FileIO``), so
the chaos launcher's power-loss mode sees them (docs/storage.md, "A power cut"). Loading verifies the checksum; a corrupt snapshot is never loaded: the store falls back
to an older one the caller can still use (its log must hold every entry after it) or refuses with a message that
names the file. Installing a snapshot received from the leader goes through the same verify-then-rename path,
so an interrupted install leaves the follower as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from storage import fileio

if TYPE_CHECKING:
    from storage.codec import Buf

DATA = "data"
META = "meta.json"
_TMP_PREFIX = ".tmp-"


class SnapshotError(Exception):
    pass


class SnapshotCorruptError(SnapshotError):
    def __init__(self, path: Path, reason: str):
        super().__init__(f"snapshot {path} is corrupt: {reason}")
        self.path = path


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    index: int
    term: int
    chain_crc: int
    end_pos: int
    state_machine: str
    size: int
    sha256: str

    @property
    def dirname(self) -> str:
        return f"{self.index:020d}-{self.term:020d}"

    def to_json(self) -> bytes:
        """The metadata as it travels ahead of the data in an InstallSnapshot stream (and sits in meta.json)."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> SnapshotInfo:
        """Parse metadata received from a peer; anything malformed is a ``SnapshotError``."""
        try:
            fields = json.loads(raw)
            info = cls(**fields)
        except (ValueError, TypeError) as err:
            raise SnapshotError(f"snapshot metadata is malformed: {err}") from err
        ints = (info.index, info.term, info.chain_crc, info.end_pos, info.size)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or min(ints) < 0:
            raise SnapshotError(f"snapshot metadata has a field that is not a non-negative integer: {fields}")
        if (
            not isinstance(info.state_machine, str)
            or not isinstance(info.sha256, str)
            or len(info.sha256) != 64
        ):
            raise SnapshotError(f"snapshot metadata names no state machine or no sha256: {fields}")
        return info


class _FileWriter:
    """A new file written front to back through a ``FileIO``, in pwrites of up to 1 MiB (state machines write
    many small pieces; one system call each would be slow)."""

    _CHUNK = 1 << 20

    def __init__(self, io: fileio.FileIO, path: Path):
        self.io = io
        self.fd: int | None = io.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.pos = 0
        self.buf = bytearray()

    @property
    def closed(self) -> bool:
        return self.fd is None

    def write(self, b: Buf) -> int:
        self.buf += b
        if len(self.buf) >= self._CHUNK:
            self._drain()
        return len(b)

    def _drain(self) -> None:
        if self.buf:
            assert self.fd is not None, "written after close"
            self.io.pwrite(self.fd, bytes(self.buf), self.pos)
            self.pos += len(self.buf)
            self.buf.clear()

    def sync_and_close(self) -> None:
        """Everything written, fsynced, closed."""
        try:
            self._drain()
            assert self.fd is not None, "synced after close"
            self.io.fsync(self.fd)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            self.io.close(self.fd)
            self.fd = None


class _HashingWriter:
    """Counts and hashes what passes through, so the checksum costs no second read."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, b: Buf) -> int:
        self.sha.update(b)
        self.size += len(b)
        return self._f.write(b)


class SnapshotStore:
    def __init__(self, root: str | os.PathLike[str], keep: int = 2, io: fileio.FileIO | None = None):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.io = io or fileio.FileIO()  # looked up now: the chaos launcher may have swapped the class
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(_TMP_PREFIX + "*"):  # leftovers of a crash mid-write
            shutil.rmtree(stale, ignore_errors=True)

    # -- writing -------------------------------------------------------------------------------------------
    def save(
        self,
        index: int,
        term: int,
        chain_crc: int,
        end_pos: int,
        state_machine: str,
        write: Callable[[BinaryIO], None],
    ) -> SnapshotInfo:
        """Write a snapshot through ``write(file)`` and publish it atomically; prune old ones."""
        tmp = self.root / f"{_TMP_PREFIX}{index}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        f = _FileWriter(self.io, tmp / DATA)
        try:
            hw = _HashingWriter(f)  # type: ignore[arg-type]
            write(hw)  # type: ignore[arg-type]
            f.sync_and_close()
        finally:
            f.close()
        info = SnapshotInfo(index, term, chain_crc, end_pos, state_machine, hw.size, hw.sha.hexdigest())
        return self._publish(tmp, info)

    def _publish(self, tmp: Path, info: SnapshotInfo) -> SnapshotInfo:
        f = _FileWriter(self.io, tmp / META)
        try:
            f.write(info.to_json())
            f.sync_and_close()
        finally:
            f.close()
        self.io.fsync_dir(str(tmp))
        final = self.root / info.dirname
        if final.exists():
            shutil.rmtree(final)
        self.io.replace(str(tmp), str(final))
        self.io.fsync_dir(str(self.root))
        self.prune()
        return info

    def prune(self) -> None:
        for path in self._dirs()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    # -- install from a leader (chunked) -------------------------------------------------------------------
    def begin_install(self, info: SnapshotInfo) -> SnapshotInstall:
        return SnapshotInstall(self, info)

    # -- reading -------------------------------------------------------------------------------------------
    def _dirs(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(_TMP_PREFIX))

    def infos(self) -> list[SnapshotInfo]:
        """Snapshots whose metadata parses, oldest first (data not verified)."""
        out = []
        for path in self._dirs():
            try:
                out.append(self._read_meta(path))
            except SnapshotCorruptError:
                continue
        return out

    def _read_meta(self, path: Path) -> SnapshotInfo:
        try:
            with open(path / META) as f:
                return SnapshotInfo(**json.load(f))
        except (OSError, ValueError, TypeError) as err:
            raise SnapshotCorruptError(path / META, f"metadata unreadable ({err})") from err

    def verify(self, info: SnapshotInfo) -> None:
        path = self.root / info.dirname / DATA
        sha = hashlib.sha256()
        size = 0
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    sha.update(chunk)
                    size += len(chunk)
        except OSError as err:
            raise SnapshotCorruptError(path, f"data unreadable ({err})") from err
        if size != info.size or sha.hexdigest() != info.sha256:
            raise SnapshotCorruptError(path, f"checksum mismatch (size {size}, expected {info.size})")

    def latest(self, usable: Callable[[SnapshotInfo], bool] = lambda _: True) -> SnapshotInfo | None:
        """The newest snapshot that verifies and that ``usable`` accepts; corrupt ones are skipped.

        Raises ``SnapshotCorruptError`` when snapshots exist but none is both intact and usable, because starting
        from nothing would silently replay a log that no longer holds the beginning.
        """
        dirs = self._dirs()
        errors: list[str] = []
        for path in reversed(dirs):
            try:
                info = self._read_meta(path)
                self.verify(info)
            except SnapshotCorruptError as err:
                errors.append(str(err))
                continue
            if usable(info):
                return info
            errors.append(f"snapshot {path} is intact but not usable with the current log")
        if dirs:
            raise SnapshotCorruptError(self.root, "no usable snapshot: " + "; ".join(errors))
        return None

    def open_data(self, info: SnapshotInfo) -> BinaryIO:
        return open(self.root / info.dirname / DATA, "rb")

    def chunks(self, info: SnapshotInfo, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        with self.open_data(info) as f:
            while chunk := f.read(chunk_size):
                yield chunk


class SnapshotInstall:
    """Receives a snapshot in chunks; nothing is visible until ``commit`` verifies the checksum."""

    def __init__(self, store: SnapshotStore, info: SnapshotInfo):
        self._store = store
        self.info = info
        self._tmp = store.root / f"{_TMP_PREFIX}install-{info.index}-{os.getpid()}-{id(self):x}"
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp.mkdir()
        self._f = _FileWriter(store.io, self._tmp / DATA)  # held across write() calls; closed in commit/abort
        self._sha = hashlib.sha256()
        self.received = 0

    def write(self, offset: int, chunk: bytes) -> None:
        if offset != self.received:
            raise SnapshotError(f"snapshot chunk at offset {offset}, expected {self.received}")
        self._f.write(chunk)
        self._sha.update(chunk)
        self.received += len(chunk)

    def commit(self) -> SnapshotInfo:
        self._f.sync_and_close()
        if self.received != self.info.size or self._sha.hexdigest() != self.info.sha256:
            self.abort()
            raise SnapshotCorruptError(
                self._tmp / DATA, f"received {self.received} bytes whose checksum does not match the leader's"
            )
        return self._store._publish(self._tmp, self.info)

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
