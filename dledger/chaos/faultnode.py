"""``python -m dledger.chaos.faultnode node --config FILE``: a node whose disk can fill up, stall or lose power.

The same node as ``python -m dledger node``, except that its log store writes through ``SwitchableFullDisk``:
while the file ``<data_dir>/CONTROL`` exists, every write, preallocation and file creation of the log fails
with ENOSPC, exactly as a full file system answers. The nemesis creates and removes that file; nothing else
about the node changes. ``<data_dir>/chaos-slow-sync`` (``stall_sync``) makes one fdatasync of the log sleep.

When ``<data_dir>/chaos-powerloss/`` exists (``storage.powerloss.enable``, done by the chaos runner for runs
with power-loss faults), every file the node writes through ``FileIO`` (the log's data and index files, the
ConsumeQueues) and every LMDB commit is journaled by ``storage.powerloss``: after a kill -9, the nemesis calls
``power_loss`` on the directory and the node comes back with only what it had synced. This runs without root and without a size-limited mount, so it runs in CI; the storage
layer already routes every write through one injectable ``FileIO`` (storage/fileio.py), and this launcher is
the one place that substitutes it for a whole process.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import tomllib
from pathlib import Path

from dledger.grpc_env import prefer_classic_listener
from storage.fileio import FileIO

CONTROL = "chaos-disk-full"
STALL = "chaos-slow-sync"


def control_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / CONTROL


def stall_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / STALL


def stall_sync(data_dir: str | Path, at: float, ms: float) -> None:
    """Make the node's first log fdatasync at or after ``at`` (``time.time()``) take ``ms`` longer, once: a disk
    that stalls (``bench/disk_stall.py``)."""
    tmp = stall_path(data_dir).with_suffix(".tmp")
    tmp.write_text(f"{at} {ms}\n")
    os.replace(tmp, stall_path(data_dir))


class SwitchableFullDisk(FileIO):
    """A ``FileIO`` that answers ENOSPC to writes while its control file exists (one ``stat`` per write), and
    whose next fdatasync sleeps once when its stall file says so (``stall_sync``; one ``stat`` per sync)."""

    def __init__(self, control: str, stall: str | None = None):
        self.control = control
        self.stall = stall

    def fdatasync(self, fd: int) -> None:
        if self.stall is not None and os.path.exists(self.stall):
            self._stall_once()
        super().fdatasync(fd)

    def _stall_once(self) -> None:
        assert self.stall is not None
        try:
            at, ms = (float(x) for x in Path(self.stall).read_text().split())
        except (OSError, ValueError):
            return
        if time.time() < at:
            return
        try:
            os.unlink(self.stall)  # once: a sync on another thread that read it too finds it gone
        except FileNotFoundError:
            return
        time.sleep(ms / 1000)

    def _check(self, what: str) -> None:
        if os.path.exists(self.control):
            raise OSError(errno.ENOSPC, f"No space left on device (injected: {what}; {self.control} exists)")

    def pwrite(self, fd: int, data, offset: int) -> None:
        self._check("pwrite")
        super().pwrite(fd, data, offset)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        self._check("fallocate")
        super().fallocate(fd, offset, length)

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & os.O_CREAT:
            self._check(f"create {path}")
        return super().open(path, flags, mode)


def _data_dir(argv: list[str]) -> Path:
    if "--config" not in argv:
        raise SystemExit("faultnode: --config FILE is required (the data_dir comes from it)")
    config = Path(argv[argv.index("--config") + 1])
    return Path(tomllib.loads(config.read_text())["data_dir"])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    prefer_classic_listener()  # the same gRPC settings as ``python -m dledger`` (dledger/grpc_env.py)
    data_dir = _data_dir(argv)
    control = str(control_path(data_dir))
    stall = str(stall_path(data_dir))

    import storage.filestore as filestore

    class _NodeFileIO(SwitchableFullDisk):
        def __init__(self) -> None:
            super().__init__(control, stall)

    # FileLogStore.open builds ``FileIO()`` when the node passes none: this process's log gets the switch.
    filestore.FileIO = _NodeFileIO
    from storage import powerloss

    if powerloss.enabled(data_dir):
        if any(m.endswith(".consumequeue") for m in sys.modules):
            raise SystemExit(
                "faultnode: the ConsumeQueue module was imported before the file layer was swapped"
            )
        _power_loss_mode(powerloss.Journal(data_dir), control, stall)

    from dledger.cli import main as cli_main

    sys.argv = [sys.argv[0], *argv]
    cli_main()


def _power_loss_mode(journal, control: str, stall: str) -> None:
    """Swap the file layers this process builds for journaling ones (one journal for the whole process)."""
    import storage.fileio as fileio
    import storage.filestore as filestore
    import storage.meta_lmdb as meta_lmdb
    from storage.powerloss import PowerLossFileIO, power_loss_meta_store

    class _PowerLossNodeIO(PowerLossFileIO):
        def __init__(self) -> None:
            super().__init__(journal, SwitchableFullDisk(control, stall))

    filestore.FileIO = _PowerLossNodeIO
    # Modules imported from here on (the state machines' plugins, with the broker's ConsumeQueue) take their
    # ``FileIO`` from storage.fileio when they are imported: they get the journaling one.
    fileio.FileIO = _PowerLossNodeIO
    # DataDir.open imports LmdbMetaStore from the module when it opens the stores, so it gets this subclass.
    meta_lmdb.LmdbMetaStore = power_loss_meta_store(journal)


if __name__ == "__main__":
    main()
