"""Benchmark: what RocketMQ 5 compatibility costs. The official client (``rocketmq-python-client``, unchanged)
against our own client, on the same three-node broker group (separate processes on 127.0.0.1, flush "sync"),
in the same run, alternating which goes first in every round so that machine drift hits both alike.

Per round, 1 KiB messages:

- sequential send: the official ``Producer.send`` one message at a time, against our ``Producer.send``;
- concurrent send, ``--inflight`` sends outstanding: the official ``Producer.send_async`` (a window of futures),
  against one of our ``Producer`` objects shared by as many threads, each sending one message at a time (our
  client has no async send; the same number of sends are in flight);
- consume: the official ``SimpleConsumer`` receiving batches of 32 and acknowledging every message (one
  ``AckMessage`` each, through the log: the protocol's way), one ack at a time, then again (another group) with
  each batch's acks sent at once (from a thread pool); against our ``Consumer`` pulling 32 at a time and committing
  the group's offset after every batch (also through the log). Each side consumes what it sent.

- receive + ack, ``--ack-window`` (32) acks in flight: the official ``SimpleConsumer`` receiving batches of 32
  while up to 32 of its acks are outstanding (the ``concurrent.futures`` future of the client's own async ack
  call, its status checked as ``ack`` checks it: the public ``ack_async`` drops its future in 5.1.2). This and "send, 16 in flight" are issue 15's two official-client workloads.

Prints messages/s per round, the medians with [min-max], and the ratio official / ours (below 1: the official
client is slower). For the official client's runs it also prints the CPU each process spent per message (ms,
from ``/proc/PID/stat`` utime + stime deltas): the client (this process: the client's I/O thread and the
bench's), the leader and the two followers, so whether the client itself is the limit is a number. Every process
started is stopped by its pid at the end, also on failure.

    python -m bench.rocketmq_client [--rounds 3] [--messages 600] [--inflight 16] [--dir DIR]

``--baseline-tree DIR`` measures the servicer instead of the clients: two groups, one running the nodes from the
source tree DIR (e.g. /work/main) and one from this tree (their ``PYTHONPATH``), and only issue 15's two
workloads through the official client, alternating which group goes first each round; the ratio is this tree /
DIR. ``--profile DIR`` also records each official-client measurement with py-spy (``--nonblocking``, idle
samples off; the client and every node) into DIR as collapsed stacks and prints where their CPU goes per message.
``--per-call`` runs those two workloads beside a bare grpc.aio unary call (``rocketmq_double --bare``) one at a
time and with as many in flight, and prints the server's CPU per call or message and its ratio to the bare
call's. ``--double`` (with ``--baseline-tree``) runs the two workloads against ``bench.rocketmq_double`` of each tree
instead: one process serving the servicer over an in-memory log, no replication, so what is left is the client
and one gRPC server with the face: the client's ceiling on this machine.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials

from bench.proc_cpu import cpu_seconds
from bench.rocketmq_double import BARE_METHOD
from bench.rocketmq_workloads import (
    bare_calls,
    official_consume,
    official_consume_window,
    official_send,
    official_send_window,
    our_consume,
    our_send,
    our_send_concurrent,
)
from broker_adapter.client import BrokerConnection
from dledger import group as grp
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError

QUEUES = 4
PYSPY = Path(sys.executable).with_name("py-spy")


class Double:
    """``bench.rocketmq_double`` in a process of its own, running the servicer of source tree ``tree``: one gRPC
    server, no replication (the client's ceiling, and the face's cost without the log); with ``bare``, one empty
    method and no servicer (the cost of a call itself)."""

    def __init__(self, tree: Path, topics: list[str], bare: bool = False):
        script = Path(__file__).with_name("rocketmq_double.py")
        self.proc = subprocess.Popen(
            [  # this tree's script over the other tree's packages (its directory is not put on sys.path)
                sys.executable,
                "-c",
                "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                str(script),
                *[a for t in topics for a in ("--topic", t)],
                "--queues",
                str(QUEUES),
                *(["--bare"] if bare else []),
            ],
            cwd=tree,
            env=dict(os.environ, PYTHONPATH=str(tree)),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        if not self.address:
            self.stop()
            raise RuntimeError(f"bench.rocketmq_double of {tree} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def pick_first(g: grp.GroupSpec) -> str:
    """The node the official Python client 5.1.2 sends to: it sorts an endpoint's addresses as strings and
    dials them as one pick-first channel, whatever order the route gives (``rpc_channel.RpcEndpoints``), so
    the lowest address gets every call and a follower there forwards each to the leader."""
    return min(g.nodes, key=lambda n: n.address).id


def place_leader(g: grp.GroupSpec, where: str) -> None:
    """``where``: "elected" leaves the leader be; "pick-first" makes the client's pick-first node lead (no
    forwarding hop); "forwarded" makes another node lead (every call forwarded by the pick-first node)."""
    if where == "elected":
        return
    first = pick_first(g)
    for _ in range(5):
        lead = grp.wait_for_leader(g).id
        if (lead == first) == (where == "pick-first"):
            return
        target = first if where == "pick-first" else next(n.id for n in g.nodes if n.id != first)
        with DLedgerClient(g.addresses, g.name) as c, contextlib.suppress(DLedgerError):
            c.transfer_leadership(target)
        time.sleep(0.5)
    raise RuntimeError(f"could not place the leader ({where})")


class Measured:
    """One official-client measurement: msg/s and CPU ms per message of each process."""

    def __init__(self, rate: float, cpu_ms: dict[str, float]):
        self.rate = rate
        self.cpu_ms = cpu_ms


def measure(
    g: grp.GroupSpec | Double,
    fn: Callable[[], tuple[float, int]],
    profile: Path | None = None,
    tag: str = "",
) -> Measured:
    """Run ``fn`` (returns msg/s and the message count) with the CPU of the client (this process), the leader and
    the followers (or the double's one process, as "leader") counted around it; with ``profile``, py-spy records
    every one of them meanwhile."""
    pids = {"client": os.getpid()}
    if isinstance(g, Double):
        pids["leader"] = g.proc.pid
    else:
        leader = grp.wait_for_leader(g).id
        if tag:
            print(f"  {tag}: leader {leader}, client's pick-first node {pick_first(g)}", file=sys.stderr)
        followers = 0
        for spec in g.nodes:
            pid = grp.read_pid(spec)
            if pid is None:
                continue
            if spec.id == leader:
                pids["leader"] = pid
            else:
                followers += 1
                pids[f"follower{followers}"] = pid
    spies = []
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        for who in pids:
            out = profile / f"{tag}-{who}.txt"
            spies.append(
                (
                    who,
                    out,
                    subprocess.Popen(
                        [
                            str(PYSPY),
                            "record",
                            "--nonblocking",
                            "-r",
                            "100",
                            "-f",
                            "raw",
                            "-o",
                            str(out),
                            "-p",
                            str(pids[who]),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    ),
                )
            )
        time.sleep(1.0)  # py-spy attached
    before = {k: cpu_seconds([p]) for k, p in pids.items()}
    try:
        r, n = fn()
    finally:
        after = {k: cpu_seconds([p]) for k, p in pids.items()}
        for _, _, spy in spies:
            spy.send_signal(signal.SIGINT)
        for _, _, spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
    cpu_ms = {k: (after[k] - before[k]) * 1000 / max(n, 1) for k in pids}
    for who, out, _ in spies:
        if out.exists():
            print(f"  py-spy {tag} {who}: {n} messages", file=sys.stderr)
            for line in top_functions(out, n):
                print("    " + line, file=sys.stderr)
    return Measured(r, cpu_ms)


# Leaf frames where a sampled thread waits rather than computes (py-spy --nonblocking cannot always tell).
# (grpc's Cython poller thread shows as a bare Thread.run; a thread pool's idle worker as _worker.)
WAITING = frozenset(
    {
        "EpollSelector.select (selectors.py)",
        "Condition.wait (threading.py)",
        "_worker (thread.py)",
        "Thread.run (threading.py)",
        "FileIO.fdatasync (fileio.py)",
        "Event.wait (threading.py)",
    }
)
# Where a computing sample's time goes: the first of these (file path fragments) its stack passes through,
# innermost first.
PARTS = (
    ("servicer (broker_adapter/rocketmq)", "broker_adapter/rocketmq/"),
    ("broker (broker_adapter, other)", "broker_adapter/"),
    ("state machine", "statemachine/"),
    ("storage", "storage/"),
    ("raft runtime + transport (dledger)", "dledger/"),
    ("grpc python (grpc/aio)", "grpc/"),
    ("rocketmq client", "rocketmq/"),
    ("protobuf", "protobuf/"),
    ("event loop callbacks (grpc's Cython server and channel code runs here)", "Handle._run"),
    ("asyncio", "asyncio/"),
)
# Frames every stack of a process starts with (a node's command line; a bench's main): not where time goes.
ROOTS = (
    "dledger/cli.py",
    "dledger/__main__.py",
    "typer/",
    "runpy",
    "bench/rocketmq_client.py",
    "bench/rocketmq_workloads.py",
    "threading.py",
)


def top_functions(path: Path, messages: int, limit: int = 12) -> list[str]:
    """A py-spy raw (collapsed stacks) file summed up, as ms of CPU per message at 100 Hz: samples whose leaf
    waits (epoll, condition, fdatasync) apart, the others by the innermost part of the code they are in
    (``PARTS``, so "servicer" includes the protobuf and grpc calls it makes), and the heaviest leaf functions."""
    total = waiting = 0
    parts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        total += c
        frames = stack.split(";")
        func, _, where = frames[-1].rpartition(" (")
        leaf = f"{func} ({where.split(':')[0].rsplit('/', 1)[-1]})"
        if leaf in WAITING:
            waiting += c
            continue
        leaves[leaf] += c
        inner = [f for f in frames if not any(r in f for r in ROOTS)]
        for name, frag in PARTS:
            if any(frag in f for f in inner):
                parts[name] += c
                break
        else:
            parts["other"] += c
    per = 10.0 / max(messages, 1)  # one sample = 10 ms
    out = [
        f"samples {total}: waiting {waiting * per:.3f} ms/msg, computing {(total - waiting) * per:.3f} ms/msg"
    ]
    out += [f"{c * per:7.3f} ms/msg  {name}" for name, c in parts.most_common()]
    out += [f"{c * per:7.3f} ms/msg  leaf {f}" for f, c in leaves.most_common(limit)]
    return out


def _alternate(round_no: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[float, float]:
    """Run a then b on even rounds, b then a on odd ones; returns (a's figure, b's figure)."""
    if round_no % 2 == 0:
        ra = a()
        return ra, b()
    rb = b()
    return a(), rb


CPU_KEYS = ("client", "leader", "follower1", "follower2")


def _cpu_cells(ms: list[dict[str, float]]) -> str:
    return "  ".join(f"{k} {statistics.median(m[k] for m in ms):.2f}" for k in CPU_KEYS if k in ms[0])


def _summary(rows: dict[str, list[tuple[float, float]]], a_name: str, b_name: str, ratio: str) -> None:
    print()
    print(f"medians over the rounds [min-max]; ratio = {ratio}")
    print(f"{'workload':<28}{a_name:>26}{b_name:>26}{'ratio':>8}")
    for name, vals in rows.items():
        xa = [a for a, _ in vals]
        xb = [b for _, b in vals]
        ma, mb = statistics.median(xa), statistics.median(xb)
        print(
            f"{name:<28}{f'{ma:,.0f} [{min(xa):,.0f}-{max(xa):,.0f}]':>26}"
            f"{f'{mb:,.0f} [{min(xb):,.0f}-{max(xb):,.0f}]':>26}{ma / mb:>8.2f}"
        )


def _up(d: Path, tree: Path | None) -> grp.GroupSpec:
    """A three-node broker group in ``d``; its nodes run the code of source tree ``tree`` (their PYTHONPATH)
    when given (the spawned nodes inherit this process's environment). PYTHONSAFEPATH keeps the working
    directory off their ``sys.path``: ``python -m`` puts it first, so nodes started from a checkout would
    otherwise import that checkout's code whatever PYTHONPATH says (both groups the same code)."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if tree is not None:
        os.environ.update(PYTHONPATH=str(tree), PYTHONSAFEPATH="1")
    try:
        g, _ = grp.up(d, 3, None, state_machine="broker")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    grp.wait_for_all(g, 30)
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=600, help="messages per side per measurement")
    ap.add_argument("--inflight", type=int, default=16, help="sends outstanding in the concurrent runs")
    ap.add_argument("--ack-window", type=int, default=32, help="acks outstanding in the receive + ack run")
    ap.add_argument("--dir", type=Path, default=None, help="group directory (default: a temporary one)")
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="A/B the servicer: nodes from this source tree against nodes from this one (official client only)",
    )
    ap.add_argument(
        "--leader",
        choices=("elected", "pick-first", "forwarded"),
        default="elected",
        help="before each round: leave the leader (elected), or move it to the official client's pick-first node "
        "(the lowest address: no forwarding hop), or away from it (every call forwarded)",
    )
    ap.add_argument(
        "--double",
        action="store_true",
        help="with --baseline-tree: against bench.rocketmq_double of each tree (one process, no replication)",
    )
    ap.add_argument(
        "--this-first", action="store_true", help="with --baseline-tree: start this tree's group first"
    )
    ap.add_argument(
        "--profile", type=Path, default=None, help="py-spy the client and every node into this directory"
    )
    ap.add_argument(
        "--per-call",
        action="store_true",
        help="leader CPU per SendMessage and per received + acked message beside a bare grpc.aio call's",
    )
    args = ap.parse_args()
    tmp = None
    d = args.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-rmq-")
        d = Path(tmp.name)
    try:
        if args.per_call:
            _per_call(d, args)
        elif args.baseline_tree is not None:
            _trees(d, args)
        else:
            _clients(d, args)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _trees(d: Path, args: argparse.Namespace) -> None:
    """Issue 15's two official-client workloads against a group of the baseline tree's nodes and one of this
    tree's, alternating."""
    here = Path(__file__).resolve().parent.parent
    base = args.baseline_tree.resolve()
    n, w, aw = args.messages, args.inflight, args.ack_window
    if args.double:
        _doubles(base, here, args)
        return
    groups: list[grp.GroupSpec] = []
    try:
        # Which group is created first decides its ports (and so which of its nodes the client dials): with
        # --this-first the trees swap places, to tell a position effect from a code effect (index 0 is always
        # the baseline below).
        if args.this_first:
            gt = _up(d / "this", here)
            groups.append(gt)
            groups.insert(0, _up(d / "base", base))
        else:
            groups.append(_up(d / "base", base))
            groups.append(_up(d / "this", here))
        cfgs = [ClientConfiguration(";".join(g.addresses), Credentials(), request_timeout=10) for g in groups]
        print(
            f"3-node broker groups, flush sync, 1 KiB bodies, {n} messages per measurement, official client"
        )
        print(f"baseline nodes: {base}; this: {here}; leader: {args.leader}; CPU in ms per message")
        rows: dict[str, list[tuple[float, float]]] = {}
        cpu: dict[tuple[str, str], list[dict[str, float]]] = {}
        conns = [BrokerConnection(g.addresses) for g in groups]
        try:
            for r in range(args.rounds):
                topics = []
                for c in conns:
                    t = f"rmq-ab-{r}"
                    c.create_topic(t, QUEUES)
                    topics.append(t)

                def one(
                    i: int, name: str, fn: Callable[[], tuple[float, int]], r: int = r
                ) -> Callable[[], float]:
                    def run() -> float:
                        place_leader(groups[i], args.leader)
                        m = measure(
                            groups[i], fn, args.profile, f"r{r}-{'base' if i == 0 else 'this'}-{name[:4]}"
                        )
                        cpu.setdefault((name, "base" if i == 0 else "this"), []).append(m.cpu_ms)
                        print(
                            f"{r + 1:<7}{name:<28}{'base' if i == 0 else 'this':<6}{m.rate:>10,.0f} msg/s  "
                            + "  ".join(f"{k} {v:.2f}" for k, v in m.cpu_ms.items())
                        )
                        return m.rate

                    return run

                pairs = [
                    (
                        f"send, {w} in flight",
                        [partial(official_send_window, cfgs[i], topics[i], n, w) for i in (0, 1)],
                    ),
                    # the topic holds n + 1 (the warm-up send): all of it
                    (
                        f"receive+ack, {aw} in flight",
                        [
                            partial(official_consume_window, cfgs[i], topics[i], f"g-ab-{r}", n + 1, aw)
                            for i in (0, 1)
                        ],
                    ),
                ]
                for name, fns in pairs:
                    a, b = _alternate(r, one(1, name, fns[1]), one(0, name, fns[0]))
                    rows.setdefault(name, []).append((a, b))
        finally:
            for c in conns:
                c.close()
        _summary(rows, "this msg/s", "baseline msg/s", "this / baseline")
        print()
        print("CPU ms per message, medians")
        for (name, side), ms in cpu.items():
            print(f"{name:<28}{side:<6}{_cpu_cells(ms)}")
    finally:
        for g in groups:
            grp.stop_group(g)


