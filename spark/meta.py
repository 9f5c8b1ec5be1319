"""A node's LMDB metadata (``meta/``), opened read-only: the commit index checkpoint.

The audit opens the environment with ``readonly=True, lock=False``: it never creates or writes a file there (not
even LMDB's lock file), so it can audit archived or read-only copies. Reading a live node's meta without the
lock may see a slightly older commit checkpoint, which only makes the audit's committed range smaller.

Key names and value encodings follow ``storage.meta_lmdb``; a missing commit key is not an error: the audit then
takes the group's commit index to be the highest index held by a majority with agreeing chain_crc, and says so.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Final

import lmdb

from spark.layout import AuditInputError

# storage.meta_lmdb keeps user keys under b"kv/"; the node checkpoints its commit index as "commit_index"
# (dledger.runtime.datadir.COMMIT_INDEX_KEY), ASCII decimal.
USER_PREFIX: Final = b"kv/"
COMMIT_KEYS: Final = (USER_PREFIX + b"commit_index", b"commit_index")


@dataclass(frozen=True, slots=True)
class NodeMeta:
    commit_index: int | None
    commit_key: str | None
    keys: tuple[str, ...] = ()


def decode_int(raw: bytes) -> int:
    """An integer stored as ASCII digits, a JSON number or {"index": n}, or 8 (or 4) big-endian bytes."""
    if raw and raw.lstrip(b"-").isdigit():
        return int(raw)
    if len(raw) == 8:
        return struct.unpack(">q", raw)[0]
    if len(raw) == 4:
        return struct.unpack(">i", raw)[0]
    text = raw.decode("ascii").strip()
    value = json.loads(text)
    if isinstance(value, dict):
        for name in ("index", "commit_index", "value"):
            if name in value:
                return int(value[name])
        raise ValueError(f"no index in {text!r}")
    return int(value)


def read_meta(meta_dir: str | None) -> NodeMeta:
    """The node's commit checkpoint; ``NodeMeta(None, None)`` when it has no meta."""
    if meta_dir is None or not os.path.exists(os.path.join(meta_dir, "data.mdb")):
        return NodeMeta(None, None)
    try:
        env = lmdb.open(meta_dir, readonly=True, lock=False, subdir=True, max_dbs=0, create=False)
    except lmdb.Error as err:
        raise AuditInputError(f"{meta_dir}: cannot open the LMDB metadata read-only: {err}") from err
    try:
        with env.begin(buffers=False) as txn:
            items = {bytes(k): bytes(v) for k, v in txn.cursor()}
    except lmdb.Error as err:
        raise AuditInputError(f"{meta_dir}: cannot read the LMDB metadata: {err}") from err
    finally:
        env.close()
    commit = key_name = None
    for key in COMMIT_KEYS:
        if key in items:
            try:
                commit = decode_int(items[key])
            except (ValueError, UnicodeDecodeError) as err:
                raise AuditInputError(
                    f"{meta_dir}: key {key.decode()!r} does not hold an index: {err}"
                ) from err
            key_name = key.decode()
            break
    names = tuple(sorted(k.decode("utf-8", "replace") for k in items))
    return NodeMeta(commit, key_name, names)
