"""Fault-injecting file layers for the storage tests (subclasses of ``storage.fileio.FileIO``)."""

from __future__ import annotations

import errno

from storage.fileio import FileIO


class DiskFullIO(FileIO):
    """A disk with ``budget`` bytes left: pwrite writes what fits, then fails with ENOSPC (a short write first,
    as a real full disk does). ``fail_sync`` makes fdatasync report ENOSPC (ext4's delayed allocation);
    ``fail_fallocate`` makes preallocation fail."""

    def __init__(self, budget: int | None = None, fail_sync: bool = False, fail_fallocate: bool = False):
        self.budget = budget
        self.fail_sync = fail_sync
        self.fail_fallocate = fail_fallocate

    def pwrite(self, fd, data, offset):
        view = memoryview(data)
        if self.budget is not None and len(view) > self.budget:
            if self.budget:
                super().pwrite(fd, view[: self.budget], offset)
            self.budget = 0
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if self.budget is not None:
            self.budget -= len(view)
        super().pwrite(fd, view, offset)

    def fdatasync(self, fd):
        if self.fail_sync:
            raise OSError(errno.ENOSPC, "No space left on device (injected at fdatasync)")
        super().fdatasync(fd)

    def fallocate(self, fd, offset, length):
        if self.fail_fallocate:
            raise OSError(errno.ENOSPC, "No space left on device (injected at fallocate)")
        super().fallocate(fd, offset, length)


class SimulatedCrash(BaseException):
    """The process dies here: not an OSError, so no rollback runs (BaseException, like a kill)."""


class CrashIO(FileIO):
    """Writes ``budget`` more bytes of data, then the process "crashes" in the middle of a pwrite."""

    def __init__(self, budget: int):
        self.budget = budget

    def pwrite(self, fd, data, offset):
        view = memoryview(data)
        if len(view) > self.budget:
            if self.budget:
                super().pwrite(fd, view[: self.budget], offset)
            self.budget = 0
            raise SimulatedCrash(f"crash after a partial write at offset {offset}")
        self.budget -= len(view)
        super().pwrite(fd, view, offset)


def abandon(store) -> None:
    """Release a crashed store's descriptors without any of the work ``close`` does (no sync, no flush)."""
    store._closed = True
    store._index.close()
    store._segments.close()
