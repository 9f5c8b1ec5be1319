"""Benchmark: what a broker node costs as the work grows (issue 27): many topics, and a long log.

Real three-node broker groups (separate processes on 127.0.0.1, flush "async"), side by side in one run:

- **topics**: a group with 1 topic against a group with ``--topics`` topics (8 queues each). Send rate with 16
  threads sharing one ``Producer`` (one message a call): to the one topic, to one topic among the many, and to
  a random topic among the many each time (spread); rounds alternate, after a snapshot on every node has made
  the first writes' queue files durable (timed on its own). Then each node's resident memory and open
  descriptors, and a follower killed with SIGKILL and restarted: seconds until it answers and until it has
  applied everything it had (the group is idle), and its memory after.
- **log**: a group with ``--messages`` messages in its log (small bodies, ``AsyncProducer.send_batch`` of 1,024
  from several tasks: the fastest broker path) against an empty group; the same follower restart. Both keep the
  whole log (``[broker] retention_hours``) and take snapshots every ``[snapshot] entries`` (100,000 by default),
  so a restart loads a snapshot and replays the log after it. Target: under 5 s with 10 million messages.

- **snapshot** (in process, no group): a broker state machine with ``--topics`` topics of 8 queues, one message
  in each queue since the last snapshot, then a snapshot as the node takes one: how long the event loop is held
  (``prepare_snapshot`` where the machine has it, then ``save_snapshot``; before it, ``save_snapshot`` flushed
  every queue itself) and how long the ConsumeQueue syncs take off the loop. Then one message to 8 of the queues
  and the same again: the cost of a snapshot after a little traffic.

Memory is ``VmRSS`` from ``/proc/PID/status``; CPU (``bench.proc_cpu``) is what the node processes used per
message sent. Free disk is checked before the log part (about 700 bytes a message over the three nodes).

    python -m bench.scale [--quick] [--topics 10000] [--messages 10000000] [--seconds 5] [--rounds 2]
                          [--part topics|log|snapshot|all] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.clients import _threads
from bench.proc_cpu import cpu_seconds
from broker_adapter.client import AsyncBrokerConnection, AsyncProducer, BrokerConnection, Producer
from broker_adapter.core import commands, message
from broker_adapter.core.statemachine import BrokerStateMachine
from dledger import group as grp
from statemachine.api import CommittedEntry

BODY = bytes(range(256)) * 4  # 1 KiB: what the send rates use
SMALL = b"0123456789abcdef"  # the log fill's bodies
QUEUES = 8
THREADS = 16
FILL_BATCH = 1024
FILL_TASKS = 4
BYTES_PER_MESSAGE = 700  # on disk over three nodes with 16-byte bodies: entry, index unit, ConsumeQueue unit
KEEP_ALL = "retention_hours = 1000000"


def node_status(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon (bytes: RSS less the mapped log and index pages, which are page cache) and open
    descriptors of a process (zeros when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {"rss": 0, "anon": 0, "fds": 0}
    kib = {
        k: int(v.split()[0])
        for k, _, v in (line.partition(":") for line in lines)
        if k in ("VmRSS", "RssAnon")
    }
    return {"rss": kib["VmRSS"] * 1024, "anon": kib["RssAnon"] * 1024, "fds": fds}


def mib(n: float) -> str:
    return f"{n / (1 << 20):.0f}"


def start(directory: Path) -> grp.GroupSpec:
    """Start the group in ``directory``, creating it first when there is none."""
    if grp.load(directory, missing_ok=True) is None:
        for n in grp.create(directory, 3, None, state_machine="broker", flush="async").nodes:
            config = Path(n.config)
            config.write_text(f"{config.read_text()}\n[broker]\n{KEEP_ALL}\n")
    g = grp.create(directory)
    for n in g.nodes:
        grp.start_node(n)
    grp.wait_for_leader(g, 300)  # a node reads its whole log at start (the Raft core's configuration scan)
    grp.wait_for_all(g, 30)
    return g


def create_topics(g: grp.GroupSpec, names: list[str], tasks: int = 32) -> float:
    """Create the topics from concurrent tasks; returns the seconds it took."""

    async def run() -> None:
        async with AsyncBrokerConnection(g.addresses) as c:
            todo = iter(names)

            async def worker() -> None:
                for name in todo:
                    await c.create_topic(name, QUEUES)

            await asyncio.gather(*(worker() for _ in range(tasks)))

    t0 = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - t0


def touch_queues(g: grp.GroupSpec, names: list[str], tasks: int = 16) -> float:
    """One message to every queue of every topic (a batch of ``QUEUES`` per topic, queues round robin), as a
    broker that has run a while holds: returns the seconds it took."""

    async def run() -> None:
        async with AsyncProducer(g.addresses) as p:
            todo = iter(names)

            async def worker() -> None:
                for name in todo:
                    await p.send_batch(name, [BODY] * QUEUES)

            await asyncio.gather(*(worker() for _ in range(tasks)))

    t0 = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - t0


def pids(g: grp.GroupSpec) -> list[int]:
    return [grp.read_pid(n) or 0 for n in g.nodes]


def send_rate(g: grp.GroupSpec, topics: list[str], seconds: float) -> tuple[float, float]:
    """16 threads sharing one Producer, each message to a random topic of ``topics``: (msg/s, node CPU us/msg)."""
    with Producer(g.addresses) as p:
        p.list_topics()  # what a user's first send does, outside the clock
        for t in topics[:THREADS]:
            p.send(t, BODY)
        cpu0 = cpu_seconds(pids(g))
        t0 = time.perf_counter()
        rate = _threads(THREADS, seconds, lambda _k: lambda: p.send(random.choice(topics), BODY))
        n = rate * (time.perf_counter() - t0)
        return rate, (cpu_seconds(pids(g)) - cpu0) / max(n, 1) * 1e6


def restart_follower(g: grp.GroupSpec, timeout_s: float = 300.0) -> dict[str, float]:
    """Kill -9 a follower of an idle group and start it again: seconds until it answers, until it has applied
    what it had, and its memory then."""
    rows = grp.status(g)
    lead = grp.leader_of(rows)
    assert lead is not None and lead.commit_index is not None
    target = lead.commit_index
    follower = next(n for n in g.nodes if n.id != lead.id)
    grp.kill_node(follower)
    t0 = time.perf_counter()
    grp.start_node(follower)
    answered = caught_up = None
    deadline = t0 + timeout_s
    while time.perf_counter() < deadline:
        row = next(r for r in grp.status(g, 0.3) if r.id == follower.id)
        if row.role != "down" and answered is None:
            answered = time.perf_counter() - t0
        if row.applied_index is not None and row.applied_index >= target:
            caught_up = time.perf_counter() - t0
            break
        time.sleep(0.02)
    if caught_up is None:
        raise RuntimeError(f"{follower.id} did not catch up with index {target} in {timeout_s} s")
    st = node_status(grp.read_pid(follower) or 0)
    return {"answers_s": answered or caught_up, "caught_up_s": caught_up, **st}


def wait_applied(g: grp.GroupSpec, timeout_s: float = 600.0) -> int:
    """Until every node has applied the leader's commit index; returns it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = grp.status(g, 1.0)
        lead = grp.leader_of(rows)
        if lead is not None and all((r.applied_index or -1) >= (lead.commit_index or 0) for r in rows):
            return lead.commit_index or 0
        time.sleep(0.2)
    raise RuntimeError("the group did not apply its log in time")


