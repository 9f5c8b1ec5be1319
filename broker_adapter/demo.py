"""The broker's part of ``make demo``: a topic, producers, a leader killed mid-produce, and the proof that every
acknowledged message is still there, consumed exactly once by a consumer group.

``run(group_dir, console)`` starts a three-node broker group in ``group_dir`` (separate processes on 127.0.0.1),
and always stops it at the end. Returns an exit code (0: nothing acknowledged was lost).

``dledger demo`` (registered here, as an entry point of ``dledger.cli``, because it spans the layers) tells the
whole story: the log demo of ``dledger.cli``, this broker demo, then the Spark audit of the broker group's files,
run as ``dledger audit`` in its own process so that nothing here imports the audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from broker_adapter.client import BrokerConnection, Consumer, Producer, SendResult
from dledger import group as grp
from dledger.errors import DLedgerError

TOPIC = "demo-orders"
QUEUES = 4


def _status_table(rows: list[grp.NodeStatus]) -> Table:
    t = Table("node", "address", "role", "term", "commit")
    for r in rows:
        style = {"leader": "green", "down": "red"}.get(r.role, "")
        t.add_row(
            r.id,
            r.address,
            f"[{style}]{r.role}[/{style}]" if style else r.role,
            str(r.term),
            str(r.commit_index),
        )
    return t


@contextlib.contextmanager
def _own_event_loop() -> Iterator[None]:
    """A current event loop for this thread while the official clients run, closed afterwards.

    The official client opens its Telemetry stream from the thread that calls ``startup()``, and grpc.aio asks
    that thread for its current loop (``broker_adapter.rocketmq.ensure_event_loop`` says more). After
    ``asyncio.run()`` there is none; a loop set here and never closed is left for the garbage collector, which
    warns "unclosed event loop"."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def official_client(g: grp.GroupSpec, console: Console, messages: int = 100) -> int:
    """A RocketMQ 5 ``Producer`` sends through RocketMQ's own gRPC protocol; our ``Consumer`` and the official
    ``SimpleConsumer`` both read what it sent (one message model); the acks go through the log."""
    try:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, SimpleConsumer
        from rocketmq import Producer as RocketMQProducer
    except ImportError:
        console.print("rocketmq-python-client is not installed (pip install -e '.[test]'): step skipped")
        return 0
    topic = "demo-rocketmq"
    with BrokerConnection(g.addresses) as c:
        c.create_topic(topic, 2)
    endpoints = ";".join(g.addresses)
    cfg = ClientConfiguration(endpoints, Credentials(), request_timeout=10)
    console.print(f'ClientConfiguration("{endpoints}", Credentials()): every node, followers forward writes')
    with _own_event_loop():
        producer = RocketMQProducer(cfg, (topic,))
        producer.startup()
        sent = {}
        try:
            for i in range(messages):
                m = Message()
                m.topic, m.body, m.tag = topic, f"rocketmq-{i}".encode(), "demo"
                sent[producer.send(m).message_id] = m.body
        finally:
            producer.shutdown()
        console.print(f"the official Producer sent {len(sent)} messages (each acknowledged at quorum commit)")
        with Consumer(g.addresses, "demo-ours", retry_for_s=30) as ours:
            by_ours = {m.msg_id: m.body for m in ours.messages(topic, idle_s=1.0)}
        console.print(f"our Consumer pulled {sum(by_ours.get(k) == v for k, v in sent.items())} of them")
        consumer = SimpleConsumer(cfg, "demo-rocketmq", {topic: FilterExpression("demo")}, await_duration=1)
        consumer.startup()
        received: dict[str, bytes] = {}
        try:
            deadline = time.monotonic() + 60
            while not sent.keys() <= received.keys() and time.monotonic() < deadline:
                for m in consumer.receive(32, 15):
                    received[m.message_id] = bytes(m.body)
                    consumer.ack(m)  # an Ack command through the log: a failover never redelivers it
        finally:
            consumer.shutdown()
    ok = all(received.get(k) == v for k, v in sent.items()) and all(
        by_ours.get(k) == v for k, v in sent.items()
    )
    console.print(f"the official SimpleConsumer received and acked {len(received)} of them")
    if not ok:
        console.print("[red]FAILED: a message sent by the official client was not read back[/red]")
        return 1
    console.print("[bold green]both clients read every message the official client sent[/bold green]")
    return 0


