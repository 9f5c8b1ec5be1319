"""Power cuts of real node processes, and the checker of what they may take (issue 20, docs/chaos.md).

A power cut of some nodes: first a *mark* is taken (the highest commit index any node reports, and the
(term, chain_crc) of every entry up to it, read from that node's files), then every chosen node is killed with
SIGKILL at once, then ``storage.powerloss.power_loss`` rewrites each node's directory to what its disk would
hold (its journal names what it had not synced; "drop" or "torn" drawn per node). The nodes start again at the
heal.

``check_power_loss`` judges the marks against the nodes' final files: with the ``sync`` flush policy every entry
committed before a cut must still be there, the same entry at the same index (equal chain_crc proves the whole
prefix equal), and every node must have come back (a torn tail is cut by recovery, never refused). A lost entry
is named by its index. With ``async`` the losses are counted, not judged: that is the policy's trade-off.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger import group as grp
from dledger.chaos.checkers import Verdict
from dledger.chaos.history import OK, Event
from storage import codec
from storage.powerloss import power_loss
from storage.segments import list_segments


@dataclass(slots=True)
class Mark:
    """What was committed just before a power cut."""

    number: int
    at: float  # history time
    kind: str
    nodes: list[str]
    commit_index: int
    source: str  # the node whose files the chains were read from
    chains: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (term, chain_crc), to commit
    positions: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # pos -> (index, term, chain)


def read_chains(
    data_dir: str | Path, upto: int, positions: dict[int, tuple[int, int, int]] | None = None
) -> tuple[int, dict[int, tuple[int, int]]]:
    """(first index, {index: (term, chain_crc)}) of a node's entries up to ``upto``, read from its data files
    with the codec alone (frames checked; reading stops at the first bad frame). ``positions``, if given, gets
    pos -> (index, term, chain_crc) of every entry, past ``upto`` too."""
    out: dict[int, tuple[int, int]] = {}
    first = None
    prev: int | None = None
    for _base, path in list_segments(str(Path(data_dir) / "data")):
        with open(path, "rb") as f:
            buf = f.read()
        off = 0
        while off + codec.MIN_BLANK_LEN <= len(buf):
            magic = int.from_bytes(buf[off : off + 4], "big", signed=True)
            if magic == codec.MAGIC_BLANK:
                break
            if magic == 0:  # the zeros before a log that starts after a snapshot
                off += 1
                while off < len(buf) and buf[off] == 0:
                    off += 1
                continue
            try:
                h = codec.validate(buf, off, prev)
            except codec.FrameError:
                return (first if first is not None else 0), out
            if positions is not None:
                positions[h.pos] = (h.index, h.term, h.chain_crc)
            elif h.index > upto:
                return (first if first is not None else 0), out
            if first is None:
                first = h.index
            if h.index <= upto:
                out[h.index] = (h.term, h.chain_crc)
            prev = h.chain_crc
            off += h.size
    return (first if first is not None else 0), out


def cut_power(
    group: grp.GroupSpec,
    nodes: list[str],
    rng: random.Random,
    number: int,
    now: Callable[[], float],
    kind: str,
    modes: tuple[str, ...] = ("drop", "torn"),
) -> tuple[Mark | None, dict[str, Any]]:
    """Take the mark, SIGKILL every node in ``nodes`` at once, then rewrite each directory as the power cut
    leaves it. The commit index is asked for just before the kill; the mark's time (``now()``, the history's
    clock) is taken just after the signals, so every acknowledgement recorded before it was sent before the cut;
    the chains are read from the page cache the dead processes left (all they wrote), before anything is
    dropped."""
    rows = [r for r in grp.status(group, timeout_s=2.0) if r.commit_index is not None and r.commit_index >= 0]
    pids = {}
    for nid in nodes:  # every signal first, then the waits: the nodes die together
        spec = group.node(nid)
        pid = grp.read_pid(spec)
        if pid is not None and grp.is_running(spec, pid):
            os.kill(pid, signal.SIGKILL)
            pids[nid] = pid
    at = now()
    for nid, pid in pids.items():
        spec = group.node(nid)
        deadline = time.monotonic() + 5.0
        while grp.is_running(spec, pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.005)
    mark = None
    if rows:
        # The leader if it answered (it holds every acknowledged entry), else the node that knows most commits.
        src = max(rows, key=lambda r: (r.role == "leader", r.commit_index or -1))
        c = max(r.commit_index or -1 for r in rows)
        positions: dict[int, tuple[int, int, int]] = {}
        mark = Mark(number, at, kind, nodes, c, src.id, read_chains(src.data_dir, c, positions)[1], positions)
    lost = {}
    for nid in nodes:
        mode = rng.choice(modes)
        rep = power_loss(group.node(nid).data_dir, random.Random(rng.getrandbits(32)), mode).to_json()
        lost[nid] = {
            "mode": rep["mode"],
            "bytes_lost": rep["bytes_lost"],
            "files": rep["files"],
            "torn_bytes_kept": sum(rep["torn"].values()),
            "undone": {k: len(rep[k]) for k in ("undone_creations", "restored_removals", "undone_renames")},
            "meta_undone": rep["meta_undone"],
        }
    return mark, {"pids": pids, "lost": lost}


def refused_to_start(group: grp.GroupSpec, nodes: list[str], timeout_s: float = 30.0) -> dict[str, str]:
    """Wait until every node in ``nodes`` answers; those whose process died name the end of their log."""
    deadline = time.monotonic() + timeout_s
    pending = set(nodes)
    while pending and time.monotonic() < deadline:
        rows = {r.id: r for r in grp.status(group, timeout_s=1.0)}
        pending = {n for n in pending if rows.get(n) is None or rows[n].role == "down"}
        if all(not grp.is_running(group.node(n)) for n in pending):
            break  # every node still missing has exited: waiting longer changes nothing
        time.sleep(0.1)
    out = {}
    for nid in pending:
        spec = group.node(nid)
        if grp.is_running(spec):
            continue  # slow, not refusing: liveness is judged elsewhere
        try:
            tail = (Path(spec.data_dir) / "node.log").read_text(errors="replace").strip().splitlines()[-3:]
        except FileNotFoundError:
            tail = []
        out[nid] = " | ".join(tail)
    return out


def acknowledged_before(mark: Mark, events: Sequence[Event]) -> dict[int, tuple[int, int]]:
    """The entries the mark must keep: every index up to its commit index, and every entry a client had been
    acknowledged before the cut (broker sends name their place: commitlog_offset = entry pos + 48), which the
    commit index seen a moment earlier may not cover yet."""
    keep = dict(mark.chains)
    for e in events:
        if e.type != OK or e.time >= mark.at or "commitlog_offset" not in e.value:
            continue
        hit = mark.positions.get(int(e.value["commitlog_offset"]) - codec.HEADER_SIZE)
        if hit is not None:
            keep.setdefault(hit[0], (hit[1], hit[2]))
    return keep


def check_power_loss(
    marks: list[Mark],
    refusals: list[tuple[int, str, str]],
    group: grp.GroupSpec,
    flush: str,
    commit_index: int,
    events: Sequence[Event] = (),
) -> Verdict:
    """Nothing committed or acknowledged before a power cut is lost (``sync``), or how much was (``async``)."""
    v = Verdict("power_loss")
    for number, nid, why in refusals:
        v.violation(f"after power cut #{number}, {nid} refused to start: {why}")
    finals = {n.id: read_chains(n.data_dir, commit_index) for n in group.nodes}
    lost_total = 0
    worst = 0
    checked = 0
    for m in marks:
        keep = acknowledged_before(m, events)
        checked += len(keep)
        lost_here = 0
        for nid, (first, chains) in finals.items():
            # Equal chain_crc at an index proves the whole prefix up to it equal.
            lost = [i for i in sorted(keep) if i >= first and chains.get(i) != keep[i]]
            lost_here = max(lost_here, len(lost))
            if lost and flush == "sync":
                i = lost[0]
                have = chains.get(i)
                v.violation(
                    f"entry {i} (term {keep[i][0]}), committed before power cut #{m.number} ({m.kind} of "
                    f"{', '.join(m.nodes)} at {m.at:.1f}s), is lost on {nid}"
                    + (" (its log ends before it)" if have is None else f" (it holds term {have[0]} there)")
                    + f"; {len(lost)} such entries"
                )
        lost_total += lost_here
        worst = max(worst, lost_here)
    v.stats.update(
        flush=flush,
        power_cuts=len(marks),
        committed_entries_checked=checked,
        committed_entries_lost=lost_total,
        most_lost_in_one_cut=worst,
    )
    return v
