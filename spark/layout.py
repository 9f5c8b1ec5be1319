"""Find the files of a group's nodes (docs/formats.md section 3) without opening anything for writing.

A node directory holds ``data/`` (data segments), ``index/`` (index segments), ``meta/`` (LMDB) and, for a broker,
``consumequeue/<topic>/<queueId>/``. Segment and ConsumeQueue files are named by the absolute byte position of
their first byte, zero-padded to 20 digits. A directory without ``data/`` whose subdirectories are node
directories is a group directory (what ``dledger group up --dir`` creates) and expands to its nodes.

Everything the audit cannot use is an ``AuditInputError`` (exit status 2) naming the path: a missing directory,
a node without ``data/``, a file the audit may not read. Listing is cheap and happens on the driver; the files
themselves are read by Spark tasks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

SEGMENT_NAME_DIGITS = 20
START_FILE = "start.json"  # storage.recovery's record of where a compacted log begins


class AuditInputError(Exception):
    """The input cannot be audited (exit status 2); the message names the path and what is wrong."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One file named by the absolute byte position of its first byte."""

    start: int
    path: str
    length: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """The files of one node. ``node`` is the node's position in the audit (0-based), ``name`` its label."""

    node: int
    name: str
    root: str
    data: tuple[SegmentFile, ...]
    index: tuple[SegmentFile, ...]
    meta_dir: str | None
    queues: dict[tuple[str, int], tuple[SegmentFile, ...]] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    start: LogStart | None = None


@dataclass(frozen=True, slots=True)
class LogStart:
    """``data/start.json``: the first index of the log, the chain_crc of the entry just before it, and the byte
    position where the log continues (inside a data file after a snapshot was installed or restored: the bytes
    before it in that file were never written)."""

    first_index: int
    prev_chain_crc: int
    end_pos: int = 0


def read_start(data_dir: Path) -> LogStart | None:
    path = data_dir / START_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_bytes())
        return LogStart(int(doc["first_index"]), int(doc["prev"]["chain_crc"]), int(doc["prev"]["end_pos"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AuditInputError(f"{path}: unreadable log start record: {err}") from err


CLUSTER_MANIFEST = (
    "cluster.json"  # a local cluster's directory (broker_adapter/cluster/local.py, docs/cluster.md)
)


def cluster_groups(d: str) -> list[tuple[str, str]] | None:
    """(group name, group directory) of every group of the cluster in ``d``, or None when ``d`` is no cluster.

    Each group is its own Raft log, so a cluster is audited group by group."""
    path = Path(d) / CLUSTER_MANIFEST
    if not path.is_file():
        return None
    try:
        names = json.loads(path.read_text())["groups"]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise TypeError("groups is not a list of names")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AuditInputError(f"{path}: not a cluster manifest: {err}") from err
    return [(n, str(Path(d) / n)) for n in names]


def _is_node_dir(p: Path) -> bool:
    return (p / "data").is_dir()


def expand(dirs: list[str]) -> list[Path]:
    """Node directories named by ``dirs``: each is a node directory or a group directory of node directories."""
    if not dirs:
        raise AuditInputError("no node directory given: pass the data directories of the group's nodes")
    nodes: list[Path] = []
    for d in dirs:
        p = Path(d)
        if not p.exists():
            raise AuditInputError(f"{d}: no such directory")
        if not p.is_dir():
            raise AuditInputError(f"{d}: not a directory")
        if not os.access(p, os.R_OK | os.X_OK):
            raise AuditInputError(f"{d}: permission denied (the audit needs to read it)")
        if _is_node_dir(p):
            nodes.append(p)
            continue
        children = sorted(c for c in p.iterdir() if c.is_dir() and _is_node_dir(c))
        if not children:
            raise AuditInputError(
                f"{d}: not a node directory (no data/ inside) and holds no node directories: "
                "pass each node's data directory (with data/, index/, meta/) or a group directory"
            )
        nodes.extend(children)
    resolved = [n.resolve() for n in nodes]
    if len(set(resolved)) != len(resolved):
        raise AuditInputError("the same node directory was given twice: " + ", ".join(map(str, nodes)))
    return nodes


def _segments(d: Path, ignored: list[str]) -> tuple[SegmentFile, ...]:
    if not d.is_dir():
        return ()
    files = []
    for p in d.iterdir():
        if not (p.is_file() and len(p.name) == SEGMENT_NAME_DIGITS and p.name.isdigit()):
            if p.name != START_FILE:
                ignored.append(str(p))
            continue
        if not os.access(p, os.R_OK):
            raise AuditInputError(f"{p}: permission denied (the audit needs to read it)")
        files.append(SegmentFile(int(p.name), str(p), p.stat().st_size))
    return tuple(sorted(files, key=lambda f: f.start))


def _queues(root: Path, ignored: list[str]) -> dict[tuple[str, int], tuple[SegmentFile, ...]]:
    queues: dict[tuple[str, int], tuple[SegmentFile, ...]] = {}
    if not root.is_dir():
        return queues
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            ignored.append(str(topic_dir))
            continue
        for qdir in sorted(topic_dir.iterdir()):
            if not (qdir.is_dir() and qdir.name.isdigit()):
                ignored.append(str(qdir))
                continue
            queues[(topic_dir.name, int(qdir.name))] = _segments(qdir, ignored)
    return queues


def _labels(nodes: list[Path]) -> list[str]:
    names = [n.name for n in nodes]
    if len(set(names)) == len(names):
        return names
    return [str(n) for n in nodes]


def discover(dirs: list[str]) -> list[NodeLayout]:
    """List the files of every node named by ``dirs`` (see ``expand``)."""
    nodes = expand(dirs)
    layouts = []
    for i, (path, label) in enumerate(zip(nodes, _labels(nodes), strict=True)):
        ignored: list[str] = []
        try:
            data = _segments(path / "data", ignored)
            index = _segments(path / "index", ignored)
            queues = _queues(path / "consumequeue", ignored)
        except PermissionError as err:
            raise AuditInputError(f"{err.filename}: permission denied (the audit needs to read it)") from err
        meta = path / "meta"
        layouts.append(
            NodeLayout(
                node=i,
                name=label,
                root=str(path),
                data=data,
                index=index,
                meta_dir=str(meta) if meta.is_dir() else None,
                queues=queues,
                ignored=tuple(sorted(ignored)),
                start=read_start(path / "data"),
            )
        )
    return layouts
