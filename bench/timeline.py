"""Benchmark: where one sequential write's time goes, hop by hop across the client and the three nodes (issue 27;
docs/send-budget.md, "Hop by hop"; the marks are dledger/timeline.py's).

    python -m bench.timeline [--sends 2000] [--batch 1] [--kinds send,append] [--flush async]

One 3-node broker group (real node processes on 127.0.0.1), and in this process one client per kind: ``send``
is ``AsyncProducer.send`` (``send_batch`` with ``--batch`` N), ``append`` the raw log's
``AsyncDLedgerClient.append`` (``append_batch``), both on their streams, one call at a time. Every process runs
with ``DLEDGER_TIMELINE`` set, so each records when it reached each mark on the machine's monotonic clock. After
a warm-up, ``--sends`` calls of each kind (the kinds alternating in rounds); then every call's records, from the
client's submit to its caller's resumption, are put in order along the write's critical path:

    client submit -> leader's stream request -> leader's Ready -> leader's write to the follower that answered
    first -> that follower's Pipe request -> its answer -> the leader's acknowledgement step -> commit -> the
    leader's stream answer -> the client's answer -> the caller resumed

Each hop's median and mean are printed (the means add up to the mean total). A hop marked "(gRPC)" runs from
one process handing a message to gRPC until the other process's code has it: the message in flight, and the
time the receiving loop took to get to it (a leader still writing to its other follower or persisting its own
copy answers an acknowledgement late). The others are one process's work and its loop turns. The leader's own
Ready, from its writes to both followers through its persist, runs alongside the follower's and is printed
apart. A call whose records do not line up (the leader changed, a mark missing) is counted and left out.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.jetstream_ours import RETAIN_ALL
from broker_adapter.client import AsyncProducer, BrokerConnection
from dledger import group as grp
from dledger import timeline
from dledger.client import AsyncDLedgerClient

BODY = bytes(range(256)) * 4  # 1 KiB, as the other broker benchmarks send
TOPIC = "timeline"
QUEUES = 4
# Calls of each kind before the measured ones (connections, the leader found, caches); batches: a tenth as many.
WARMUP_CALLS = 200

# The hops of a call's critical path, in order (``line_up``): A is the follower whose Pipe answer came first.
HOPS: tuple[str, ...] = (
    "client -> leader (gRPC)",
    "leader: checks, proposal, Ready",
    "leader: Ready -> write to the follower",
    "leader -> follower (gRPC)",
    "follower: step, persist, answer",
    "follower -> leader (gRPC)",
    "leader: ack step -> commit",
    "leader: commit -> stream answer",
    "leader -> client (gRPC)",
    "client: answer -> caller",
)
LEADER_PERSIST = "leader: Ready -> its own copy persisted (alongside)"

Record = tuple[int, str, str]  # (monotonic ns, role, mark)


@dataclass
class Lined:
    """The calls of one kind, lined up: per hop, each call's microseconds; and how many could not be."""

    hops: dict[str, list[float]]
    totals_us: list[float]
    skipped: int


def read_records(directory: Path, roles: dict[int, str]) -> list[Record]:
    """Every record of the processes named in ``roles`` (pid -> role), in time order."""
    out: list[Record] = []
    for pid, role in roles.items():
        path = directory / f"{pid}{timeline.SUFFIX}"
        if not path.exists():
            continue
        for line in path.read_text(encoding="ascii").splitlines():
            t, name = line.split(" ", 1)
            out.append((int(t), role, name))
    out.sort()
    return out


def _first(records: list[Record], lo: int, hi: int, role: str, name: str, after: int) -> int | None:
    """Time of the first record (role, name) at or after ``after``, within records[lo:hi]."""
    for t, r, n in records[lo:hi]:
        if t >= after and r == role and n == name:
            return t
    return None


