"""The broker's chaos checkers: independent judges reading only the history and the nodes' final files.

1. ``acked_present``: every acknowledged message is in the committed log of every node exactly once, at the
   place its acknowledgement named, and the consumer group that ran to the end consumed every committed
   message; a message delivered twice must be explained by a consumer restart from a committed offset, and a
   committed offset never goes back.
2. ``nothing_unsent``: every message in the committed logs was invoked by a producer, none that the broker
   rejected (``fail``) is there, none is there twice.
3. ``queue_order``: per queue, the messages' queue offsets in log order are 0, 1, 2, ... on every node, and
   every node holds the same committed entries (index, term, chain_crc) and so the same queue contents.
4. the Spark audit of the final files (``dledger audit``), run by the broker workload
   (``broker_adapter.chaos.workload``).

The final files are read with the storage codec alone (no store object, nothing written): segments in order,
each frame's structure and CRCs checked, up to the commit index the runner observed once the group converged.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from broker_adapter.core import commands, message
from dledger.chaos.checkers import EXAMPLES, Verdict
from dledger.chaos.history import FAIL, INFO, INVOKE, OK, Event, operations
from storage import codec
from storage.segments import list_segments


@dataclass(frozen=True, slots=True)
class StoredMessage:
    index: int
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    pos: int


@dataclass(slots=True)
class NodeLog:
    """A node's committed entries as read from its files."""

    node: str
    entries: list[tuple[int, int, int]] = field(default_factory=list)  # (index, term, chain_crc)
    messages: list[StoredMessage] = field(default_factory=list)
    first_index: int = 0
    last_index: int = -1
    problems: list[str] = field(default_factory=list)


def read_node_log(node: str, data_dir: Path, commit_index: int) -> NodeLog:
    """Walk ``data_dir/data`` up to ``commit_index``: frames checked (magic, size, body_crc, chain_crc)."""
    out = NodeLog(node)
    start = data_dir / "data" / "start.json"
    prev_crc: int | None = None
    expect_index: int | None = None
    if start.exists():
        s = json.loads(start.read_text())
        out.first_index = int(s.get("first_index", 0))
        expect_index = out.first_index
    for base, path in list_segments(str(data_dir / "data")):
        with open(path, "rb") as f:
            buf = f.read()
        off = 0
        while off + codec.MIN_BLANK_LEN <= len(buf):
            magic = int.from_bytes(buf[off : off + 4], "big", signed=True)
            if magic == codec.MAGIC_BLANK:
                break  # the file's filler: the log continues in the next file
            if magic == 0:  # zeros: the start of a log after a snapshot install, or the unwritten end
                off += 1
                while off < len(buf) and buf[off] == 0:
                    off += 1
                continue
            try:
                h = codec.validate(buf, off, prev_crc)
            except codec.FrameError as e:
                if expect_index is not None and expect_index <= commit_index:
                    out.problems.append(f"{path} offset {off}: {e}")
                break
            if expect_index is not None and h.index != expect_index:
                out.problems.append(f"{path} offset {off}: index {h.index}, expected {expect_index}")
            if h.pos != base + off:
                out.problems.append(f"{path} offset {off}: pos {h.pos} is not its place {base + off}")
            if h.index > commit_index:
                break
            out.entries.append((h.index, h.term, h.chain_crc))
            if h.magic == codec.MAGIC_NORMAL:
                body = memoryview(buf)[off + codec.HEADER_SIZE : off + h.size]
                if commands.is_message(body):
                    try:
                        m = message.decode(body)
                    except message.MessageFormatError as e:
                        out.problems.append(f"{path} index {h.index}: bad message: {e}")
                    else:
                        out.messages.append(
                            StoredMessage(
                                h.index,
                                m.msg_id or "",
                                m.topic,
                                m.queue_id,
                                m.queue_offset,
                                m.physical_offset,
                                h.pos,
                            )
                        )
            prev_crc = h.chain_crc
            expect_index = h.index + 1
            off += h.size
    if out.entries:
        out.last_index = out.entries[-1][0]
    if out.last_index < commit_index:
        out.problems.append(f"holds entries up to {out.last_index}, the group committed up to {commit_index}")
    return out


def read_group(nodes: Sequence[tuple[str, str]], commit_index: int) -> list[NodeLog]:
    return [read_node_log(node, Path(d), commit_index) for node, d in nodes]


# -- 1 -----------------------------------------------------------------------------------------------------------


