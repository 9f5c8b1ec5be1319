"""Where a sequential single-message broker send's time goes (issue 15): its steps measured side by side.

    python -m bench.send_budget [--calls 200] [--rounds 5] [--flush sync,async] [--profile 10 --out DIR]

One 3-node broker group (real node processes on 127.0.0.1) per flush policy. One caller, one call at a time,
every step against the leader; the steps alternate round by round so a change in machine load hits them all:

- ``fdatasync``: append 1 KiB to a file in the group's directory and fdatasync it (this disk's floor);
- ``fdatasync-x3``: three threads do the same on three files at once, timed until the second is done (what a
  majority of three waits for when, as here, the three nodes share one disk);
- ``grpc-empty``: the health check, a blocking unary call that does nothing (one client round trip);
- ``route``: the broker's ``Route``, its read-only path (servicer + metadata, nothing written);
- ``append-unary``: the log's own ``Append`` on a blocking stub, one entry of the size a broker message encodes
  to (persist + replication + commit, no broker code, no client library);
- ``append-client``: the same through ``DLedgerClient`` (its event-loop thread and ``AppendStream``);
- ``send-stub``: the broker's ``Send`` of one 1 KiB message on a blocking stub (the request built by hand: the
  broker's server side without ``Producer``);
- ``send-producer``: ``Producer.send`` of one 1 KiB message, as users send.

The differences between the steps (e.g. ``send-stub - append-unary`` = what the broker servicer adds on the
write path) are printed under each table. ``--profile S`` then runs a sequential ``Producer.send`` loop in a
child process for S seconds while ``py-spy record`` samples that client and the leader (CPU only, idle
excluded), and prints the CPU each costs per send by function; stacks are kept in ``--out``.

``--ab LABEL=PYTHONPATH`` (twice or more) compares source trees instead: per flush policy, one group per label
whose node processes start with that ``PYTHONPATH`` (e.g. ``main=/work/main`` against a branch's worktree);
the groups take turns round by round (the order rotating), each running the ``--steps`` chosen, and the table
gives every label's p50 (p90) and its ratio to the first label's. ``LABEL=PATH;VAR=VALUE`` also sets an
environment variable for that label's nodes (an experiment switch).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.compare.profile import raw_stacks
from bench.proc_cpu import cpu_seconds
from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger import group as grp
from dledger.errors import DLedgerError
from dledger.v1 import client_pb2, client_pb2_grpc

BODY = bytes(range(256)) * 4  # 1 KiB, as bench.broker and bench.jetstream send
TOPIC = "bench"
QUEUES = 4
ENTRY_BYTES = 1280  # about what one BODY encodes to as a broker message (message.encode), for raw appends
PROFILE_RATE = 250  # py-spy samples per second

STEPS = (
    "fdatasync",
    "fdatasync-x3",
    "grpc-empty",
    "route",
    "append-unary",
    "append-client",
    "send-stub",
    "send-producer",
)
# (label, minuend, subtrahend): what each difference isolates.
DIFFERENCES = (
    ("log commit: persist + replication (append-unary - grpc-empty)", "append-unary", "grpc-empty"),
    ("log commit over its floor (append-unary - floor)", "append-unary", "floor"),
    ("three syncs at once on one disk (fdatasync-x3 - fdatasync)", "fdatasync-x3", "fdatasync"),
    ("broker read-only servicer (route - grpc-empty)", "route", "grpc-empty"),
    ("broker servicer on the write path (send-stub - append-unary)", "send-stub", "append-unary"),
    ("Producer client library (send-producer - send-stub)", "send-producer", "send-stub"),
    ("DLedgerClient thread + stream (append-client - append-unary)", "append-client", "append-unary"),
    ("whole send over the floor (send-producer - floor)", "send-producer", "floor"),
)


@dataclass
class Step:
    name: str
    call: Callable[[], object]
    close: Callable[[], None] = lambda: None
    latencies_s: list[float] = field(default_factory=list)


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs in milliseconds (nearest rank)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))] * 1000


class Group:
    """A 3-node broker group with one flush policy and a topic of ``QUEUES`` queues. ``env`` is put into the
    environment of its node processes (``--ab``: another source tree on ``PYTHONPATH``)."""

    def __init__(self, workdir: Path, flush: str, name: str = "", env: dict[str, str] | None = None):
        self.flush = flush
        self.dir = workdir / f"group-{name}{'-' if name else ''}{flush}"
        self.spec = grp.create(self.dir, 3, None, flush=flush, state_machine="broker")
        try:
            with _environ(env or {}):
                for n in self.spec.nodes:
                    grp.start_node(n)
            self.leader = grp.wait_for_leader(self.spec, timeout_s=30)
            from broker_adapter.client import BrokerConnection

            with BrokerConnection([self.leader.address]) as c:
                c.create_topic(TOPIC, QUEUES)
        except BaseException:
            self.stop()
            raise

    def leader_pid(self) -> int | None:
        return grp.read_pid(self.spec.node(self.leader.id))

    def stop(self) -> None:
        grp.stop_group(self.spec)


@contextlib.contextmanager
def _environ(env: dict[str, str]):
    """``os.environ`` with ``env`` in it for the duration (``grp.start_node`` spawns with ``os.environ``).

    With a ``PYTHONPATH``, the working directory is its first entry too: ``python -m`` puts the working
    directory ahead of ``PYTHONPATH`` on ``sys.path``, so nodes spawned from a checkout would import that
    checkout's code whatever ``PYTHONPATH`` says."""
    old = {k: os.environ.get(k) for k in env}
    cwd = os.getcwd()
    os.environ.update(env)
    if env.get("PYTHONPATH"):
        os.chdir(env["PYTHONPATH"].split(os.pathsep)[0])
    try:
        yield
    finally:
        os.chdir(cwd)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_steps(g: Group) -> list[Step]:
    from broker_adapter.client import Producer
    from dledger.client import DLedgerClient

    leader = g.leader.address
    ch = grpc.insecure_channel(leader)
    health = health_pb2_grpc.HealthStub(ch)
    broker = broker_pb2_grpc.BrokerStub(ch)
    dledger = client_pb2_grpc.DLedgerStub(ch)
    entry = b"e" * ENTRY_BYTES
    fd = os.open(g.dir / "fdatasync.probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    chunk = BODY
    producer_id = uuid.uuid4().hex
    seq = iter(range(1 << 62))

    def fsync_once() -> None:
        os.write(fd, chunk)
        os.fdatasync(fd)

    trio = [
        os.open(g.dir / f"fdatasync.probe{i}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for i in range(3)
    ]
    pool = concurrent.futures.ThreadPoolExecutor(3)

    def fsync_three() -> float:
        """Seconds until the second of three concurrent write+fdatasync finished."""

        def one(f: int) -> float:
            os.write(f, chunk)
            os.fdatasync(f)
            return time.perf_counter()

        t0 = time.perf_counter()
        ends = sorted(
            j.result() for j in [pool.submit(one, f) for f in trio]
        )  # all done: none overlaps the next
        return ends[1] - t0

    def close_three() -> None:
        pool.shutdown()
        for f in trio:
            os.close(f)

    def send_stub() -> None:
        s = next(seq)
        msg = broker_pb2.OutgoingMessage(
            queue_id=s % QUEUES,
            body=BODY,
            msg_id=f"{producer_id[:22].upper()}{s:010X}",
            producer_id=producer_id,
            sequence=s,
            born_timestamp=int(time.time() * 1000),
        )
        broker.Send(broker_pb2.SendRequest(topic=TOPIC, messages=[msg]), timeout=10)

    raw = DLedgerClient([leader])
    prod = Producer([leader])
    steps = [
        Step("fdatasync", fsync_once, lambda: os.close(fd)),
        Step("fdatasync-x3", fsync_three, close_three),
        Step("grpc-empty", lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10)),
        Step("route", lambda: broker.Route(broker_pb2.RouteRequest(), timeout=10)),
        Step(
            "append-unary",
            lambda: dledger.Append(client_pb2.AppendRequest(bodies=[entry]), timeout=10),
        ),
        Step("append-client", lambda: raw.append(entry), raw.close),
        Step("send-stub", send_stub, ch.close),
        Step("send-producer", lambda: prod.send(TOPIC, BODY), prod.close),
    ]
    try:
        for s in steps:  # connections, the leader, the topic's queues: before any clock runs
            for _ in range(3):
                s.call()
    except Exception:
        _close(steps)
        raise
    return steps


WARM_TRIES = 5


def _steps_on_leader(g: Group) -> list[Step]:
    """``make_steps`` against the leader of the moment. A leader that loses its lease during the warm-up (a
    loaded machine: "no leader is known") is waited out and the steps are made again against the next one."""
    for attempt in range(WARM_TRIES):
        g.leader = grp.wait_for_leader(g.spec, timeout_s=30)
        try:
            return make_steps(g)
        except (grpc.RpcError, DLedgerError) as e:
            if attempt == WARM_TRIES - 1:
                raise
            print(
                f"  warm-up failed on {g.leader.id} ({type(e).__name__}); the leader again", file=sys.stderr
            )
            time.sleep(0.5)
    raise AssertionError("unreachable")


def measure(g: Group, calls: int, rounds: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """``rounds`` rounds; in each, every step makes ``calls / rounds`` sequential calls (the order rotates per
    round). A failed call (the machine is loaded: a leader may lose its lease) is counted, not timed; the steps
    are then rebuilt against the new leader."""
    per = max(1, calls // rounds)
    lat: dict[str, list[float]] = {n: [] for n in STEPS}
    errors: dict[str, int] = dict.fromkeys(STEPS, 0)
    steps: list[Step] | None = None
    try:
        for r in range(rounds):
            for k in range(len(STEPS)):
                name = STEPS[(r + k) % len(STEPS)]
                if steps is None:
                    steps = _steps_on_leader(g)
                call = next(s.call for s in steps if s.name == name)
                out = lat[name]
                try:
                    for _ in range(per):
                        t0 = time.perf_counter()
                        took = call()  # a step may time itself (a float), else the whole call counts
                        out.append(took if isinstance(took, float) else time.perf_counter() - t0)
                except Exception:  # counted and shown next to the figures
                    errors[name] += 1
                    _close(steps)
                    steps = None
    finally:
        if steps is not None:
            _close(steps)
    return lat, errors


def _close(steps: list[Step]) -> None:
    for s in steps:
        with contextlib.suppress(Exception):  # closing after a failure: nothing left to save
            s.close()


def table(flush: str, lat: dict[str, list[float]], errors: dict[str, int]) -> tuple[str, dict[str, float]]:
    p50 = {n: pct(xs, 0.5) for n, xs in lat.items()}
    p99 = {n: pct(xs, 0.99) for n, xs in lat.items()}
    # The floor of a replicated, synced send: one client round trip, one leader-follower round trip (about
    # the same loopback gRPC round trip), one fdatasync (flush sync only; the follower's runs in parallel).
    floor = 2 * p50["grpc-empty"] + (p50["fdatasync"] if flush == "sync" else 0.0)
    p50["floor"] = floor
    lines = [
        f"### flush {flush}",
        "",
        "| step | calls | errors | p50 ms | p99 ms | mean ms | p50 / send-producer p50 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, xs in lat.items():
        mean = statistics.fmean(xs) * 1000 if xs else float("nan")
        share = p50[name] / p50["send-producer"]
        lines.append(
            f"| {name} | {len(xs)} | {errors[name]} | {p50[name]:.2f} | {p99[name]:.2f} | {mean:.2f} | {share:.2f} |"
        )
    fs = "2 x grpc-empty" + (" + fdatasync" if flush == "sync" else "")
    lines.append(f"| floor ({fs}) | | | {floor:.2f} | | | {floor / p50['send-producer']:.2f} |")
    lines += ["", "| difference of p50s | ms |", "|---|---:|"]
    for label, a, b in DIFFERENCES:
        lines.append(f"| {label} | {p50[a] - p50[b]:+.2f} |")
    return "\n".join(lines), p50


# -- profiling -----------------------------------------------------------------------------------------------


def client_loop(leader: str, seconds: float) -> None:
    """The profiled client: sequential ``Producer.send`` for ``seconds``; prints ``sends p50_ms``."""
    from broker_adapter.client import Producer

    with Producer([leader]) as p:
        for _ in range(3):
            p.send(TOPIC, BODY)
        print("ready", flush=True)
        lat = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            p.send(TOPIC, BODY)
            lat.append(time.perf_counter() - t0)
    print(f"{len(lat)} {pct(lat, 0.5):.3f}", flush=True)


# Where a frame belongs, by the first rule its function or file matches (checked from the leaf upward, so a
# library call is charged to the nearest project code that made it when no rule names the library itself).
CATEGORIES = (
    # py-spy's idle detection misses threads blocked in native code: these leaves are waits, not CPU.
    ("wait: event loop in epoll (idle)", ("EpollSelector.select",)),
    ("wait: idle thread (I/O pool, client loop)", ("Thread.run (", "_worker (concurrent", "Condition.wait")),
    ("wait: blocking gRPC call in flight (client)", ("_UnaryUnaryMultiCallable._blocking",)),
    ("fdatasync / file writes", ("posix.fdatasync", "os.fdatasync", "fdatasync (", "write (storage/")),
    ("storage (log append, index)", ("storage/",)),
    ("broker: message.encode/decode", ("broker_adapter/core/message.py",)),
    ("broker: allocator prepare", ("broker_adapter/core/allocator.py",)),
    (
        "broker: apply (dispatcher, consume queues)",
        ("broker_adapter/core/statemachine.py", "broker_adapter/consumequeue"),
    ),
    ("broker: servicer (validation, topic, barrier)", ("broker_adapter/service.py", "broker_adapter/broker")),
    ("state machine apply loop", ("statemachine/",)),
    ("raft core", ("dledger/core/",)),
    (
        "peer transport (pipe, protobuf convert)",
        ("dledger/transport/convert.py", "dledger/transport/grpc.py"),
    ),
    ("node: ready loop, commit, senders", ("dledger/runtime/",)),
    ("client: Producer (message build, retry wrapper)", ("broker_adapter/client.py",)),
    ("client: DLedgerClient", ("dledger/client.py",)),
    ("grpc (aio server / channel, cython)", ("grpc/", "cygrpc", ".pyx")),
    ("protobuf", ("google/protobuf",)),
    ("asyncio event loop", ("asyncio/", "selectors.py")),
)


def categorise(raw: Path) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """py-spy raw stacks -> (samples, samples per category, samples per leaf function)."""
    cats: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, c in raw_stacks(raw):
        total += c
        if not frames:
            continue
        leaves[frames[-1]] += c
        cat = "other"
        leaf_wait = next((n for n, keys in CATEGORIES[:3] if any(k in frames[-1] for k in keys)), None)
        for f in reversed(frames):
            if leaf_wait is not None:
                cat = leaf_wait
                break
            hit = next((name for name, keys in CATEGORIES[3:] if any(k in f for k in keys)), None)
            if hit is not None:
                cat = hit
                break
        cats[cat] += c
    return total, cats, leaves


def _py_spy() -> str | None:
    path = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return path if Path(path).exists() else None


def profile(g: Group, seconds: float, out: Path) -> str:
    """Sample the leader and a sequential-send client with py-spy; CPU per send by category."""
    spy = _py_spy()
    if spy is None:
        return "py-spy is not installed (pip install py-spy): no profile"
    out.mkdir(parents=True, exist_ok=True)
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.send_budget",
            "--client-loop",
            g.leader.address,
            "--seconds",
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    spies = []
    try:
        assert client.stdout is not None
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError("the profiled client did not start")
        targets = {"leader": g.leader_pid(), "client": client.pid}
        for who, pid in targets.items():
            path = out / f"{g.flush}-{who}.txt"
            cmd = [spy, "record", "--pid", str(pid), "--nonblocking", "--rate", str(PROFILE_RATE)]
            cmd += [
                "--duration",
                str(max(1, int(seconds) - 1)),
                "--format",
                "raw",
                "--nolineno",
                "-o",
                str(path),
            ]
            spies.append(
                (who, path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            )
        last = client.stdout.readline().split()
        client.wait(timeout=30)
        sends, p50 = int(last[0]), float(last[1])
        for _, _, p in spies:
            p.wait(timeout=60)
    finally:
        for _, _, p in spies:
            if p.poll() is None:
                p.kill()
                p.wait()
        if client.poll() is None:
            client.kill()
            client.wait()
    sampled_s = max(1, int(seconds) - 1)
    per_send_ms = 1000 * seconds / max(1, sends)
    lines = [
        f"### profile, flush {g.flush}: {sends} sequential Producer.send in {seconds:g} s "
        f"({sends / seconds:.0f}/s, p50 {p50:.2f} ms, {per_send_ms:.2f} ms per send)",
        "",
    ]
    for who, path, p in spies:
        if p.returncode != 0 or not path.exists():
            err = p.stderr.read().decode(errors="replace")[-300:] if p.stderr else ""
            lines.append(f"py-spy on the {who} failed ({p.returncode}): {err}")
            continue
        total, cats, leaves = categorise(path)
        # Samples over sampled seconds -> CPU seconds; per send at the loop's send rate.
        scale = 1000 / PROFILE_RATE / max(1.0, sends * sampled_s / seconds)
        ms = scale.__mul__
        lines += [
            f"{who}: {total} CPU samples at {PROFILE_RATE}/s over {sampled_s} s = {ms(total):.2f} ms CPU per send "
            f"({total / PROFILE_RATE / sampled_s:.0%} of one core); stacks in {path}",
            "",
            f"| {who} CPU per send by category | ms | share |",
            "|---|---:|---:|",
            *[f"| {c} | {ms(n):.3f} | {n / total:.0%} |" for c, n in cats.most_common()],
            "",
            f"| {who} top leaf functions | ms | share |",
            "|---|---:|---:|",
            *[f"| `{f}` | {ms(n):.3f} | {n / total:.0%} |" for f, n in leaves.most_common(12)],
            "",
        ]
    return "\n".join(lines)


def run(flushes: list[str], calls: int, rounds: int, profile_s: float, out: Path, workdir: Path) -> str:
    head = (
        f"send budget, {time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}, "
        f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs"
    )
    parts = [head, ""]
    for flush in flushes:
        g = Group(workdir, flush)
        try:
            lat, errors = measure(g, calls, rounds)
            text, _ = table(flush, lat, errors)
            parts += [text, ""]
            print(text + "\n", flush=True)
            if profile_s > 0:
                g.leader = grp.wait_for_leader(g.spec, timeout_s=30)
                text = profile(g, profile_s, out)
                parts += [text, ""]
                print(text + "\n", flush=True)
        finally:
            g.stop()
    return "\n".join(parts)


# -- A/B of source trees --------------------------------------------------------------------------------------


def parse_ab(specs: list[str]) -> dict[str, dict[str, str]]:
    """``LABEL=PYTHONPATH[;VAR=VALUE...]`` -> {label: environment of its nodes}."""
    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        label, _, rest = spec.partition("=")
        path, *extra = rest.split(";")
        if not label or not path:
            raise ValueError(f"--ab {spec!r}: expected LABEL=PYTHONPATH[;VAR=VALUE...]")
        env = {"PYTHONPATH": path}
        for kv in extra:
            k, _, v = kv.partition("=")
            env[k] = v
        out[label] = env
    return out


IDLE_S = 0.3  # --ab: seconds of idle CPU measured per group and round (subtracted from the steps' CPU)


def measure_ab(
    groups: dict[str, Group], names: list[str], calls: int, rounds: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, int], dict[str, dict[str, float]]]:
    """Like ``measure``, over several groups: each round, every group runs every step (``calls / rounds``
    calls), the order of the groups rotating round by round. Also returns the CPU seconds the group's three
    node processes used during each step's calls, less what they use idle (ticks, heartbeats: measured for
    ``IDLE_S`` before each group's turn and charged pro rata); the machine's load moves it less than latency."""
    per = max(1, calls // rounds)
    labels = list(groups)
    cpu = {lb: dict.fromkeys(names, 0.0) for lb in labels}
    lat = {lb: {n: [] for n in names} for lb in labels}
    errors = dict.fromkeys(labels, 0)
    steps: dict[str, list[Step] | None] = dict.fromkeys(labels)
    try:
        for r in range(rounds):
            for k in range(len(labels)):
                lb = labels[(r + k) % len(labels)]
                g = groups[lb]
                try:
                    if steps[lb] is None:
                        g.leader = grp.wait_for_leader(g.spec, timeout_s=30)
                        steps[lb] = make_steps(g)
                    pids = [p for p in (grp.read_pid(n) for n in g.spec.nodes) if p is not None]
                    c0, w0 = cpu_seconds(pids), time.perf_counter()
                    time.sleep(IDLE_S)
                    idle_rate = (cpu_seconds(pids) - c0) / (time.perf_counter() - w0)
                    for name in names:
                        call = next(s.call for s in steps[lb] if s.name == name)
                        out = lat[lb][name]
                        c0, w0 = cpu_seconds(pids), time.perf_counter()
                        for _ in range(per):
                            t0 = time.perf_counter()
                            took = call()
                            out.append(took if isinstance(took, float) else time.perf_counter() - t0)
                        busy = cpu_seconds(pids) - c0
                        cpu[lb][name] += busy - idle_rate * (time.perf_counter() - w0)
                except Exception:  # a lost lease under load: counted, the steps rebuilt
                    errors[lb] += 1
                    if steps[lb] is not None:
                        _close(steps[lb])
                    steps[lb] = None
    finally:
        for st in steps.values():
            if st is not None:
                _close(st)
    return lat, errors, cpu


def table_ab(
    flush: str,
    lat: dict[str, dict[str, list[float]]],
    errors: dict[str, int],
    cpu: dict[str, dict[str, float]],
) -> str:
    labels = list(lat)
    base = labels[0]
    names = list(lat[base])
    head = " | ".join(f"{lb} p50 (p90)" for lb in labels)
    ratios = " | ".join(f"{lb}/{base}" for lb in labels[1:])
    lines = [
        f"### flush {flush}, A/B (errors: {', '.join(f'{lb} {errors[lb]}' for lb in labels)})",
        "",
        f"| step | calls | {head} | {ratios} |",
        "|---|---:|" + "---:|" * (len(labels) + len(labels) - 1),
    ]
    for n in names:
        p50 = {lb: pct(lat[lb][n], 0.5) for lb in labels}
        cells = " | ".join(f"{p50[lb]:.2f} ({pct(lat[lb][n], 0.9):.2f})" for lb in labels)
        rs = " | ".join(f"{p50[lb] / p50[base]:.2f}" for lb in labels[1:])
        lines.append(f"| {n} | {len(lat[base][n])} | {cells} | {rs} |")
    lines += [
        "",
        f"| node CPU ms per call, 3 processes, idle subtracted | {' | '.join(labels)} | {ratios} |",
        "|---|" + "---:|" * (len(labels) + len(labels) - 1),
    ]
    for n in names:
        per = {lb: 1000 * cpu[lb][n] / max(1, len(lat[lb][n])) for lb in labels}
        cells = " | ".join(f"{per[lb]:.2f}" for lb in labels)
        rs = " | ".join(f"{per[lb] / per[base]:.2f}" if per[base] else "-" for lb in labels[1:])
        lines.append(f"| {n} | {cells} | {rs} |")
    return "\n".join(lines)


def run_ab(
    ab: dict[str, dict[str, str]],
    names: list[str],
    flushes: list[str],
    calls: int,
    rounds: int,
    workdir: Path,
) -> str:
    head = (
        f"send budget A/B, {time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}, "
        f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs; "
        + ", ".join(f"{lb}: {env}" for lb, env in ab.items())
    )
    parts = [head, ""]
    print(head, flush=True)
    for flush in flushes:
        groups: dict[str, Group] = {}
        try:
            for lb, env in ab.items():
                groups[lb] = Group(workdir, flush, lb, env)
            lat, errors, cpu = measure_ab(groups, names, calls, rounds)
            text = table_ab(flush, lat, errors, cpu)
            load = f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
            parts += [text, "", load, ""]
            print(text + "\n\n" + load + "\n", flush=True)
        finally:
            for g in groups.values():
                g.stop()
    return "\n".join(parts)


def _commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.send_budget", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--calls", type=int, default=500, help="sequential calls per step (split over the rounds)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flush", default="sync,async", help="flush policies, comma separated")
    ap.add_argument(
        "--profile", type=float, default=0.0, help="seconds of py-spy sampling per policy (0: none)"
    )
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "dledger-send-budget")
    ap.add_argument("--dir", type=Path, default=None, help="where the groups live (default: a temporary dir)")
    ap.add_argument(
        "--ab",
        action="append",
        default=[],
        help="LABEL=PYTHONPATH[;VAR=VALUE]: compare source trees side by side (twice or more)",
    )
    ap.add_argument(
        "--steps",
        default="grpc-empty,append-unary,send-producer",
        help="with --ab: the steps to run, comma separated",
    )
    ap.add_argument("--client-loop", default=None, help=argparse.SUPPRESS)  # the profiled client (internal)
    ap.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client_loop:
        client_loop(args.client_loop, args.seconds)
        return 0
    flushes = [f for f in args.flush.split(",") if f]
    if any(f not in ("sync", "async") for f in flushes):
        ap.error("--flush takes sync and/or async")
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="dledger-send-budget-"))
    try:
        if args.ab:
            names = [n for n in args.steps.split(",") if n]
            if len(args.ab) < 2 or any(n not in STEPS for n in names):
                ap.error(f"--ab needs two labels or more; --steps among {', '.join(STEPS)}")
            text = run_ab(parse_ab(args.ab), names, flushes, args.calls, args.rounds, workdir)
        else:
            text = run(flushes, args.calls, args.rounds, args.profile, args.out, workdir)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "send-budget.md").write_text(text + "\n")
    print(f"written: {args.out / 'send-budget.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
