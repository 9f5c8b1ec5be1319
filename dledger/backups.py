"""``dledger backup`` and ``dledger restore`` (docs/operations.md, "Backup and restore").

A backup is a folder: ``snapshot/meta.json`` and ``snapshot/data`` (the state machine's snapshot, when it has
one), ``log`` (the committed entries after it, exactly as stored: docs/formats.md section 1) and
``manifest.json``, written last, naming every file's size and SHA-256 and the backup's end (its last index, term,
chain value, the configuration there, the group and its state machine). It is taken online from one node
(``DLedger.Backup``, ``dledger/runtime/backup.py``) while writes go on, checked as it arrives (every entry's CRCs
and the chain from the snapshot's point on) and published by a rename, so a folder with a manifest is whole.

A restore builds a new local group from it: every node gets the snapshot and the log, then one configuration
entry at a new term naming the new nodes (``recovery.append_configuration``), so the old group's members and
addresses are history. Everything up to the backup's index is there and commits when the new group elects its
first leader. A backup whose files do not match their manifest is refused, naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from dledger import group as grp
from dledger.core.membership import Configuration
from dledger.errors import ConfigError, DLedgerError
from dledger.runtime.backup import BACKUP_END, BACKUP_LOG, BackupEnd
from dledger.security.config import ClientSecurity
from storage import codec

MANIFEST = "manifest.json"
FORMAT = 1
READ_BYTES = 16 << 20


class BackupError(DLedgerError):
    """A backup that cannot be used: a file missing, damaged or not the one its manifest names."""

    grpc_status = "INVALID_ARGUMENT"
    retriable = False


@dataclass(frozen=True, slots=True)
class Backup:
    path: Path
    end: BackupEnd
    snapshot: dict[str, object] | None  # the snapshot's meta.json, None when the log starts at index 0
    files: dict[str, dict[str, object]]  # name -> {"size", "sha256"}

    @property
    def first_index(self) -> int:
        return self.end.snapshot_index + 1


def take(addresses: list[str], group: str, out: Path, security: ClientSecurity | None = None) -> Backup:
    """Stream a backup from the group's leader into the new folder ``out``; returns it, verified."""
    import grpc

    from dledger.client import DLedgerClient
    from dledger.connections import Channels
    from dledger.security.tls import client_credentials
    from dledger.transport import convert
    from dledger.v1 import client_pb2, client_pb2_grpc

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: a backup goes into a new folder")
    with DLedgerClient(addresses, group, timeout_s=15, security=security) as c:
        leader = c.find_leader()
        address = c.leader or addresses[0]
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "snapshot").mkdir(parents=True)
    sums: dict[str, Any] = {}  # file -> its running SHA-256
    sizes: dict[str, int] = {}
    end: BackupEnd | None = None
    channels = Channels(client_credentials(security))
    try:
        with contextlib.ExitStack() as opened:
            files: dict[str, BinaryIO] = {}
            stub = channels.stub(address, client_pb2_grpc.DLedgerStub)
            for chunk in stub.Backup(client_pb2.BackupRequest(group=group), timeout=3600):
                if chunk.file == BACKUP_END:
                    end = BackupEnd.from_json(chunk.data)
                    continue
                f = files.get(chunk.file)
                if f is None:
                    f = files[chunk.file] = opened.enter_context(open(tmp / chunk.file, "wb"))
                    sums[chunk.file], sizes[chunk.file] = hashlib.sha256(), 0
                if chunk.offset != sizes[chunk.file]:
                    raise BackupError(
                        f"{chunk.file}: chunk at offset {chunk.offset}, expected {sizes[chunk.file]}"
                    )
                f.write(chunk.data)
                sums[chunk.file].update(chunk.data)
                sizes[chunk.file] += len(chunk.data)
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
    except grpc.RpcError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise convert.error_from_rpc(e, address) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        channels.close()
    if end is None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BackupError(f"the backup stream from {address} ended without its end record")
    if BACKUP_LOG not in sizes:
        (tmp / BACKUP_LOG).touch()
        sums[BACKUP_LOG], sizes[BACKUP_LOG] = hashlib.sha256(), 0
    manifest = {
        "format": FORMAT,
        "taken_from": {"node": leader.node_id, "address": address},
        "end": json.loads(end.to_json()),
        "files": {n: {"size": sizes[n], "sha256": sums[n].hexdigest()} for n in sorted(sums)},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    backup = verify(tmp)  # every entry's CRCs and the chain, before the folder is published
    os.replace(tmp, out)
    return Backup(out, backup.end, backup.snapshot, backup.files)


def verify(path: Path) -> Backup:
    """The backup in ``path``, checked: manifest, every file's size and SHA-256, the snapshot's own checksum, and
    the log's entries (CRCs, dense indexes, positions, the chain from the snapshot's point to the end record).
    ``BackupError`` names the file and what is wrong."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        end = BackupEnd.from_json(json.dumps(manifest["end"]).encode())
        files: dict[str, dict[str, object]] = manifest["files"]
    except FileNotFoundError:
        raise BackupError(
            f"{path / MANIFEST} is missing: not a backup, or one that was never finished"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise BackupError(f"{path / MANIFEST} is damaged: {e}") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(
            f"{path / MANIFEST}: backup format {manifest.get('format')!r}; this version reads {FORMAT}"
        )
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise BackupError(f"{f} is missing")
        sha, size = hashlib.sha256(), 0
        with open(f, "rb") as fh:
            while block := fh.read(READ_BYTES):
                sha.update(block)
                size += len(block)
        if size != want["size"] or sha.hexdigest() != want["sha256"]:
            raise BackupError(
                f"{f} is damaged: {size} bytes with SHA-256 {sha.hexdigest()[:16]}..., the manifest says "
                f"{want['size']} bytes with {str(want['sha256'])[:16]}..."
            )
    snapshot = None
    prev = (-1, 0, 0, 0)  # (index, term, chain, end_pos) before the log's first entry: a log from index 0
    if end.snapshot_index >= 0:
        snapshot = json.loads((path / "snapshot" / "meta.json").read_text())
        if snapshot["index"] != end.snapshot_index:
            raise BackupError(
                f"{path / 'snapshot/meta.json'} is of index {snapshot['index']}, not {end.snapshot_index}"
            )
        prev = (snapshot["index"], snapshot["term"], snapshot["chain_crc"], snapshot["end_pos"])
    last = _check_log(path / BACKUP_LOG, prev, end.segment_size)
    if last != (end.index, end.term, end.chain_crc, end.end_pos):
        raise BackupError(
            f"{path / BACKUP_LOG} ends at index {last[0]} (term {last[1]}), not at the manifest's end, index "
            f"{end.index} (term {end.term})"
        )
    return Backup(path, end, snapshot, files)


def _check_log(path: Path, prev: tuple[int, int, int, int], segment_size: int) -> tuple[int, int, int, int]:
    index, term, chain, end_pos = prev
    for offset, data in _frames(path):
        try:
            run = codec.scan_frames(data, index + 1, end_pos, chain, segment_size, prev_term=term)
        except codec.FrameError as e:
            raise BackupError(f"{path} is damaged at byte {offset + e.offset}: {e}") from None
        if len(run):
            index += len(run)
            term, chain = run.terms[-1], run.chains[-1]
            end_pos = run.positions[-1] + run.sizes[-1]
    return index, term, chain, end_pos


def _frames(path: Path) -> Iterator[tuple[int, bytes]]:
    """(file offset, whole entries) of a log file, read in large blocks cut at entry boundaries."""
    offset, rest = 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(READ_BYTES)
            data = rest + block
            cut = 0
            for off, h in _whole(data):
                cut = off + h.size
            if cut:
                yield offset, data[:cut]
            offset += cut
            rest = data[cut:]
            if not block:
                if rest:
                    raise BackupError(f"{path} ends with a torn entry at byte {offset} ({len(rest)} bytes)")
                return


def _whole(data: bytes) -> Iterator[tuple[int, codec.Header]]:
    off = 0
    while len(data) - off >= codec.HEADER_SIZE:
        h = codec.decode_header(data, off)
        if h.size <= 0 or len(data) - off < h.size:
            return
        yield off, h
        off += h.size


def restore(
    path: Path, directory: Path, nodes: int = 3, base_port: int | None = None, flush: str = "sync"
) -> tuple[grp.GroupSpec, Backup, int]:
    """A new local group in ``directory`` holding the backup in ``path`` (verified first); not started. Returns
    the group, the backup and the index of the new configuration entry."""
    from dledger.nodeconfig import load as load_config
    from dledger.recovery import append_configuration
    from dledger.runtime.datadir import open_log
    from statemachine.snapshot import SnapshotInfo, SnapshotStore
    from storage.meta_lmdb import LmdbMetaStore

    backup = verify(path)
    end = backup.end
    if grp.load(directory, missing_ok=True) is not None:
        raise ConfigError(f"{directory} already holds a group: restore into a new directory")
    g = grp.create(
        directory,
        nodes,
        base_port,
        name=end.group,
        flush=flush,
        raft={"segment_size": end.segment_size},
        state_machine=end.state_machine,
    )
    conf = Configuration.of([n.id for n in g.nodes], addresses={n.id: n.address for n in g.nodes})
    term = end.term + 1
    index = -1
    for spec in g.nodes:
        log = open_log(load_config(Path(spec.config)))
        meta = LmdbMetaStore(str(Path(spec.data_dir) / "meta"))
        try:
            if backup.snapshot is not None:
                info = SnapshotInfo.from_json(json.dumps(backup.snapshot))
                install = SnapshotStore(Path(spec.data_dir) / "snapshot").begin_install(info)
                with open(path / "snapshot" / "data", "rb") as f:
                    at = 0
                    while block := f.read(READ_BYTES):
                        install.write(at, block)
                        at += len(block)
                install.commit()
                log.reset_to_snapshot(info.index, info.term, info.chain_crc, info.end_pos)
            for _, data in _frames(path / BACKUP_LOG):
                log.append(data)
            index = append_configuration(log, meta, conf, term, end.segment_size)
        finally:
            log.close()
            meta.close()
    return g, backup, index