def run(group_dir: Path, console: Console, messages: int = 2000, batch: int = 20) -> int:
    def step(text: str) -> None:
        console.rule(f"[bold]{text}")

    g = grp.create(Path(group_dir), 3, None, state_machine="broker")
    try:
        step("1. start a three-node broker group")
        for spec in g.nodes:
            grp.start_node(spec)
        leader = grp.wait_for_leader(g)
        console.print(f"leader [green]{leader.id}[/green]")
        with BrokerConnection(g.addresses) as c:
            info = c.create_topic(TOPIC, QUEUES)
        console.print(
            f"topic {info.topic} created with {info.queues} queues (a log entry: every node agrees)"
        )

        step(f"2. produce {messages} messages; kill -9 the leader halfway")
        acked: list[SendResult] = []
        failures: list[BaseException] = []

        def produce() -> None:
            with Producer(g.addresses, retry_for_s=30) as p:
                for i in range(0, messages, batch):
                    try:
                        acked.extend(p.send_batch(TOPIC, [f"order-{i + k}".encode() for k in range(batch)]))
                    except DLedgerError as e:
                        failures.append(e)
                        return

        t = threading.Thread(target=produce, name="demo-producer")
        t0 = time.monotonic()
        t.start()
        deadline = time.monotonic() + 60
        while len(acked) < messages // 2 and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        killed = grp.wait_for_leader(g)
        pid = grp.kill_node(g.node(killed.id))
        t_kill = time.monotonic()
        console.print(
            f"killed leader [red]{killed.id}[/red] (pid {pid}) after {len(acked)} acknowledged messages"
        )
        new = grp.wait_for_leader(g, exclude=killed.id)
        console.print(f"[green]{new.id}[/green] leads after {(time.monotonic() - t_kill) * 1000:.0f} ms")
        t.join(120)
        if failures or t.is_alive():
            console.print(f"[red]the producer failed: {failures or 'still running'}[/red]")
            return 1
        dt = time.monotonic() - t0
        dups = sum(r.duplicate for r in acked)
        console.print(
            f"{len(acked)} messages acknowledged in {dt:.2f} s ({len(acked) / dt:,.0f}/s); {dups} retried sends "
            "were recognised as already stored (idempotent producer)"
        )
        console.print(_status_table(grp.status(g)))

        step("3. consume everything as group 'billing' (offsets committed through the log)")
        with Consumer(g.addresses, "billing", retry_for_s=30) as c:
            consumed = list(c.messages(TOPIC, idle_s=1.5))
        ids = [m.msg_id for m in consumed]
        lost = {r.msg_id for r in acked} - set(ids)
        twice = len(ids) - len(set(ids))
        dense = all(
            [m.queue_offset for m in consumed if m.queue_id == q]
            == list(range(sum(1 for m in consumed if m.queue_id == q)))
            for q in range(QUEUES)
        )
        console.print(
            f"consumed {len(consumed)} messages: {len(lost)} acknowledged messages missing, {twice} consumed twice, "
            f"queue offsets dense and in order: {dense}"
        )
        step(f"4. restart {killed.id}")
        grp.start_node(g.node(killed.id))
        grp.wait_caught_up(g, killed.id, max((r.commit_index or -1) for r in grp.wait_for_all(g)))
        console.print(_status_table(grp.status(g)))
        if lost or twice or not dense:
            console.print("[red]FAILED: an acknowledged message was lost or duplicated[/red]")
            return 1
        console.print("[bold green]nothing acknowledged was lost[/bold green]")

        step("5. the official RocketMQ 5 client (rocketmq-python-client), unchanged, on the same group")
        return official_client(g, console)
    except DLedgerError as e:
        console.print(f"[red]demo failed:[/red] {e}")
        return 1
    finally:
        step("6. stop the group")
        stopped = grp.stop_group(g)
        console.print(f"stopped {', '.join(stopped)}")


def demo(
    dir: Annotated[
        Path | None, typer.Option("--dir", help="group directory (default: a temporary one)")
    ] = None,
    entries: Annotated[int, typer.Option(help="entries to append before the kill")] = 1000,
    keep: Annotated[bool, typer.Option(help="keep the group's files afterwards")] = False,
) -> None:
    """Start a group, append, kill the leader, watch the failover, restart the node and see it catch up."""
    from dledger.cli import run_demo
    from dledger.cliutil import console

    tmp = None
    if dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="dledger-demo-")
        dir = Path(tmp.name)
    try:
        rc = run_demo(dir / "log", entries)
        if rc == 0:
            rc = run(dir / "broker", console)
        if rc == 0:  # the same story's security, briefly (docs/security.md)
            from broker_adapter.security_demo import run as run_secure

            rc = run_secure(dir / "secure", console)
        if rc == 0:
            console.rule("[bold]audit: Spark replays every node's files and checks that they agree")
            rc = subprocess.run([sys.executable, "-m", "dledger", "audit", str(dir / "broker")]).returncode
    finally:
        if tmp is not None and not keep:
            tmp.cleanup()
        elif tmp is not None:
            console.print(f"files kept in {dir}")
    raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
