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

``--baseline-tree DIR`` runs the same measurement with the servicer of source tree DIR (e.g. /work/main) in a
child process (its PYTHONPATH), alternating with this tree's, and prints both and the ratio this / baseline.

    python -m bench.rocketmq_servicer [--calls 2000] [--repeat 5] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CALLS = ("QueryRoute", "Heartbeat", "SendMessage", "ReceiveMessage (per message of 32)", "AckMessage")


class _Context:
    """What the servicer reads of a gRPC context."""

    def invocation_metadata(self):
        return (("x-mq-client-id", "bench-client"),)

    def time_remaining(self):
        return 5.0

    async def abort(self, code, details):  # a malformed request: never here
        raise RuntimeError(details)


async def _measure(calls: int) -> dict[str, float]:
    import grpc
    from rocketmq.grpc_protocol import ClientType, Code, service_pb2

    from broker_adapter.rocketmq import handlers
    from broker_adapter.rocketmq.servicer import MessagingServicer
    from tests.broker.test_broker import made as made_fixture
    from tests.broker.test_broker import topic

    captured: dict[str, Any] = {}

    class Server:  # collects the registered handlers instead of serving them
        def add_generic_rpc_handlers(self, hs):
            for h in hs:
                captured["generic"] = h

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

        async def unary(method: str, req_bytes: bytes, n: int) -> float:
            h = handler(method)
            parse, fn, ser = h.request_deserializer, h.unary_unary, h.response_serializer
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
        t0 = time.process_time()
        for raw in reqs:
            r = await fn(parse(raw), ctx)
            b = ser(r)
        if service_pb2.SendMessageResponse.FromString(b).status.code != Code.OK:
            raise RuntimeError(f"send refused: {service_pb2.SendMessageResponse.FromString(b)}")
        out["SendMessage"] = (time.process_time() - t0) / calls * 1e6

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
        out["ReceiveMessage (per message of 32)"] = (time.process_time() - t0) / max(len(handles), 1) * 1e6

        h = handler("AckMessage")
        parse, fn, ser = h.request_deserializer, h.unary_unary, h.response_serializer
        acks = []
        for hd in handles:
            a = service_pb2.AckMessageRequest()
            a.group.name = "G"
            a.topic.name = "T"
            a.entries.add(message_id="m", receipt_handle=hd)
            acks.append(a.SerializeToString())
        t0 = time.process_time()
        for raw in acks:
            r = await fn(parse(raw), ctx)
            b = ser(r)
        if service_pb2.AckMessageResponse.FromString(b).status.code != Code.OK:
            raise RuntimeError(f"ack refused: {service_pb2.AckMessageResponse.FromString(b)}")
        out["AckMessage"] = (time.process_time() - t0) / max(len(acks), 1) * 1e6
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


def measure(calls: int) -> dict[str, float]:
    return asyncio.run(_measure(calls))


def _child(tree: Path, calls: int) -> dict[str, float]:
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
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.calls)))
        return
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(args.repeat):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for k in order:
            runs[k].append(_child(trees[k], args.calls))
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


if __name__ == "__main__":
    main()