def _per_call(d: Path, args: argparse.Namespace) -> None:
    """Issue 15's two official-client workloads beside a bare grpc.aio unary call (``rocketmq_double --bare``:
    an empty method, the official client's metadata) one at a time and with as many in flight, in the same run,
    the two blocks alternating which goes first: server CPU µs per call (per message for RocketMQ; receive+ack
    is one AckMessage plus 1/32 of a ReceiveMessage per message) and its ratio to the bare call's."""
    here = Path(__file__).resolve().parent.parent
    n, w, aw = args.messages, args.inflight, args.ack_window
    bare = Double(here, [], bare=True)
    g = None
    try:
        g = _up(d, None)
        cfg = ClientConfiguration(";".join(g.addresses), Credentials(), request_timeout=10)
        measured: dict[str, list[Measured]] = {}
        bare_of = {
            f"send, {w} in flight": f"bare, {w} in flight",
            f"receive+ack, {aw} in flight": f"bare, {aw} in flight",
        }

        def run(
            name: str, target: grp.GroupSpec | Double, fn: Callable[[], tuple[float, int]], r: int
        ) -> None:
            if not isinstance(target, Double):
                place_leader(target, args.leader)
            m = measure(
                target, fn, args.profile, f"r{r}-{name.split(',')[0].replace(' ', '_').replace('+', '_')}"
            )
            measured.setdefault(name, []).append(m)
            print(
                f"{r + 1:<7}{name:<28}{m.rate:>10,.0f} calls or msg/s  "
                + "  ".join(f"{k} {v * 1000:.0f}" for k, v in m.cpu_ms.items())
                + " µs",
                flush=True,
            )

        print(f"per-call CPU: bare grpc.aio call against the official client, {n} calls or messages each")
        with BrokerConnection(g.addresses) as c:
            for r in range(args.rounds):
                t = f"rmq-per-call-{r}"
                c.create_topic(t, QUEUES)
                bare_block = [
                    (f"bare, {k} in flight", bare, partial(bare_calls, bare.address, BARE_METHOD, n, k))
                    for k in sorted({1, w, aw})
                ]
                rmq_block = [
                    (f"send, {w} in flight", g, partial(official_send_window, cfg, t, n, w)),
                    (
                        f"receive+ack, {aw} in flight",
                        g,
                        partial(official_consume_window, cfg, t, f"g-pc-{r}", n + 1, aw),
                    ),
                ]
                for name, target, fn in bare_block + rmq_block if r % 2 == 0 else rmq_block + bare_block:
                    run(name, target, fn, r)
        print()
        print(
            "medians over the rounds; server = the bare server or the leader; CPU µs per call (bare) or message"
        )
        print(
            f"{'workload':<28}{'rate/s':>10}{'server µs':>11}{'client µs':>11}{'followers µs':>14}{'x bare':>8}"
        )
        med = {
            name: {k: statistics.median(m.cpu_ms[k] for m in ms) * 1000 for k in ms[0].cpu_ms}
            for name, ms in measured.items()
        }
        for name, ms in measured.items():
            cpu = med[name]
            followers = sum(v for k, v in cpu.items() if k.startswith("follower"))
            ratio = f"{cpu['leader'] / med[bare_of[name]]['leader']:8.2f}" if name in bare_of else ""
            print(
                f"{name:<28}{statistics.median(m.rate for m in ms):>10,.0f}{cpu['leader']:>11.0f}"
                f"{cpu['client']:>11.0f}{followers:>14.0f}{ratio}"
            )
    finally:
        if g is not None:
            grp.stop_group(g)
        bare.stop()


