"""Benchmark: CPU per message of every process (leader, followers, client) for broker sends against raw log
appends, in the same run (issue 15: on a small machine the broker's throughput is bounded by CPU per message,
not by latency), and the leader's CPU per message by stage of a write (issue 27).

One real three-node group (separate processes on 127.0.0.1, 1 KiB bodies); workloads, alternating round by
round:

- ``send-64``: 64 asyncio tasks on one ``AsyncProducer``, one message per call (its session, ``SendStream``);
- ``append-64``: the same on one ``AsyncDLedgerClient`` (the baseline);
- ``unary-64``: 64 tasks calling the broker's unary ``Send``, one message per call;
- ``official-64``: the official RocketMQ 5 client, ``send_async`` with 64 sends in flight (as
  ``bench.rocketmq_client`` drives it; its producer's startup and warm-up send fall inside the window). The
  leader is placed on the node the client dials (no forwarding hop) before every workload, so every workload
  has the same leader;
- ``send-batch``: one task calling ``AsyncProducer.send_batch`` of 256;
- ``append-batch``: one task calling ``AsyncDLedgerClient.append_batch`` of 256 (the baseline).

CPU is read from ``/proc/PID/stat`` (user + system, every thread) of each node before and after the window, and
from ``os.times()`` for the client (this process). Printed: msg/s and microseconds of CPU per message per
process, and the ratio broker / raw per process. Throughput moves with the machine's load; CPU per message far
less, so compare those.

The leader is sampled with py-spy during each window (when py-spy is installed; ``--no-stages`` skips it) and
each sample charged to a stage (``bench/stages.py``: receive, check, propose, persist, replicate, dispatch,
answer, other); each thread's CPU from ``/proc`` is shared among its samples, so the stages add up to the
leader's measured CPU per message. The stage table pools the rounds. With ``--profile DIR`` every node's raw
stacks are kept in DIR.

    python -m bench.cpu_per_message [--seconds 5] [--rounds 2] [--quick] [--flush sync|async] [--no-stages]
        [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials

from bench import stages
from bench.proc_cpu import cpu_seconds, thread_cpu_seconds
from bench.rocketmq_client import place_leader
from bench.rocketmq_workloads import official_send_async
from bench.send_budget import _commit, _py_spy
from broker_adapter.client import AsyncProducer, BrokerConnection
from broker_adapter.v1 import broker_pb2
from dledger import group as grp
from dledger.client import AsyncDLedgerClient

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench-cpu"
BATCH = 256
TASKS = 64
WORKLOADS = ("send-64", "append-64", "unary-64", "official-64", "send-batch", "append-batch")
SPY = ("record", "--nonblocking", "-r", "100", "-f", "raw", "--threads", "--full-filenames")
ATTACH_S = 0.5  # py-spy attached before the window opens
BASELINE = {
    "send-64": "append-64",
    "unary-64": "append-64",
    "official-64": "append-64",
    "send-batch": "append-batch",
}
_official_rate = [1000.0]  # the last official-64 rate: sizes its next window (it sends a count, not a time)


@dataclass
class Stages:
    """One workload's leader CPU by stage, pooled over its rounds."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(stages.STAGES, 0.0))
    messages: int = 0
    samples: int = 0
    others: collections.Counter[str] = field(default_factory=collections.Counter)  # CPU s by part


def _client(
    workload: str, addresses: list[str], seconds: float
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[int]], int, bool]:
    """(close, one operation returning the messages it carried, concurrent tasks, whether the operation is
    the whole window: the official client sends a count of messages in a thread)."""
    if workload == "official-64":
        cfg = ClientConfiguration(";".join(addresses), Credentials(), request_timeout=10)
        n = max(200, int(_official_rate[0] * seconds))

        async def official() -> int:
            await asyncio.to_thread(official_send_async, cfg, TOPIC, n, TASKS)
            return n

        return _closed, official, 1, True
    if workload.startswith(("send", "unary")):
        p = AsyncProducer(addresses)
        if workload == "send-64":
            return p.close, lambda: _one(p.send(TOPIC, BODY)), TASKS, False
        if workload == "unary-64":
            return p.close, lambda: _unary(p), TASKS, False
        return p.close, lambda: _many(p.send_batch(TOPIC, [BODY] * BATCH)), 1, False
    c = AsyncDLedgerClient(addresses)
    if workload == "append-64":
        return c.close, lambda: _one(c.append(BODY)), TASKS, False
    return c.close, lambda: _many(c.append_batch([BODY] * BATCH)), 1, False


