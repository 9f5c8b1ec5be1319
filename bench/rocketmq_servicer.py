"""Benchmark: CPU per call of the RocketMQ servicer alone (``broker_adapter/rocketmq``), in one process, over the
in-memory node double of ``tests/broker`` (a one-node "group" that commits at once, with the real broker, state
machine and dispatcher): what the face itself costs per call, without gRPC, Raft or fsync (issue 15: "per-call
CPU of the RocketMQ servicer (route, heartbeat, send, receive, ack) cut to what the protocol needs").

Each call goes in as the client's bytes and comes out serialized, through the same registration gRPC uses
(``handlers``: parse, servicer method, answer serialized), so parse and serialize count. Measured with
``time.process_time`` over ``--calls`` calls, median of ``--repeat`` runs, in microseconds:

- QueryRoute, Heartbeat: per call;
- SendMessage: one 1 KiB message per call (the broker's send path and the double's log append included);
- ReceiveMessage: a batch of 32, per message (pop through the double's log, one response per message);
- AckMessage: one entry per call (an ``Ack`` command through the double's log and applied).

``--profile`` adds a CPU profile of each phase: a SIGPROF sampler (``setitimer(ITIMER_PROF)``, so only CPU
the process uses is sampled, however busy the machine) counting, per call, the time inside each function of
the servicer and the broker calls it makes (inclusive, µs per call; for ReceiveMessage per message).

``--baseline-tree DIR`` runs the same measurement with the servicer of source tree DIR (e.g. /work/main) in a
child process (its PYTHONPATH), alternating with this tree's, and prints both and the ratio this / baseline.

    python -m bench.rocketmq_servicer [--calls 2000] [--repeat 5] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CALLS = ("QueryRoute", "Heartbeat", "SendMessage", "ReceiveMessage (per message of 32)", "AckMessage")


class Sampler:
    """Counts, on every SIGPROF (asked for every ``interval`` s of this process's CPU time; the kernel delivers
    them at its tick, so the count is scaled by the CPU time measured meanwhile), each function on the main
    thread's stack once: inclusive CPU samples per function (file name: function)."""

    def __init__(self, interval: float = 0.0005):
        self.interval = interval
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0

    def _on(self, _sig, frame) -> None:
        self.samples += 1
        seen = set()
        while frame is not None:
            code = frame.f_code
            key = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"
            if key not in seen:
                seen.add(key)
                self.counts[key] += 1
            frame = frame.f_back

    def __enter__(self) -> Sampler:
        self.counts.clear()
        self.samples = 0
        signal.signal(signal.SIGPROF, self._on)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        self._cpu = time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        self._cpu = time.process_time() - self._cpu

    def per_call(self, calls: int, prefixes: tuple[str, ...]) -> dict[str, float]:
        """µs per call inside each function whose key starts with one of ``prefixes``."""
        per_sample = self._cpu / max(self.samples, 1)
        return {
            k: c * per_sample * 1e6 / max(calls, 1)
            for k, c in self.counts.most_common()
            if k.startswith(prefixes)
        }


# What the per-call profile shows: the face's files and the broker calls they make.
PROFILED = (
    "servicer.py",
    "handlers.py",
    "convert.py",
    "receipt.py",
    "forward.py",
    "status.py",
    "renewal.py",
    "invisibility.py",
    "broker_pop.py",
    "broker_send.py",
    "broker.py:Broker",
    "broker_commit.py",
)


class _Context:
    """What the servicer reads of a gRPC context."""

    def invocation_metadata(self):
        return (("x-mq-client-id", "bench-client"),)

    def time_remaining(self):
        return 5.0

    async def abort(self, code, details):  # a malformed request: never here
        raise RuntimeError(details)


