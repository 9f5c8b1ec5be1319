"""A node's data directory: its exclusive lock, opening and closing the log and metadata stores, and the commit
index checkpoint.

Layout (docs/formats.md sections 3 and 6): ``node.lock``, the log's segments and ``start.json``, ``meta/``
(LMDB: hard state, commit checkpoint) and ``snapshot/`` (owned by ``dledger.runtime.snapshots``). Stores given by
the caller (tests, benchmarks) are used as they are, and no lock is taken for them.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from dledger.core.membership import ConfCheckpoint, Configuration, ConfigurationError
from dledger.errors import ConfigError, DirectoryInUseError
from dledger.nodeconfig import NodeConfig
from statemachine.api import StateMachine
from storage.api import LogStore, MetaStore

log = logging.getLogger("dledger.runtime")

COMMIT_INDEX_KEY = "commit_index"  # checkpoint in the MetaStore (audit input; not needed for safety)
# The group's configuration as of the log's compaction point (a config entry body, dledger.core.membership):
# written before the log is compacted or reset to a snapshot, read at start (docs/membership.md).
SNAPSHOT_CONF_KEY = "snapshot_conf"
# The configurations through the last snapshot taken (dledger.core.membership.ConfCheckpoint, JSON): a restart
# whose log holds that entry reads config entries only after it (docs/membership.md).
CONF_CHECKPOINT_KEY = "conf_checkpoint"
# The node directory's data format (docs/formats.md section 6): the layouts of the log, index, metadata and
# snapshots together. A version reads every format up to its own and refuses a newer one.
DATA_FORMAT_KEY = "data_format"
DATA_FORMAT = 1

__all__ = [
    "COMMIT_INDEX_KEY",
    "CONF_CHECKPOINT_KEY",
    "DATA_FORMAT",
    "SNAPSHOT_CONF_KEY",
    "DataDir",
    "DirectoryInUseError",
    "check_data_format",
    "lock_data_dir",
]


def lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's exclusive lock (``node.lock``, released when the process ends, even by kill -9):
    two processes writing one log would corrupt it, so a second node on the same directory refuses to start,
    and ``dledger repair`` refuses a directory a node holds. The holder's pid is written into the file."""
    path = data_dir / "node.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryInUseError(
            f"the data directory {data_dir} is in use by another node process (pid {holder}); stop it first",
            holder,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def check_data_format(meta: MetaStore, data_dir: Path) -> None:
    """Refuse a directory written in a newer data format than this version reads (a downgrade after a format
    change), naming both; record this version's format in a directory that has none (new, or written before
    formats were recorded: format 1)."""
    raw = meta.get(DATA_FORMAT_KEY)
    found = int(raw) if raw else None
    if found is not None and found > DATA_FORMAT:
        raise ConfigError(
            f"the node directory {data_dir} holds data format {found}, written by a newer dledger; this version "
            f"reads formats up to {DATA_FORMAT}: a downgrade after a format change is refused (run the newer "
            "version, or restore a backup taken for this one)"
        )
    if found != DATA_FORMAT:
        meta.put(DATA_FORMAT_KEY, str(DATA_FORMAT).encode(), sync=True)


def open_log(config: NodeConfig, flush: str = "async") -> LogStore:
    """The node's log as its configuration lays it out (segment size, index units per file)."""
    from storage.filestore import FileLogStore

    return FileLogStore.open(
        str(config.data_dir),
        segment_size=config.raft.segment_size,
        flush=flush,
        flush_interval_ms=config.flush_interval_ms,
        index_units=config.index_units_per_file,
    )


def base_configuration(meta: MetaStore, config: NodeConfig) -> Configuration:
    """The configuration at the log's compaction point: the one the last snapshot recorded; else the configured
    peers as voters, or none for a node started to join a group (``join``: it learns its configuration from the
    leader). Config entries in the log apply on top (docs/membership.md)."""
    raw = meta.get(SNAPSHOT_CONF_KEY)
    if raw is not None:
        return Configuration.decode(raw)
    if config.join:
        return Configuration(())
    return Configuration.of(config.voters, addresses=config.peers)