async def _closed() -> None:
    return None


async def _unary(p: AsyncProducer) -> int:
    """One message through the broker's unary ``Send`` (numbered as the producer numbers it)."""
    m = await p.outgoing(TOPIC, BODY)
    await p.call("Send", broker_pb2.SendRequest(topic=TOPIC, messages=[m]), retry_unknown=True)
    return 1


async def _one(call: Awaitable[object]) -> int:
    await call
    return 1


async def _many(call: Awaitable[list]) -> int:
    return len(await call)


async def _measure(
    workload: str, g: grp.GroupSpec, seconds: float, spy_dir: Path | None, keep_all: bool, rnd: int
) -> tuple[dict[str, float], Stages | None]:
    """One window of ``workload``: its row (msg/s, CPU per message per process) and, with ``spy_dir``, the
    leader's CPU by stage (py-spy's stacks go there; every node's with ``keep_all``)."""
    close, op, tasks, once = _client(workload, g.addresses, seconds)
    if not once:
        await op()  # channels, the leader and the topic's queues, before the clock runs
    leader = (await grp.wait_for_leader_async(g, 30.0)).id
    pids = {s.id: grp.read_pid(s) for s in g.nodes}
    lpid = pids[leader]
    spies: dict[str, tuple[Path, subprocess.Popen]] = {}
    spy = _py_spy()
    if spy_dir is not None and spy is not None:
        for nid, pid in pids.items():
            if pid and (nid == leader or keep_all):
                role = "leader" if nid == leader else "follower"
                out = spy_dir / f"r{rnd}-{workload}-{role}-{nid}.txt"
                cmd = [spy, *SPY, "-o", str(out), "-p", str(pid)]
                spies[nid] = out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(ATTACH_S)
    loop = asyncio.get_running_loop()
    before = {nid: cpu_seconds([pid]) for nid, pid in pids.items() if pid}
    threads_before = thread_cpu_seconds(lpid) if lpid else {}
    me = os.times()
    count = errors = 0
    stop_at = loop.time() + seconds

    async def work() -> None:
        nonlocal count, errors
        while True:
            try:
                n = await op()  # not ``count += await op()``: that reads count before the await
                count += n
            except Exception as e:  # a lost lease under load: counted and shown, the window goes on
                errors += 1
                if errors == 1:
                    print(f"  {workload}: {e!r}", flush=True)
            if once or loop.time() >= stop_at:
                return

    t0 = loop.time()
    await asyncio.gather(*(work() for _ in range(tasks)))
    elapsed = loop.time() - t0
    mine = os.times()
    threads_after = thread_cpu_seconds(lpid) if lpid else {}
    after = {nid: cpu_seconds([pid]) for nid, pid in pids.items() if pid}
    for _, proc in spies.values():
        proc.send_signal(signal.SIGINT)
    for _, proc in spies.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    moved = (await grp.wait_for_leader_async(g, 30.0)).id != leader
    if moved:
        print(
            f"  {workload}: the leader changed in the window (figures mix two leaders; no stages)", flush=True
        )
    row = {"msg/s": count / elapsed, "errors": float(errors)}
    followers = []
    for nid in before:
        us = (after[nid] - before[nid]) * 1e6 / max(count, 1)
        if nid == leader:
            row["leader"] = us
        else:
            followers.append(us)
    row["followers"] = statistics.mean(followers) if followers else float("nan")
    row["client"] = ((mine.user + mine.system) - (me.user + me.system)) * 1e6 / max(count, 1)
    row["total"] = row["leader"] + 2 * row["followers"] + row["client"]
    if workload == "official-64" and count:
        _official_rate[0] = row["msg/s"]
    await close()
    st = None
    if leader in spies and spies[leader][0].exists() and not moved:
        stacks = list(stages.samples(spies[leader][0]))
        secs, others = stages.budget(stacks, threads_before, threads_after, after[leader] - before[leader])
        st = Stages(secs, count, sum(n for *_, n in stacks), collections.Counter(others))
    return row, st


def _pool(runs: list[Stages]) -> Stages:
    out = Stages()
    for r in runs:
        for k, v in r.seconds.items():
            out.seconds[k] += v
        out.messages += r.messages
        out.samples += r.samples
        out.others.update(r.others)
    return out