def fill(g: grp.GroupSpec, topic: str, messages: int) -> float:
    """Send ``messages`` small messages with the batched async path; returns msg/s."""

    async def run() -> None:
        async with AsyncProducer(g.addresses) as p:
            todo = iter(range(0, messages, FILL_BATCH))

            async def worker() -> None:
                for i in todo:
                    await p.send_batch(topic, [SMALL] * min(FILL_BATCH, messages - i))

            await asyncio.gather(*(worker() for _ in range(FILL_TASKS)))

    t0 = time.perf_counter()
    asyncio.run(run())
    return messages / (time.perf_counter() - t0)


def memory_row(name: str, g: grp.GroupSpec) -> str:
    sts = [node_status(p) for p in pids(g)]
    return (
        f"  {name:<22} RSS {', '.join(mib(s['rss']) for s in sts)} MiB "
        f"(anonymous {', '.join(mib(s['anon']) for s in sts)}); open fds {', '.join(str(s['fds']) for s in sts)}"
    )


def restart_row(name: str, r: dict[str, float]) -> str:
    return (
        f"  {name:<22} answers after {r['answers_s']:.2f} s, caught up after {r['caught_up_s']:.2f} s; "
        f"RSS then {mib(r['rss'])} MiB (anonymous {mib(r['anon'])}), {r['fds']:.0f} fds"
    )