def check_acked_present(events: Sequence[Event], logs: Sequence[NodeLog], topic: str) -> Verdict:
    v = Verdict("acked_present")
    sends = operations(events, "send")
    acked = {o.value["msg_id"]: o for o in sends if o.type == OK}
    for lg in logs:
        for p in lg.problems:
            v.violation(f"{lg.node}: {p}")
        where: dict[str, list[StoredMessage]] = defaultdict(list)
        for m in lg.messages:
            if m.topic == topic:
                where[m.msg_id].append(m)
        for msg_id, op in acked.items():
            found = where.get(msg_id, [])
            if len(found) != 1:
                v.violation(
                    f"{lg.node}: acknowledged {msg_id} ({op.process}) is in the log {len(found)} times"
                )
                continue
            m = found[0]
            got = (m.queue_id, m.queue_offset, m.physical_offset)
            want = (op.value["queue_id"], op.value["queue_offset"], op.value["commitlog_offset"])
            if got != want:
                v.violation(
                    f"{lg.node}: {msg_id} acknowledged at (queue, offset, phys) {want}, stored at {got}"
                )
    # Consumption by the group that ran to the end.
    committed = (
        {(m.queue_id, m.queue_offset): m.msg_id for m in logs[0].messages if m.topic == topic} if logs else {}
    )
    deliveries: dict[tuple[int, int], list[Event]] = defaultdict(list)
    loads: dict[str, list[Event]] = defaultdict(list)
    acked_commits: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for e in events:
        if e.type == OK and e.f == "consume":
            deliveries[(e.value["queue_id"], e.value["queue_offset"])].append(e)
            if committed.get((e.value["queue_id"], e.value["queue_offset"])) not in (None, e.value["msg_id"]):
                v.violation(
                    f"{e.process} consumed {e.value['msg_id']} at {e.value['queue_id']}/{e.value['queue_offset']}, the log holds another message there"
                )
        elif e.type == OK and e.f == "load-offsets":
            loads[e.process].append(e)
            for q, off in e.value["offsets"].items():
                before = [o for t, o in acked_commits[int(q)] if t < e.time]
                if before and off < max(before):
                    v.violation(
                        f"{e.process} loaded offset {off} for queue {q} after offset {max(before)} was committed"
                    )
        elif e.type == OK and e.f == "commit":
            acked_commits[e.value["queue_id"]].append((e.time, e.value["offset"]))
    redelivered = 0
    for place, ds in deliveries.items():
        for prev, cur in itertools.pairwise(ds):
            explained = any(
                prev.time < ld.time < cur.time and ld.value["offsets"].get(str(place[0]), 0) <= place[1]
                for ld in loads[cur.process]
            )
            if explained:
                redelivered += 1
            else:
                v.violation(
                    f"{place} delivered twice (at {prev.time:.3f} to {prev.process}, {cur.time:.3f} to {cur.process}) without a restart"
                )
    missing = [p for p in committed if p not in deliveries]
    for p in missing[:EXAMPLES]:
        v.violation(f"committed message {committed[p]} at queue {p[0]} offset {p[1]} was never consumed")
    v.count += max(0, len(missing) - EXAMPLES)
    v.stats.update(
        acked=len(acked),
        nodes=len(logs),
        consumed=sum(len(d) for d in deliveries.values()),
        redelivered_after_restart=redelivered,
    )
    return v


# -- 2 -----------------------------------------------------------------------------------------------------------


def check_nothing_unsent(events: Sequence[Event], logs: Sequence[NodeLog], topic: str) -> Verdict:
    v = Verdict("nothing_unsent")
    invoked = {e.value["msg_id"] for e in events if e.type == INVOKE and e.f == "send"}
    failed = {o.value["msg_id"] for o in operations(events, "send") if o.type == FAIL}
    unknown = {o.value["msg_id"] for o in operations(events, "send") if o.type == INFO}
    for lg in logs:
        counts = Counter(m.msg_id for m in lg.messages if m.topic == topic)
        for msg_id, n in counts.items():
            if msg_id not in invoked:
                v.violation(f"{lg.node}: {msg_id!r} is in the log but no producer sent it")
            elif msg_id in failed:
                v.violation(f"{lg.node}: {msg_id} was rejected (fail) yet is in the log")
            if n > 1:
                v.violation(f"{lg.node}: {msg_id} is in the log {n} times")
        v.stats[f"{lg.node}_messages"] = sum(counts.values())
    if logs:
        present = {m.msg_id for m in logs[0].messages}
        v.stats["unknown_sends"] = len(unknown)
        v.stats["unknown_sends_committed"] = len(unknown & present)
    return v


# -- 3 -----------------------------------------------------------------------------------------------------------


def check_queue_order(logs: Sequence[NodeLog], topic: str) -> Verdict:
    v = Verdict("queue_order")
    reference: dict[tuple[int, int], str] | None = None
    ref_entries: dict[int, tuple[int, int]] | None = None
    for lg in logs:
        nxt: dict[int, int] = defaultdict(int)
        contents: dict[tuple[int, int], str] = {}
        for m in lg.messages:
            if m.topic != topic:
                continue
            if m.queue_offset != nxt[m.queue_id]:
                v.violation(
                    f"{lg.node}: queue {m.queue_id} index {m.index}: queue offset {m.queue_offset}, expected {nxt[m.queue_id]}"
                )
            nxt[m.queue_id] = m.queue_offset + 1
            if m.physical_offset != m.pos + codec.HEADER_SIZE:
                v.violation(
                    f"{lg.node}: index {m.index}: PHYSICALOFFSET {m.physical_offset} != pos + 48 = {m.pos + 48}"
                )
            contents[(m.queue_id, m.queue_offset)] = m.msg_id
        entries = {i: (t, c) for i, t, c in lg.entries}
        if reference is None:
            reference, ref_entries = contents, entries
            v.stats["queues"] = {str(q): n for q, n in sorted(nxt.items())}
            continue
        for place in sorted(set(reference) | set(contents)):
            if reference.get(place) != contents.get(place):
                v.violation(
                    f"{lg.node}: queue {place[0]} offset {place[1]} holds {contents.get(place)}, {logs[0].node} holds {reference.get(place)}"
                )
        for i in sorted(set(ref_entries) & set(entries)):
            if ref_entries[i] != entries[i]:
                v.violation(
                    f"{lg.node}: committed entry {i} (term, chain_crc) {entries[i]} != {logs[0].node}'s {ref_entries[i]}"
                )
                break
    return v


def summarize_sends(events: Sequence[Event]) -> dict[str, int]:
    sends = operations(events, "send")
    c = Counter(o.type for o in sends)
    return {"attempted": len(sends), "acked": c[OK], "failed": c[FAIL], "unknown": c[INFO]}