def stage_table(by_workload: dict[str, list[Stages]], rates: dict[str, float]) -> list[str]:
    """The leader's microseconds of CPU per message by stage, one row per workload (rounds pooled), and what
    its ``other`` is mostly made of (the leaves charged there)."""
    head = "".join(f"{s:>10}" for s in stages.STAGES)
    lines = [
        "leader CPU per message by stage, us/msg (py-spy samples scaled to the leader's /proc CPU, rounds pooled)",
        f"{'workload':<13}{'msg/s':>9}{head}{'total':>9}{'samples':>9}",
    ]
    notes = []
    for w, runs in by_workload.items():
        if not runs:
            continue
        p = _pool(runs)
        us = {k: v * 1e6 / max(p.messages, 1) for k, v in p.seconds.items()}
        cells = "".join(f"{us[s]:>10.1f}" for s in stages.STAGES)
        lines.append(f"{w:<13}{rates[w]:>9,.0f}{cells}{sum(us.values()):>9.1f}{p.samples:>9}")
        notes.append(
            f"  {w}: "
            + ", ".join(f"{f} {v * 1e6 / max(p.messages, 1):.1f}" for f, v in p.others.most_common(4))
        )
    return [*lines, "", "other, its largest parts (us/msg; a thread: its whole CPU):", *notes]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 second, 1 round")
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--no-stages", action="store_true", help="no py-spy, no stage table")
    ap.add_argument(
        "--no-key-index", action="store_true", help="nodes without the key and id index ([broker])"
    )
    ap.add_argument("--profile", type=Path, default=None, help="py-spy raw stacks of every node go here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 1.0, 1
    use_spy = not args.no_stages or args.profile is not None
    if use_spy and _py_spy() is None:
        print("py-spy is not installed (pip install py-spy): no stage table")
        use_spy = False
    figures: dict[str, list[dict[str, float]]] = {w: [] for w in WORKLOADS}
    by_stage: dict[str, list[Stages]] = {w: [] for w in WORKLOADS}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        spy_dir = None
        if use_spy:
            spy_dir = args.profile or Path(tmp) / "stacks"
            spy_dir.mkdir(parents=True, exist_ok=True)
        g = grp.create(Path(tmp) / "group", 3, None, state_machine="broker", flush=args.flush)
        if args.no_key_index:  # what the key and id index costs: the same group without it
            for spec in g.nodes:
                with open(spec.config, "a") as f:
                    f.write("\n[broker]\nkey_index = false\n")
        for spec in g.nodes:
            grp.start_node(spec)
        grp.wait_for_leader(g)
        try:
            with BrokerConnection(g.addresses) as c:
                c.create_topic(TOPIC, 4)
            print(
                f"{time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}, load "
                f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs; 3-node group, flush "
                f"{args.flush}, 1 KiB bodies; CPU in microseconds per message",
                flush=True,
            )
            for rnd in range(args.rounds):
                for w in WORKLOADS:
                    place_leader(g, "pick-first")  # the official client's node: the same leader for all
                    row, st = asyncio.run(
                        _measure(w, g, args.seconds, spy_dir, args.profile is not None, rnd)
                    )
                    figures[w].append(row)
                    if st is not None:
                        by_stage[w].append(st)
                    print(
                        f"round {rnd + 1} {w:<13} {row['msg/s']:>8,.0f} msg/s  leader {row['leader']:6.1f}  "
                        f"follower {row['followers']:6.1f}  client {row['client']:6.1f}  total {row['total']:6.1f}"
                        + (f"  errors {row['errors']:.0f}" if row["errors"] else ""),
                        flush=True,
                    )
        finally:
            grp.stop_group(g)
    print()
    med = {w: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for w, rows in figures.items()}
    for w, m in med.items():
        print(
            f"{w:<13} median {m['msg/s']:>8,.0f} msg/s  leader {m['leader']:6.1f}  follower {m['followers']:6.1f}  "
            f"client {m['client']:6.1f}  total {m['total']:6.1f} us/msg"
        )
    print()
    for w, base in BASELINE.items():
        a, b = med[w], med[base]
        print(
            f"{w} / {base}: throughput {a['msg/s'] / b['msg/s']:.2f}x, CPU per message: leader "
            f"{a['leader'] / b['leader']:.2f}x, follower {a['followers'] / b['followers']:.2f}x, total "
            f"{a['total'] / b['total']:.2f}x"
        )
    if any(by_stage.values()):
        print()
        print("\n".join(stage_table(by_stage, {w: m["msg/s"] for w, m in med.items()})))
    print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
