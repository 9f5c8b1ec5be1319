"""Storage errors. Each names what a person needs to act: the file, the byte offset, the log index."""

from __future__ import annotations


class StorageError(Exception):
    pass


class StoreClosedError(StorageError):
    pass


class IndexOutOfRange(StorageError, IndexError):
    pass


class Compacted(IndexOutOfRange):
    """The index was removed by compaction; install a snapshot instead."""


class NoEntryError(StorageError, LookupError):
    """No entry of the asked magic and body length starts at a position (a stale pointer into the log)."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


class DiskFullError(StorageError):
    """The disk is full (ENOSPC); the append was rolled back and the log is as it was before it."""


class StorageCorruptError(StorageError):
    """Corruption before the tail of the log: the node refuses to start until ``repair`` is run."""

    def __init__(self, message: str, path: str, offset: int, index: int | None = None):
        super().__init__(f"{message} (file {path}, offset {offset}, index {index})")
        self.path = path
        self.offset = offset
        self.index = index
