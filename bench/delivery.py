"""Benchmark (smoke-sized): what delayed delivery and FIFO groups cost (issue 16), on one three-node broker group
(separate processes on 127.0.0.1, flush "sync"), each figure beside its baseline from the same run.

- delay: ``--messages`` messages sent by our ``Producer`` from ``--threads`` threads, due ``--delay-ms`` after
  the run starts, against the same number of normal messages (send msg/s, ratio delayed / normal); then the
  lateness of each delayed message, from its due time to when our ``Consumer`` (pulling, long-polling) got it:
  p50 / p99 / max in ms.
- FIFO: the official ``SimpleConsumer`` receiving batches of 32 and acking each message, in a FIFO group (one
  message of each message group in flight) with the messages in 1 and in 100 message groups, against a normal
  group on the same messages (receive+ack msg/s, ratio FIFO / normal).

Every process started is stopped by its pid at the end, also on failure.

    python -m bench.delivery [--messages 300] [--threads 8] [--delay-ms 3000] [--fifo-messages 300] [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from broker_adapter.client import BrokerConnection, Consumer, Producer
from broker_adapter.core import message
from broker_adapter.rocketmq import ensure_event_loop
from dledger import group as grp

BODY = bytes(range(256))
QUEUES = 4


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def send_all(g: grp.GroupSpec, topic: str, n: int, threads: int, deliver_at_ms: int = 0) -> float:
    with Producer(g.addresses) as p:
        p.send(topic, b"warm")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda i: p.send(topic, BODY, deliver_at_ms=deliver_at_ms), range(n)))
        return rate(n, time.perf_counter() - t0)


def lateness(g: grp.GroupSpec, topic: str, n: int, due_ms: int, timeout_s: float = 60) -> list[float]:
    """ms from the due time to the receipt of each of ``n`` delayed messages (every queue pulled in turn)."""
    late: list[float] = []
    with Consumer(g.addresses, "bench-delay") as c:
        offsets = [0] * QUEUES
        deadline = time.monotonic() + timeout_s
        while len(late) < n and time.monotonic() < deadline:
            for q in range(QUEUES):
                got = c.pull(topic, q, offsets[q], max_messages=256, wait_ms=50)
                now = time.time() * 1000
                for m in got:
                    if m.body == BODY:
                        late.append(now - due_ms)
                offsets[q] += len(got)
    return late


def fifo_round(cfg: ClientConfiguration, topic: str, group: str, n: int) -> float:
    ensure_event_loop()
    c = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1)
    c.startup()
    try:
        got: set[str] = set()
        t0 = time.perf_counter()
        deadline = time.monotonic() + 120
        while len(got) < n and time.monotonic() < deadline:
            for m in c.receive(32, 30):
                try:
                    c.ack(m)
                except Exception as e:  # a leader change under load: the message comes back, counted once
                    print(f"  (ack failed, the message will be redelivered: {e})")
                    continue
                got.add(m.message_id)
        return rate(len(got), time.perf_counter() - t0) if len(got) == n else 0.0
    finally:
        c.shutdown()


def send_grouped(g: grp.GroupSpec, topic: str, n: int, mgroups: int) -> None:
    with Producer(g.addresses) as p:
        msgs = []
        for i in range(n):
            mg = f"mg{i % mgroups}"
            m = p.outgoing(topic, BODY)
            m.queue_id = zlib.crc32(mg.encode()) % QUEUES
            m.properties[message.PROPERTY_MESSAGE_GROUP] = mg
            msgs.append(m)
        for at in range(0, n, 64):
            p.send_messages(topic, msgs[at : at + 64])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--delay-ms", type=int, default=3000)
    ap.add_argument("--fifo-messages", type=int, default=300)
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args()
    d = a.dir or Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    g, _ = grp.up(d, 3, None, state_machine="broker")
    try:
        grp.wait_for_all(g, 30)
        with BrokerConnection(g.addresses) as c:
            for t in ("b-normal", "b-delay", "b-fifo1", "b-fifo100"):
                c.create_topic(t, QUEUES)
            for t in ("b-fifo1", "b-fifo100"):
                c.set_group_settings(f"{t}-fifo", fifo=True)
        n = a.messages
        normal = send_all(g, "b-normal", n, a.threads)
        due = int(time.time() * 1000) + a.delay_ms
        delayed = send_all(g, "b-delay", n, a.threads, deliver_at_ms=due)
        print(
            f"send, {n} x {len(BODY)} B, {a.threads} threads: normal {normal:,.0f} msg/s, delayed {delayed:,.0f} "
            f"msg/s (delayed / normal {delayed / normal:.2f})"
        )
        late = lateness(g, "b-delay", n, due)
        if len(late) < n:
            print(f"delay: only {len(late)} of {n} delayed messages arrived")
        if late:
            early = sum(1 for x in late if x < 0)
            print(
                f"delay lateness after the due time, {len(late)} messages: p50 {pct(late, 0.5):.0f} ms, "
                f"p99 {pct(late, 0.99):.0f} ms, max {max(late):.0f} ms, early {early}"
            )
        cfg = ClientConfiguration(";".join(g.addresses), Credentials(), request_timeout=5)
        fn = a.fifo_messages
        for topic, mgroups in (("b-fifo1", 1), ("b-fifo100", 100)):
            send_grouped(g, topic, fn, mgroups)
            fifo = fifo_round(cfg, topic, f"{topic}-fifo", fn)
            base = fifo_round(cfg, topic, f"{topic}-normal", fn)
            ratio = f"{fifo / base:.2f}" if base else "n/a"
            print(
                f"receive+ack, {fn} messages in {mgroups} message group(s): FIFO group {fifo:,.0f} msg/s, "
                f"normal group {base:,.0f} msg/s (FIFO / normal {ratio})"
            )
    finally:
        grp.stop_group(g)


if __name__ == "__main__":
    main()