async def _measure(calls: int, profiles: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    import grpc
    from rocketmq.grpc_protocol import ClientType, Code, service_pb2

    from broker_adapter.rocketmq import handlers
    from broker_adapter.rocketmq.servicer import MessagingServicer
    from tests.broker.test_broker import made as made_fixture
    from tests.broker.test_broker import topic

    captured: dict[str, Any] = {}

    class Server:  # collects the MessagingService's registered handlers instead of serving them
        def add_generic_rpc_handlers(self, hs):
            captured["generic"] = hs[0]

    tmp = tempfile.TemporaryDirectory(prefix="bench-rmq-servicer-")
    gen = made_fixture.__wrapped__(Path(tmp.name))
    broker, _node = next(gen)
    s = MessagingServicer(broker)
    handlers.add_to_server(s, Server())
    generic = captured["generic"]

    def handler(method: str):
        class Details:
            pass

        d = Details()
        d.method = f"/{handlers.SERVICE_NAME}/{method}"
        d.invocation_metadata = ()
        return generic.service(d)

    ctx = _Context()
    out: dict[str, float] = {}
    try:
        await topic(broker, "T", queues=4)

        sampler = Sampler() if profiles is not None else None

        def profiled(name: str, n_of: Any) -> Any:
            """A context that samples the phase ``name`` (``n_of()``: its calls, known at the end)."""

            class Phase:
                def __enter__(self):
                    if sampler is not None:
                        sampler.__enter__()

                def __exit__(self, *exc):
                    if sampler is not None:
                        sampler.__exit__()
                        profiles[name] = sampler.per_call(n_of(), PROFILED)

            return Phase()

        async def unary(method: str, req_bytes: bytes, n: int) -> float:
            h = handler(method)
            parse, fn, ser = h.request_deserializer, h.unary_unary, h.response_serializer
            with profiled(method, lambda: n):
                t0 = time.process_time()
                for _ in range(n):
                    r = await fn(parse(req_bytes), ctx)
                    ser(r)
                return (time.process_time() - t0) / n * 1e6

        q = service_pb2.QueryRouteRequest()
        q.topic.name = "T"
        q.endpoints.addresses.add(host="127.0.0.1", port=1)
        out["QueryRoute"] = await unary("QueryRoute", q.SerializeToString(), calls)

        hb = service_pb2.HeartbeatRequest(client_type=ClientType.SIMPLE_CONSUMER)
        hb.group.name = "G"
        out["Heartbeat"] = await unary("Heartbeat", hb.SerializeToString(), calls)

        # Sends: every one a distinct message id (the broker's idempotence would drop a repeated one).
        h = handler("SendMessage")
        parse, fn, ser = h.request_deserializer, h.unary_unary, h.response_serializer
        reqs = []
        for i in range(calls):
            sm = service_pb2.SendMessageRequest()
            m = sm.messages.add()
            m.topic.name = "T"
            m.body = bytes(range(256)) * 4
            m.system_properties.tag = "bench"
            m.system_properties.keys.append(f"k{i}")
            m.system_properties.message_id = f"01BENCH{os.getpid():08X}{i:012d}"
            m.system_properties.message_type = 1  # NORMAL
            m.system_properties.body_encoding = 1  # IDENTITY
            m.system_properties.born_host = "bench"
            m.system_properties.born_timestamp.FromMilliseconds(int(time.time() * 1000))
            reqs.append(sm.SerializeToString())
        with profiled("SendMessage", lambda: calls):
            t0 = time.process_time()
            for raw in reqs:
                r = await fn(parse(raw), ctx)
                b = ser(r)
            t1 = time.process_time()
        if service_pb2.SendMessageResponse.FromString(b).status.code != Code.OK:
            raise RuntimeError(f"send refused: {service_pb2.SendMessageResponse.FromString(b)}")
        out["SendMessage"] = (t1 - t0) / calls * 1e6

        # Receive batches of 32 until every sent message is delivered, keeping the receipt handles.
        h = handler("ReceiveMessage")
        parse, fn, ser = h.request_deserializer, h.unary_stream, h.response_serializer
        rr = service_pb2.ReceiveMessageRequest(batch_size=32)
        rr.group.name = "G"
        rr.message_queue.topic.name = "T"
        rr.message_queue.id = 0
        rr.invisible_duration.FromSeconds(60)
        rr.long_polling_timeout.FromMilliseconds(0)
        raw = rr.SerializeToString()
        handles: list[str] = []
        phase = profiled("ReceiveMessage (per message of 32)", lambda: len(handles))
        phase.__enter__()
        t0 = time.process_time()
        while len(handles) < calls:
            got = 0
            async for resp in fn(parse(raw), ctx):
                b = ser(resp)
                if type(resp) is not bytes and resp.HasField("message"):
                    handles.append(resp.message.system_properties.receipt_handle)
                    got += 1
                elif type(resp) is bytes:
                    pr = service_pb2.ReceiveMessageResponse.FromString(b)
                    if pr.HasField("message"):
                        handles.append(pr.message.system_properties.receipt_handle)
                        got += 1
            if not got:
                break
        t1 = time.process_time()
        phase.__exit__()
        out["ReceiveMessage (per message of 32)"] = (t1 - t0) / max(len(handles), 1) * 1e6

        h = handler("AckMessage")
        parse, fn, ser = h.request_deserializer, h.unary_unary, h.response_serializer
        acks = []
        for hd in handles:
            a = service_pb2.AckMessageRequest()
            a.group.name = "G"
            a.topic.name = "T"
            a.entries.add(message_id="m", receipt_handle=hd)
            acks.append(a.SerializeToString())
        with profiled("AckMessage", lambda: len(acks)):
            t0 = time.process_time()
            for raw in acks:
                r = await fn(parse(raw), ctx)
                b = ser(r)
            t1 = time.process_time()
        if service_pb2.AckMessageResponse.FromString(b).status.code != Code.OK:
            raise RuntimeError(f"ack refused: {service_pb2.AckMessageResponse.FromString(b)}")
        out["AckMessage"] = (t1 - t0) / max(len(acks), 1) * 1e6
        _ = grpc
    finally:
        await s.close()
        with_next = True
        while with_next:
            try:
                next(gen)
            except StopIteration:
                with_next = False
        tmp.cleanup()
    return out


def measure(calls: int, profiles: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    return asyncio.run(_measure(calls, profiles))


def _child(tree: Path, calls: int, profile: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run(
        [  # this file, run over the other tree's packages (its directory is not put on sys.path)
            sys.executable,
            "-c",
            "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            __file__,
            "--child",
            "--calls",
            str(calls),
            *(["--profile"] if profile else []),
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline-tree", type=Path, default=None)
    ap.add_argument("--profile", action="store_true", help="also print a CPU profile per call of each tree")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        profiles: dict[str, dict[str, float]] | None = {} if args.profile else None
        figures = measure(args.calls, profiles)
        print(json.dumps({"figures": figures, "profiles": profiles or {}}))
        return
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    profiles: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in trees}
    for r in range(args.repeat):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for k in order:
            got = _child(trees[k], args.calls, args.profile)
            runs[k].append(got["figures"])
            profiles[k].append(got["profiles"])
    print(f"servicer CPU per call, µs (median of {args.repeat} runs of {args.calls} calls [min-max])")
    head = f"{'call':<36}" + "".join(f"{k:>22}" for k in trees) + ("   ratio" if len(trees) > 1 else "")
    print(head)
    for c in CALLS:
        cells = []
        med = {}
        for k in trees:
            xs = [x[c] for x in runs[k]]
            med[k] = statistics.median(xs)
            cells.append(f"{f'{med[k]:.1f} [{min(xs):.1f}-{max(xs):.1f}]':>22}")
        ratio = f"{med['this'] / med['baseline']:8.2f}" if len(trees) > 1 else ""
        print(f"{c:<36}" + "".join(cells) + ratio)
    if args.profile:
        print()
        print("CPU profile per call (SIGPROF samples of CPU time, mean over the runs), inclusive µs;")
        print("functions above 2 µs per call in either tree")
        for c in CALLS:
            print(f"-- {c}")
            merged: dict[str, dict[str, float]] = {}
            for k in trees:
                for prof in profiles[k]:
                    for fn, us in prof.get(c, {}).items():
                        merged.setdefault(fn, {}).setdefault(k, 0.0)
                        merged[fn][k] += us / len(profiles[k])
            rows = sorted(merged.items(), key=lambda kv: -max(kv[1].values()))
            for fn, by in rows:
                if max(by.values()) < 2:
                    continue
                print(f"   {fn:<64}" + "".join(f"{by.get(k, 0.0):>10.1f}" for k in trees))


if __name__ == "__main__":
    main()
