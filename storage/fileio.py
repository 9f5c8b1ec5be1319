"""The file operations the log store performs, behind one small injectable object.

Every byte ``FileLogStore`` writes and every file it creates, truncates or removes goes through a ``FileIO``.
Production uses it as is; fault tests substitute a subclass that fails at a chosen byte (ENOSPC, EIO) to prove
the store rolls back and the log after reopening is exactly what it was. Reads also go through it so that a
test can count or corrupt them, but nothing here caches or buffers: each method is one system call (or a loop
of them for short writes).
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.codec import Buf


_LIBC = ctypes.CDLL(None, use_errno=True)
_SYNCFS = getattr(_LIBC, "syncfs", None)  # Linux (glibc 2.14+); None elsewhere


class FileIO:
    """Thin wrapper over ``os`` file calls; subclass and override a method to inject faults."""

    # Whether ``syncfs`` is available: one call that makes every file of a filesystem durable.
    can_syncfs = _SYNCFS is not None

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: Buf, offset: int) -> None:
        """Write all of ``data`` at ``offset``; a short write is retried for the rest, an error propagates."""
        done = os.pwrite(fd, data, offset)
        total = len(data)
        if done == total:
            return
        view = memoryview(data)
        while done < total:
            n = os.pwrite(fd, view[done:], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, f"pwrite wrote {n} bytes at offset {offset + done}")
            done += n

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        """Read exactly ``n`` bytes at ``offset`` (fewer only at end of file)."""
        data = os.pread(fd, n, offset)
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
        while got < n:
            more = os.pread(fd, n - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        """Reserve disk blocks so later writes (including through mmap) cannot fail for lack of space."""
        os.posix_fallocate(fd, offset, length)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def syncfs(self, fd: int) -> None:
        """Make everything written to the filesystem holding ``fd`` durable, data and names (``syncfs(2)``):
        one journal commit for thousands of files, where an ``fdatasync`` each costs one commit each."""
        if _SYNCFS is None:
            raise OSError(errno.ENOSYS, "syncfs is not available on this system")
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}")

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and removals in directory ``path`` durable."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_file_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content, never a mix."""
        tmp = path + ".tmp"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.pwrite(fd, data, 0)
            self.fsync(fd)
        finally:
            self.close(fd)
        self.replace(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")


def is_disk_full(exc: OSError) -> bool:
    """True for the errors that mean "no space left": ENOSPC, and EDQUOT (a quota is a full disk to us)."""
    return exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