def line_up(records: list[Record], windows: Iterable[tuple[int, int]], followers: Sequence[str]) -> Lined:
    """Each window (one call: its client submit and caller-resumed times) along ``HOPS``. ``followers``: the
    followers' roles (their ``send.<role>`` marks name them as the leader's peers)."""
    times = [r[0] for r in records]
    hops: dict[str, list[float]] = {h: [] for h in (*HOPS, LEADER_PERSIST)}
    totals: list[float] = []
    skipped = 0
    for t0, t1 in windows:
        lo, hi = bisect.bisect_left(times, t0), bisect.bisect_right(times, t1)
        request = _first(records, lo, hi, "L", "stream.request", t0)
        ready = None if request is None else _first(records, lo, hi, "L", "ready", request)
        answered: list[tuple[int, str, int, int]] = []  # (answer, follower, its request, the leader's write)
        if ready is not None:
            for f in followers:
                sent = _first(records, lo, hi, "L", f"send.{f}", ready)
                got = None if sent is None else _first(records, lo, hi, f, "pipe.request", sent)
                answer = None if got is None else _first(records, lo, hi, f, "stream.answer", got)
                if sent is not None and got is not None and answer is not None:
                    answered.append((answer, f, got, sent))
        if ready is None or request is None or not answered:
            skipped += 1
            continue
        answer, _, got, sent = min(answered)
        ack = _first(records, lo, hi, "L", "ack", answer)
        commit = None if ack is None else _first(records, lo, hi, "L", "commit", ack)
        reply = None if commit is None else _first(records, lo, hi, "L", "stream.answer", commit)
        back = None if reply is None else _first(records, lo, hi, "C", "client.answer", reply)
        if back is None or ack is None or commit is None or reply is None:
            skipped += 1
            continue
        path = [t0, request, ready, sent, got, answer, ack, commit, reply, back, t1]
        if any(b < a for a, b in itertools.pairwise(path)):
            skipped += 1
            continue
        for hop, a, b in zip(HOPS, path, path[1:], strict=False):
            hops[hop].append((b - a) / 1000)
        persisted = _first(records, lo, hi, "L", "persisted", ready)
        if persisted is not None:
            hops[LEADER_PERSIST].append((persisted - ready) / 1000)
        totals.append((t1 - t0) / 1000)
    return Lined(hops, totals, skipped)