def snapshot_all(group_dir: Path) -> float:
    """Seconds ``dledger snapshot`` takes on every node of the group (each answers once its snapshot is
    published, the queue files it covers synced)."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "dledger", "snapshot", "--dir", str(group_dir)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return time.perf_counter() - t0


def topics_part(root: Path, n_topics: int, seconds: float, rounds: int) -> None:
    one = start(root / "one-topic")
    many = start(root / "many-topics")
    try:
        with BrokerConnection(one.addresses) as c:
            c.create_topic("t0", QUEUES)
        names = [f"t{i}" for i in range(n_topics)]
        took = create_topics(many, names)
        print(f"created {n_topics:,} topics of {QUEUES} queues in {took:.1f} s ({n_topics / took:,.0f}/s)")
        print("idle, after creating the topics:")
        print(memory_row("1 topic", one))
        print(memory_row(f"{n_topics:,} topics", many))
        took = touch_queues(many, names)
        print(f"one message to each of the {n_topics * QUEUES:,} queues: {took:.1f} s")
        print(memory_row(f"{n_topics:,} topics", many))
        # The next snapshot makes every queue file written since the last one durable (a syncfs from 64 files):
        # taken here, timed, so that the send rounds measure sending, not that one-time sync.
        for label, d in (("1 topic", root / "one-topic"), (f"{n_topics:,} topics", root / "many-topics")):
            print(f"a snapshot on every node after the first writes, {label}: {snapshot_all(d):.1f} s")
        cases = {
            "1 topic": (one, ["t0"]),
            f"one of {n_topics:,} topics": (many, [names[n_topics // 2]]),
            f"spread over {n_topics:,}": (many, names),
        }
        rates: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for r in range(rounds):
            for name, (g, ts) in cases.items():
                rates[name].append(send_rate(g, ts, seconds))
                rate, cpu = rates[name][-1]
                print(f"round {r + 1}  {name:<26} {rate:8,.0f} msg/s  node CPU {cpu:6.0f} us/msg", flush=True)
        base = statistics.median(x for x, _ in rates["1 topic"])
        print(
            f"\nsend, {THREADS} threads sharing one Producer, 1 KiB, one message a call (median of {rounds}):"
        )
        for name, xs in rates.items():
            med = statistics.median(x for x, _ in xs)
            cpu = statistics.median(c for _, c in xs)
            print(f"  {name:<26} {med:8,.0f} msg/s  {med / base:5.2f}x  node CPU {cpu:5.0f} us/msg")
        print("after sending:")
        print(memory_row("1 topic", one))
        print(memory_row(f"{n_topics:,} topics", many))
        print("a follower killed (SIGKILL) and restarted, the group idle:")
        print(restart_row("1 topic", restart_follower(one)))
        print(restart_row(f"{n_topics:,} topics", restart_follower(many)))
    finally:
        grp.stop_group(one)
        grp.stop_group(many)


def log_part(root: Path, messages: int) -> None:
    free = shutil.disk_usage(root).free
    need = messages * BYTES_PER_MESSAGE
    if need > free * 0.8:
        raise SystemExit(
            f"the log part needs about {need >> 30} GiB under {root} and {free >> 30} GiB are free: "
            "use --messages or --dir"
        )
    refill = grp.load(root / "full-log", missing_ok=True) is None  # else the log of an earlier run (--dir)
    full = start(root / "full-log")
    empty = start(root / "empty-log")
    try:
        for g in (full, empty):
            with BrokerConnection(g.addresses) as c:
                c.create_topic("log", QUEUES)
        if refill:
            t0 = time.perf_counter()
            rate = fill(full, "log", messages)
            last = wait_applied(full)
            took = time.perf_counter() - t0
            print(f"\nfilled {messages:,} messages of {len(SMALL)} bytes at {rate:,.0f} msg/s ({took:.0f} s)")
        else:
            last = wait_applied(full)
            print(f"\nthe log an earlier run left in {root / 'full-log'}")
        used = sum(f.stat().st_size for f in (root / "full-log" / "n0").rglob("*") if f.is_file())
        print(f"  one node's directory: {used / (1 << 30):.2f} GiB; log index {last:,}")
        print("idle:")
        print(memory_row(f"{messages:,} messages", full))
        print(memory_row("empty log", empty))
        print("a follower killed (SIGKILL) and restarted, the group idle (target: under 5 s):")
        print(restart_row(f"{messages:,} messages", restart_follower(full)))
        print(restart_row("empty log", restart_follower(empty)))
    finally:
        grp.stop_group(full)
        grp.stop_group(empty)


def snapshot_part(root: Path, n_topics: int) -> None:
    sm = BrokerStateMachine(root / "snapshot" / "consumequeue")
    pos = 0

    def entry(body: bytes) -> CommittedEntry:
        nonlocal pos
        e = CommittedEntry(sm.applied_index + 1, 1, pos, body)
        pos += 48 + len(body)
        return e

    def messages(targets: list[tuple[str, int]]) -> None:
        for k in range(0, len(targets), FILL_BATCH):
            batch = []
            for t, q in targets[k : k + FILL_BATCH]:
                raw = bytearray(message.encode(message.Message(topic=t, body=SMALL, queue_id=q)))
                message.patch_placement(raw, sm.next_offset(t, q), pos + 48)
                batch.append(entry(bytes(raw)))
            sm.apply(batch)

    def snapshot(what: str) -> None:
        t0 = time.perf_counter()
        prepare = getattr(sm, "prepare_snapshot", None)
        durable = prepare() if prepare is not None else None
        capture = getattr(sm, "capture_snapshot", None)  # as the runtime: the state serialized off the loop
        write = capture() if capture is not None else None
        if write is None:
            sm.save_snapshot(io.BytesIO())
        t1 = time.perf_counter()
        if durable is not None:
            durable()
        if write is not None:
            write(io.BytesIO())
        t2 = time.perf_counter()
        print(
            f"  snapshot after {what:<34} event loop held {t1 - t0:6.2f} s, "
            f"syncs and serialization off the loop {t2 - t1:6.2f} s"
        )

    topics = [f"t{i}" for i in range(n_topics)]
    for k in range(0, n_topics, FILL_BATCH):
        sm.apply(
            [entry(commands.encode(commands.CreateTopic(t, QUEUES))) for t in topics[k : k + FILL_BATCH]]
        )
    print(f"\nbroker state machine in process, {n_topics * QUEUES:,} queues:")
    messages([(t, q) for t in topics for q in range(QUEUES)])
    snapshot(f"a message to each of {n_topics * QUEUES:,} queues")
    messages([(topics[0], q) for q in range(QUEUES)])
    snapshot(f"a message to each of {QUEUES} queues")
    sm.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small numbers: a smoke test of a minute or two")
    ap.add_argument("--topics", type=int, default=None, help="topics of the many-topics group (10,000)")
    ap.add_argument("--messages", type=int, default=None, help="messages of the long log (10,000,000)")
    ap.add_argument("--seconds", type=float, default=None, help="length of one send measurement (5)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--part", choices=("topics", "log", "snapshot", "all"), default="all")
    ap.add_argument("--dir", type=Path, default=None, help="where the groups live (default: a temporary dir)")
    args = ap.parse_args(argv)
    topics = args.topics or (300 if args.quick else 10_000)
    messages = args.messages or (100_000 if args.quick else 10_000_000)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"bench.scale: 3-node groups, flush async, on {os.cpu_count()} CPUs; data under {root}")
    try:
        if args.part in ("topics", "all"):
            topics_part(root, topics, seconds, args.rounds)
        if args.part in ("log", "all"):
            log_part(root, messages)
        if args.part in ("snapshot", "all"):
            snapshot_part(root, topics)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