def _doubles(base: Path, here: Path, args: argparse.Namespace) -> None:
    """Issue 15's two workloads against ``bench.rocketmq_double`` of each tree (one process, no replication),
    alternating: the client's ceiling, and the servicer's A/B under the official client without the log."""
    n, w, aw = args.messages, args.inflight, args.ack_window
    topics = [f"rmq-double-{r}" for r in range(args.rounds)]
    doubles: list[Double] = []
    try:
        doubles.append(Double(base, topics))
        doubles.append(Double(here, topics))
        cfgs = [ClientConfiguration(d.address, Credentials(), request_timeout=10) for d in doubles]
        print(
            f"in-memory doubles (no replication), 1 KiB bodies, {n} messages per measurement, official client"
        )
        print(f"baseline: {base}; this: {here}; CPU in ms per message ('leader': the double's process)")
        rows: dict[str, list[tuple[float, float]]] = {}
        cpu: dict[tuple[str, str], list[dict[str, float]]] = {}
        for r in range(args.rounds):

            def one(
                i: int, name: str, fn: Callable[[], tuple[float, int]], r: int = r
            ) -> Callable[[], float]:
                side = "base" if i == 0 else "this"

                def run() -> float:
                    m = measure(doubles[i], fn, args.profile, f"r{r}-double-{side}-{name[:4]}")
                    cpu.setdefault((name, side), []).append(m.cpu_ms)
                    print(
                        f"{r + 1:<7}{name:<28}{side:<6}{m.rate:>10,.0f} msg/s  "
                        + "  ".join(f"{k} {v:.2f}" for k, v in m.cpu_ms.items())
                    )
                    return m.rate

                return run

            t = topics[r]
            pairs = [
                (f"send, {w} in flight", [partial(official_send_window, cfgs[i], t, n, w) for i in (0, 1)]),
                (
                    f"receive+ack, {aw} in flight",
                    [partial(official_consume_window, cfgs[i], t, f"g-dbl-{r}", n + 1, aw) for i in (0, 1)],
                ),
            ]
            for name, fns in pairs:
                a, b = _alternate(r, one(1, name, fns[1]), one(0, name, fns[0]))
                rows.setdefault(name, []).append((a, b))
        _summary(rows, "this msg/s", "baseline msg/s", "this / baseline")
        print()
        print("CPU ms per message, medians ('leader': the double's process)")
        for (name, side), ms in cpu.items():
            print(f"{name:<28}{side:<6}{_cpu_cells(ms)}")
    finally:
        for d in doubles:
            d.stop()