def windows_of(records: list[Record], since: int, until: int) -> list[tuple[int, int]]:
    """(submit, caller resumed) of each client call between ``since`` and ``until``."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    for t, role, name in records:
        if role != "C" or not since <= t <= until:
            continue
        if name == "client.submit":
            start = t
        elif name == "client.done" and start is not None:
            out.append((start, t))
            start = None
    return out


def table(kind: str, lined: Lined) -> str:
    n = len(lined.totals_us)
    rows = [
        f"### {kind}: {n} calls lined up ({lined.skipped} left out)",
        "",
        "| hop | p50 us | mean us | share of the mean |",
        "|---|---:|---:|---:|",
    ]
    total = statistics.fmean(lined.totals_us) if n else 0.0
    for hop in HOPS:
        v = lined.hops[hop]
        if v:
            mean = statistics.fmean(v)
            rows.append(f"| {hop} | {statistics.median(v):.0f} | {mean:.0f} | {mean / total:.0%} |")
    grpc_mean = sum(statistics.fmean(lined.hops[h]) for h in HOPS if "(gRPC)" in h and lined.hops[h])
    if n:
        rows.append(
            f"| **whole call** | **{statistics.median(lined.totals_us):.0f}** | **{total:.0f}** | "
            f"(gRPC) hops {grpc_mean / total:.0%} |"
        )
    persist = lined.hops[LEADER_PERSIST]
    if persist:
        rows.append(
            f"| {LEADER_PERSIST} | {statistics.median(persist):.0f} | {statistics.fmean(persist):.0f} | |"
        )
    return "\n".join(rows)


async def _calls(kinds: Sequence[str], addresses: list[str], sends: int, batch: int) -> dict[str, list[int]]:
    """Run the calls (the kinds alternating in rounds of 100); per kind, the (start, end) marks' bounds."""
    producer = AsyncProducer(addresses)
    client = AsyncDLedgerClient(addresses)
    bodies = [BODY] * batch
    call: dict[str, Callable[[], Awaitable[object]]] = {
        "send": (lambda: producer.send(TOPIC, BODY))
        if batch == 1
        else (lambda: producer.send_batch(TOPIC, bodies)),
        "append": (lambda: client.append(BODY)) if batch == 1 else (lambda: client.append_batch(bodies)),
    }
    spans: dict[str, list[int]] = {k: [] for k in kinds}
    try:
        for k in kinds:
            for _ in range(WARMUP_CALLS if batch == 1 else WARMUP_CALLS // 10):
                await call[k]()
        timeline.flush()
        done = dict.fromkeys(kinds, 0)
        while any(done[k] < sends for k in kinds):
            for k in kinds:
                n = min(100, sends - done[k])
                if n <= 0:
                    continue
                t0 = time.monotonic_ns()
                for _ in range(n):
                    await call[k]()
                spans[k] += [t0, time.monotonic_ns()]
                done[k] += n
    finally:
        await producer.close()
        await client.close()
    return spans


def run(directory: Path, kinds: Sequence[str], sends: int, batch: int, flush: str) -> str:
    marks = directory / "marks"
    marks.mkdir(parents=True)
    os.environ[timeline.ENV] = str(marks)  # the nodes started below inherit it
    timeline.record_to(str(marks))
    try:
        g = grp.create(directory / "group", 3, None, state_machine="broker", flush=flush)
        for spec in g.nodes:
            with open(Path(spec.data_dir) / "node.toml", "a", encoding="utf-8") as f:
                f.write(RETAIN_ALL)
        for spec in g.nodes:
            grp.start_node(spec)
        try:
            grp.wait_for_all(g, 30)
            with BrokerConnection(g.addresses) as c:
                c.create_topic(TOPIC, QUEUES)
            leader = grp.wait_for_leader(g, 30).id
            pids = {spec.id: grp.read_pid(spec) for spec in g.nodes}
            spans = asyncio.run(_calls(kinds, g.addresses, sends, batch))
            still = grp.wait_for_leader(g, 30).id
        finally:
            grp.stop_group(g)  # the nodes write their last records as they exit
    finally:
        timeline.record_to(None)
        os.environ.pop(timeline.ENV, None)
    roles = {os.getpid(): "C"}
    followers = []
    for node_id, pid in pids.items():
        if pid is None:
            continue
        role = "L" if node_id == leader else node_id
        roles[pid] = role
        if role != "L":
            followers.append(node_id)
    records = read_records(marks, roles)
    out = [
        f"Hop by hop, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {sends} sequential calls per kind, "
        f"{batch} x 1 KiB each, flush {flush}, leader {leader}"
        + ("" if still == leader else f" (then {still}: calls after the change are left out)"),
        "",
    ]
    for k in kinds:
        s = spans[k]
        windows = [w for a, b in zip(s[::2], s[1::2], strict=True) for w in windows_of(records, a, b)]
        out += [table(k, line_up(records, windows, followers)), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=2000, help="measured calls per kind (default 2000)")
    ap.add_argument("--batch", type=int, default=1, help="messages per call (default 1; e.g. 256)")
    ap.add_argument(
        "--kinds", default="send,append", help="send (AsyncProducer), append (AsyncDLedgerClient)"
    )
    ap.add_argument("--flush", default="async", choices=("sync", "async"))
    ap.add_argument("--dir", type=Path, default=None, help="keep the group and the records here")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in ("send", "append") for k in kinds):
        ap.error("--kinds takes send and/or append")
    base = args.dir or Path(tempfile.mkdtemp(prefix="dledger-timeline-"))
    try:
        print(run(base / "run", kinds, args.sends, args.batch, args.flush))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
