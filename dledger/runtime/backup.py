"""The node's side of an online backup (``DLedger.Backup``; docs/operations.md, "Backup and restore").

A backup is what a new member would need to join at the backup's index: the state machine's newest snapshot
(taken for the backup, while writes go on), then the committed log after it, entries exactly as stored, then an
``end`` record naming the last index, its term and chain value, where the log continues, and the configuration at
that index. Nothing pauses the group: the snapshot is taken as any policy snapshot is, and the log after it is
read by index up to the commit index of the moment the backup began (committed entries never change).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from dledger.core.membership import Configuration
from dledger.errors import UnavailableError
from dledger.transport.base import SnapshotChunk
from statemachine.snapshot import SnapshotInfo
from storage import codec
from storage.api import LogStore

__all__ = ["BACKUP_END", "BACKUP_LOG", "SNAPSHOT_FILES", "BackupEnd", "backup_chunks"]

CHUNK_BYTES = 1 << 20
BACKUP_LOG = "log"
BACKUP_END = "end"
# The snapshot's two files, as a backup names them (their names in a snapshot folder: docs/formats.md section 6).
SNAPSHOT_FILES = {"meta.json": "snapshot/meta.json", "data": "snapshot/data"}


@dataclass(frozen=True, slots=True)
class BackupEnd:
    group: str
    state_machine: str
    snapshot_index: int  # -1: no snapshot, the log starts at index 0
    index: int  # the backup's last entry
    term: int
    chain_crc: int
    end_pos: int
    segment_size: int  # the log's: an entry's position depends on it (an entry never straddles two files)
    conf: Configuration

    def to_json(self) -> bytes:
        fields = {k: getattr(self, k) for k in self.__slots__ if k != "conf"}
        fields["conf"] = json.loads(self.conf.encode())
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BackupEnd:
        f = json.loads(raw)
        conf = Configuration.decode(json.dumps(f.pop("conf")).encode())
        return cls(conf=conf, **f)


async def backup_chunks(
    log: LogStore,
    snapshot_now: Callable[[], Awaitable[tuple[bool, SnapshotInfo | None, int]]],
    snapshot_stream: Callable[[SnapshotInfo], AsyncIterator[SnapshotChunk]],
    committed: Callable[[], int],
    conf_at: Callable[[int], Configuration],
    group: str,
    state_machine: str,
    segment_size: int,
) -> AsyncIterator[tuple[str, int, bytes]]:
    """(file, offset, data) of a backup, in order: the snapshot's files, the log after it, the end record."""
    _, info, _ = await snapshot_now()
    last = committed()
    if info is not None:
        async for c in snapshot_stream(info):
            yield SNAPSHOT_FILES[c.file], c.offset, c.data
        lo, term, chain, end_pos = info.index + 1, info.term, info.chain_crc, info.end_pos
    elif log.first_index == 0:
        lo, term, chain, end_pos = 0, 0, 0, 0
    else:
        raise UnavailableError(
            f"the log starts at index {log.first_index} and there is no snapshot before it: nothing can be backed "
            "up consistently (a node without a state machine compacts nothing; ask another node)"
        )
    offset = 0
    while lo <= last:
        if log.first_index > lo:
            raise UnavailableError(
                f"the log was compacted past index {lo} while the backup read it: run the backup again"
            )
        data = log.raw(lo, last + 1, CHUNK_BYTES)
        headers = [h for _, h in codec.iter_headers(data)]
        if not headers:
            break
        h = headers[-1]
        lo, term, chain, end_pos = h.index + 1, h.term, h.chain_crc, h.end
        yield BACKUP_LOG, offset, data
        offset += len(data)
    index = lo - 1
    end = BackupEnd(
        group,
        state_machine,
        info.index if info else -1,
        index,
        term,
        chain,
        end_pos,
        segment_size,
        conf_at(index),
    )
    yield BACKUP_END, 0, end.to_json()