def _clients(d: Path, args: argparse.Namespace) -> None:
    g = _up(d, None)
    try:
        addrs = g.addresses
        cfg = ClientConfiguration(";".join(addrs), Credentials(), request_timeout=10)
        n, w, aw = args.messages, args.inflight, args.ack_window
        rows: dict[str, list[tuple[float, float]]] = {}
        cpu: dict[str, list[dict[str, float]]] = {}
        print(f"3-node broker group, flush sync, 1 KiB bodies, {n} messages per side per measurement")
        print(
            f"{'round':<7}{'workload':<28}{'official msg/s':>16}{'ours msg/s':>13}{'ratio':>8}  official CPU ms/msg"
        )

        def counted(name: str, r: int, fn: Callable[[], tuple[float, int]]) -> Callable[[], float]:
            def run() -> float:
                place_leader(g, args.leader)
                m = measure(g, fn, args.profile, f"r{r}-{name[:4]}")
                cpu.setdefault(name, []).append(m.cpu_ms)
                return m.rate

            return run

        with BrokerConnection(addrs) as c:
            for r in range(args.rounds):
                place_leader(g, args.leader)
                t_off, t_our = f"rmq-official-{r}", f"rmq-ours-{r}"  # one topic per side and round
                c.create_topic(t_off, QUEUES)
                c.create_topic(t_our, QUEUES)
                # The senders put n + 1 (warm-up) messages, and the concurrent ones another n + 1.
                pairs = [
                    ("send", partial(official_send, cfg, t_off, n), partial(our_send, addrs, t_our, n)),
                    (
                        f"send, {w} in flight",
                        counted(f"send, {w} in flight", r, partial(official_send_window, cfg, t_off, n, w)),
                        partial(our_send_concurrent, addrs, t_our, n, w),
                    ),
                    (
                        "consume, ack each",
                        partial(official_consume, cfg, t_off, f"g-off-{r}", 2 * n + 2),
                        partial(our_consume, addrs, t_our, f"g-our-{r}", 2 * n + 2),
                    ),
                    (  # other groups: every message again
                        "consume, acks at once",
                        partial(official_consume, cfg, t_off, f"g-off-async-{r}", 2 * n + 2, True),
                        partial(our_consume, addrs, t_our, f"g-our-again-{r}", 2 * n + 2),
                    ),
                    (
                        f"receive+ack, {aw} in flight",
                        counted(
                            f"receive+ack, {aw} in flight",
                            r,
                            partial(official_consume_window, cfg, t_off, f"g-off-win-{r}", 2 * n + 2, aw),
                        ),
                        partial(our_consume, addrs, t_our, f"g-our-win-{r}", 2 * n + 2),
                    ),
                ]
                for name, official, ours in pairs:
                    a, b = _alternate(r, official, ours)
                    rows.setdefault(name, []).append((a, b))
                    cells = "  ".join(f"{k} {v:.2f}" for k, v in cpu[name][-1].items()) if name in cpu else ""
                    print(f"{r + 1:<7}{name:<28}{a:>16,.0f}{b:>13,.0f}{a / b:>8.2f}  {cells}")
        _summary(rows, "official msg/s", "ours msg/s", "official / ours")
        print()
        print("official client, CPU ms per message, medians")
        for name, ms in cpu.items():
            print(f"{name:<28}{_cpu_cells(ms)}")
    finally:
        grp.stop_group(g)


if __name__ == "__main__":
    main()