def conf_checkpoint(meta: MetaStore, node_id: str) -> ConfCheckpoint | None:
    """The configurations through the last snapshot taken (None before the first, or if unreadable: then the
    core reads every config entry of the log)."""
    raw = meta.get(CONF_CHECKPOINT_KEY)
    try:
        return None if raw is None else ConfCheckpoint.decode(raw)
    except ConfigurationError as e:
        logging.getLogger("dledger.runtime").warning(
            "%s: ignoring the configuration checkpoint: %s", node_id, e
        )
        return None


def save_confs(meta: MetaStore, conf: Configuration, checkpoint: ConfCheckpoint) -> None:
    """Before a snapshot's compaction (I/O thread): the configuration at the new compaction point, and the
    configurations through the snapshot (read back by ``base_configuration`` and ``conf_checkpoint``)."""
    meta.put(CONF_CHECKPOINT_KEY, checkpoint.encode(), sync=True)
    meta.put(SNAPSHOT_CONF_KEY, conf.encode(), sync=True)


class DataDir:
    """The stores of one node and the lock that guards them. ``open``, ``close`` and the checkpoint methods run
    in the node's I/O thread."""

    def __init__(self, config: NodeConfig, log: LogStore | None = None, meta: MetaStore | None = None):
        self.config = config
        self.log: LogStore | None = log
        self.meta: MetaStore | None = meta
        # Whether the node must call sync() after each write (stores given by the caller sync by themselves).
        self.sync_each_ready = False
        self.checkpointed_commit = -1
        self._lock_fd: int | None = None  # holds the data directory's exclusive lock while open

    @property
    def opened(self) -> bool:
        return self.log is not None and self.meta is not None

    @property
    def log_store(self) -> LogStore:
        """The log, for what runs only once ``open`` ran (the node's start)."""
        assert self.log is not None, "the log is read only once the data directory is open"
        return self.log

    @property
    def meta_store(self) -> MetaStore:
        """The metadata store, for what runs only once ``open`` ran (the node's start)."""
        assert self.meta is not None, "the metadata is read only once the data directory is open"
        return self.meta

    def open(self) -> None:
        from storage.meta_lmdb import LmdbMetaStore

        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_data_dir(cfg.data_dir)
        if self.log is None:
            # The store is opened in its "async" mode whatever the node's policy: the node calls fdatasync
            # itself (``sync()``, in the I/O thread). The store's lock is held through an fdatasync inside a
            # "sync" append, and the core reads the store from the event loop; ``sync()`` fsyncs outside the
            # lock, so the loop never waits behind the disk. Under the "sync" policy every Ready is synced
            # before anything that depends on it is sent, which is the same promise.
            self.log = open_log(cfg)
            self.sync_each_ready = cfg.flush == "sync"
        if self.meta is None:
            self.meta = LmdbMetaStore(str(cfg.data_dir / "meta"))
            check_data_format(self.meta, cfg.data_dir)

    def checkpoint_commit(self, commit_index: int) -> None:
        """Record the commit index in the MetaStore for readers such as the audit (an LMDB commit: LMDB syncs
        it to disk, an fdatasync of its own; hence ``ready_loop.COMMIT_CHECKPOINT_S``)."""
        if commit_index > self.checkpointed_commit:
            assert self.meta is not None, "checkpointed only while open"
            self.meta.put(COMMIT_INDEX_KEY, str(commit_index).encode())
            self.checkpointed_commit = commit_index

    def sync_log(self) -> None:
        assert self.log is not None, "synced only while open"
        self.log.sync()

    def close(self, commit_index: int, state_machine: StateMachine | None) -> None:
        """Sync the log, checkpoint the commit index (synced), close every store, then release the lock."""
        try:
            if self.log is not None:
                self.log.sync()
                if self.meta is not None and commit_index > self.checkpointed_commit:
                    self.meta.put(COMMIT_INDEX_KEY, str(commit_index).encode(), sync=True)
                self.log.close()
            if self.meta is not None:
                self.meta.close()
            if state_machine is not None:
                state_machine.close()
        finally:
            self.release()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the data directory's lock
            self._lock_fd = None
