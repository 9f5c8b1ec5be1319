"""Broker commands of the ``dledger`` CLI: ``topic create``, ``topic list``, ``consumer-group settings``,
``produce``, ``consume``.

``dledger.cli`` calls ``register(app)`` at start. Every command talks to a group given by ``--dir`` (a local
group directory) or ``--addresses host:port,...``. ``produce --ack-log FILE`` writes one JSON line per
acknowledged message ({"msg_id","topic","queue_id","queue_offset","commitlog_offset"}): the input of the Spark
audit, which checks that every acknowledged message is in every node's log exactly once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from broker_adapter.client import BrokerConnection, Consumer, Producer, SendResult
from broker_adapter.core.sqlfilter import FilterSyntaxError
from dledger.cliutil import AddressesOpt, DirOpt, addresses_of, console, fail
from dledger.errors import DLedgerError

topic_app = typer.Typer(
    no_args_is_help=True,
    help="Broker topics: create, list, status, route, browse, delete (changes replicated through the log).",
)

PROGRESS_FROM = 1000  # show a progress bar for runs at least this long


def ack_record(r: SendResult) -> dict:
    """One line of the ack log (the audit's input format)."""
    return {
        "msg_id": r.msg_id,
        "topic": r.topic,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
        "commitlog_offset": r.commitlog_offset,
    }


def consumed_record(m) -> dict:
    """One line of ``consume --out``: where a consumed message was (the same fields as an ack record)."""
    return {
        "msg_id": m.msg_id,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "commitlog_offset": m.commitlog_offset,
    }


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


@topic_app.command("create")
def topic_create(
    topic: Annotated[str, typer.Option("--topic", help="topic name")],
    queues: Annotated[int, typer.Option("--queues", help="number of queues")] = 4,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: Annotated[
        str | None,
        typer.Option(
            "--nameservers",
            help="a cluster's name servers: create it in every live group; returns once every name server "
            "routes it",
        ),
    ] = None,
) -> None:
    """Create a topic (a log entry, so every node agrees); creating it again with the same queues is a no-op."""
    if nameservers:
        _create_in_cluster(_nameserver_list(nameservers), topic, queues)
        return
    with BrokerConnection(addresses_of(dir, addresses, state_machine="broker")) as c:
        try:
            info = c.create_topic(topic, queues)
        except DLedgerError as e:
            fail(f"{type(e).__name__}: {e}")
    console.print(f"topic {info.topic} with {info.queues} queues")


def _create_in_cluster(nameservers: list[str], topic: str, queues: int) -> None:
    from broker_adapter.nameserver.client import NameServerClient

    try:
        with NameServerClient(nameservers) as ns:
            groups = ns.route("")
            for g in groups:
                with BrokerConnection(list(g.addresses)) as c:
                    c.create_topic(topic, queues)
            ns.wait_routable(topic, [g.group for g in groups], queues)
    except DLedgerError as e:
        fail(f"{type(e).__name__}: {e}")
    console.print(f"topic {topic}: {queues} queues in each of {len(groups)} groups, routable")


@topic_app.command("list")
def topic_list(dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """List topics with their queues' end offsets."""
    with BrokerConnection(addresses_of(dir, addresses, state_machine="broker")) as c:
        try:
            topics = c.list_topics()
        except DLedgerError as e:
            fail(f"{type(e).__name__}: {e}")
    for t in topics:
        console.print(
            f"{t.topic}\tqueues={t.queues}\tmessages={sum(t.max_offsets)}\tends={list(t.max_offsets)}"
        )


consumer_group_app = typer.Typer(
    no_args_is_help=True,
    help="Consumer groups: list, describe, reset, delete, delivery settings (replicated through the log).",
)


@consumer_group_app.command("settings")
def consumer_group_settings(
    group: Annotated[str, typer.Option("--group", help="consumer group")],
    fifo: Annotated[
        bool, typer.Option("--fifo/--no-fifo", help="one message per message group in flight")
    ] = False,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", help="deliveries before the dead-letter topic (0: 17)")
    ] = 0,
    backoff: Annotated[str, typer.Option("--backoff", help="customized or exponential")] = "customized",
    levels_ms: Annotated[
        str, typer.Option("--levels-ms", help="customized: comma-separated delays before retry 1, 2, ...")
    ] = "",
    initial_ms: Annotated[int, typer.Option("--initial-ms", help="exponential: first delay")] = 0,
    max_ms: Annotated[int, typer.Option("--max-ms", help="exponential: largest delay")] = 0,
    multiplier: Annotated[float, typer.Option("--multiplier", help="exponential: growth per retry")] = 0.0,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Replace a consumer group's delivery settings (docs/rocketmq.md, Delivery); prints those now in force."""
    try:
        levels = [int(v) for v in levels_ms.split(",") if v.strip()]
    except ValueError:
        fail(f"--levels-ms must be comma-separated integers, got {levels_ms!r}", 2)
    with BrokerConnection(addresses_of(dir, addresses, state_machine="broker")) as c:
        try:
            got = c.set_group_settings(
                group,
                fifo=fifo,
                max_attempts=max_attempts,
                backoff=backoff,
                levels_ms=levels,
                initial_ms=initial_ms,
                max_ms=max_ms,
                multiplier=multiplier,
            )
        except DLedgerError as e:
            fail(f"{type(e).__name__}: {e}")
    console.print_json(json.dumps({"group": group, **got}))


def produce(
    topic: Annotated[str, typer.Option("--topic", help="topic name")],
    body: Annotated[str | None, typer.Option("--body", help="one message with this text")] = None,
    count: Annotated[int, typer.Option("--count", help="send this many generated messages")] = 0,
    size: Annotated[int, typer.Option("--size", help="body size of generated messages")] = 1024,
    batch: Annotated[int, typer.Option("--batch", help="messages per send")] = 1,
    tags: Annotated[str | None, typer.Option("--tags", help="tags of every message")] = None,
    ack_log: Annotated[
        Path | None, typer.Option("--ack-log", help="JSON line per acknowledged message")
    ] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
) -> None:
    """Send messages; each acknowledged one is committed and dispatched (and recorded in --ack-log)."""
    if (body is None) == (count <= 0):
        fail("give either --body TEXT or --count N", 2)
    if not 1 <= batch <= 1024:
        fail("--batch must be in 1..1024", 2)
    if nameservers:
        _produce_cluster(nameservers, topic, body, count, size, tags, ack_log)
        return
    total = 1 if body is not None else count
    ack = open(ack_log, "a") if ack_log else None  # noqa: SIM115 - closed in finally
    sent = 0
    t0 = time.monotonic()
    try:
        with Producer(addresses_of(dir, addresses, state_machine="broker")) as p, _progress() as bar:
            task = bar.add_task(f"produce {topic}", total=total, visible=total >= PROGRESS_FROM)
            while sent < total:
                n = min(batch, total - sent)
                if body is not None:
                    items = [body.encode()]
                else:
                    items = [_generated(sent + i, size) for i in range(n)]
                try:
                    results = p.send_batch(topic, [(b, tags, None) for b in items])
                except DLedgerError as e:
                    fail(f"{type(e).__name__} after {sent} acknowledged messages: {e}")
                if ack is not None:
                    ack.write("".join(json.dumps(ack_record(r)) + "\n" for r in results))
                sent += len(results)
                bar.update(task, advance=len(results))
                if total == 1:
                    r = results[0]
                    console.print(
                        f"msg_id {r.msg_id} queue {r.queue_id} offset {r.queue_offset} "
                        f"commitlog_offset {r.commitlog_offset}"
                    )
    finally:
        if ack is not None:
            ack.flush()
            os.fsync(ack.fileno())
            ack.close()
    dt = time.monotonic() - t0
    console.print(f"acknowledged {sent} messages in {dt:.2f} s ({sent / max(dt, 1e-9):.0f} msg/s)")


NameServersOpt = Annotated[
    str | None,
    typer.Option(
        "--nameservers",
        help="name servers of a cluster (host:port,...): every group serving the topic (docs/cluster.md)",
    ),
]


def _nameserver_list(text: str) -> list[str]:
    from dledger.nodeconfig import parse_address

    out = [a.strip() for a in text.split(",") if a.strip()]
    try:
        for a in out:
            parse_address(a, "--nameservers")
    except DLedgerError as e:
        fail(str(e), 2)
    if not out:
        fail("--nameservers is empty: give host:port,...", 2)
    return out


def _produce_cluster(
    nameservers: str,
    topic: str,
    body: str | None,
    count: int,
    size: int,
    tags: str | None,
    ack_log: Path | None,
) -> None:
    """``produce --nameservers``: one message per call through ``ClusterProducer``, spread over the groups; the
    ack log records each message's group (the cluster audit splits it by group)."""
    from broker_adapter.cluster.client import ClusterProducer

    total = 1 if body is not None else count
    ack = open(ack_log, "a") if ack_log else None  # noqa: SIM115 - closed in finally
    sent = 0
    t0 = time.monotonic()
    try:
        with ClusterProducer(_nameserver_list(nameservers)) as p, _progress() as bar:
            task = bar.add_task(f"produce {topic}", total=total, visible=total >= PROGRESS_FROM)
            while sent < total:
                data = body.encode() if body is not None else _generated(sent, size)
                try:
                    group, r = p.send(topic, data, tags)
                except DLedgerError as e:
                    fail(f"{type(e).__name__} after {sent} acknowledged messages: {e}")
                if ack is not None:
                    ack.write(json.dumps({"group": group, **ack_record(r)}) + "\n")
                sent += 1
                bar.update(task, advance=1)
                if total == 1:
                    console.print(
                        f"group {group} msg_id {r.msg_id} queue {r.queue_id} offset {r.queue_offset} "
                        f"commitlog_offset {r.commitlog_offset}"
                    )
    finally:
        if ack is not None:
            ack.flush()
            os.fsync(ack.fileno())
            ack.close()
    dt = time.monotonic() - t0
    console.print(f"acknowledged {sent} messages in {dt:.2f} s ({sent / max(dt, 1e-9):.0f} msg/s)")


def _generated(i: int, size: int) -> bytes:
    head = f"msg-{i:010d}-".encode()
    return (head * (size // len(head) + 1))[:size] if size > 0 else b""


def consume(
    topic: Annotated[str, typer.Option("--topic", help="topic name")],
    group: Annotated[str, typer.Option("--group", help="consumer group (offsets committed through the log)")],
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="a new group starts at offset 0, not at the end")
    ] = False,
    count: Annotated[int, typer.Option("--count", help="stop after this many messages (0: until idle)")] = 0,
    idle_s: Annotated[float, typer.Option("--idle-s", help="stop after this long with nothing new")] = 2.0,
    out: Annotated[Path | None, typer.Option("--out", help="JSON line per consumed message")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no line per message")] = False,
    sql_filter: Annotated[
        str | None,
        typer.Option("--filter", help="SQL92 over properties and TAGS, e.g. \"TAGS IN ('a') AND n > 3\""),
    ] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
) -> None:
    """Consume every queue of a topic as a group, committing offsets as it goes (with --filter, only the
    messages a SQL92 expression selects; the offsets pass the others). With --nameservers: this
    process is one member of the group and reads its share of every group's queues, rebalancing as members come
    and go (a new group starts at each queue's committed offset, or at 0)."""
    if nameservers:
        if sql_filter:
            fail("--filter is not supported with --nameservers yet")
        _consume_cluster(nameservers, topic, group, count, idle_s, out, quiet)
        return
    try:
        filtered = Consumer(
            addresses_of(dir, addresses, state_machine="broker"), group, sql_filter=sql_filter
        )
    except FilterSyntaxError as e:
        fail(str(e))
    sink = open(out, "a") if out else None  # noqa: SIM115 - closed in finally
    n = 0
    t0 = time.monotonic()
    try:
        with filtered as c, _progress() as bar:
            task = bar.add_task(f"consume {topic}", total=count or None, visible=count >= PROGRESS_FROM)
            try:
                for m in c.messages(topic, from_beginning=from_beginning, idle_s=idle_s, limit=count or None):
                    n += 1
                    bar.update(task, advance=1)
                    if sink is not None:
                        sink.write(json.dumps(consumed_record(m)) + "\n")
                    if not quiet:
                        text = m.body[:60].decode(errors="replace")
                        console.print(f"{m.queue_id}:{m.queue_offset} {m.msg_id} {m.tags or ''} {text}")
            except DLedgerError as e:
                fail(f"{type(e).__name__} after {n} messages: {e}")
    finally:
        if sink is not None:
            sink.close()
    dt = time.monotonic() - t0
    console.print(f"consumed {n} messages in {dt:.2f} s")


def _consume_cluster(
    nameservers: str, topic: str, group: str, count: int, idle_s: float, out: Path | None, quiet: bool
) -> None:
    from broker_adapter.cluster.client import ClusterConsumer

    sink = open(out, "a") if out else None  # noqa: SIM115 - closed in finally
    n = 0
    t0 = time.monotonic()
    try:
        with ClusterConsumer(_nameserver_list(nameservers), group, topic) as c:
            try:
                for q, m in c.messages(idle_s=idle_s, limit=count or None):
                    n += 1
                    if sink is not None:
                        sink.write(json.dumps({"group": q.group, **consumed_record(m)}) + "\n")
                    if not quiet:
                        text = m.body[:60].decode(errors="replace")
                        console.print(
                            f"{q.group}/{m.queue_id}:{m.queue_offset} {m.msg_id} {m.tags or ''} {text}"
                        )
            except DLedgerError as e:
                fail(f"{type(e).__name__} after {n} messages: {e}")
    finally:
        if sink is not None:
            sink.close()
    dt = time.monotonic() - t0
    console.print(f"consumed {n} messages in {dt:.2f} s")


def register(app: typer.Typer) -> None:
    from broker_adapter import admin_cli
    from broker_adapter.console.cli import console_cmd  # imports its web libraries only when it runs

    admin_cli.register(app, topic_app, consumer_group_app)
    app.add_typer(topic_app, name="topic")
    app.add_typer(consumer_group_app, name="consumer-group")
    app.command("produce")(produce)
    app.command("consume")(consume)
    app.command("console")(console_cmd)
