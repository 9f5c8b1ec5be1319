"""Administration commands of the ``dledger`` CLI (docs/broker.md, Administration): ``topic status|route|delete|
browse``, ``consumer-group list|describe|delete|reset``, ``message query``, ``dlq list|resend|export`` and
``broker config get|set``. Each talks to one group (``--dir`` or ``--addresses``) or, with ``--nameservers``,
to every group of a cluster that serves the topic (every live group when no topic is named), through
``broker_adapter.admin_client.BrokerAdmin``. ``--json`` prints one JSON document instead of a table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from broker_adapter.admin_client import BrokerAdmin, FoundMessage, epoch_ms
from broker_adapter.cli import NameServersOpt, _nameserver_list
from dledger.cliutil import AddressesOpt, DirOpt, addresses_of, console, fail
from dledger.errors import DLedgerError

T = TypeVar("T")
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]
TopicOpt = Annotated[str, typer.Option("--topic", help="topic name")]
GroupOpt = Annotated[str, typer.Option("--group", help="consumer group")]

message_app = typer.Typer(no_args_is_help=True, help="Find messages by key, message id or store time.")
dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters (%DLQ%<group>): list, resend, export.")
broker_app = typer.Typer(no_args_is_help=True, help="The broker's run-time settings.")
config_app = typer.Typer(no_args_is_help=True, help="Run-time settings, replicated through the log.")
broker_app.add_typer(config_app, name="config")


@contextmanager
def _failing() -> Iterator[None]:
    try:
        yield
    except DLedgerError as e:
        fail(f"{type(e).__name__}: {e}")


def _targets(
    dir: Path | None, addresses: str | None, nameservers: str | None, topic: str = ""
) -> list[tuple[str, list[str]]]:
    """(group name, addresses) of the groups a command talks to: one, or each the name servers route to."""
    if not nameservers:
        return [("", addresses_of(dir, addresses, state_machine="broker"))]
    from broker_adapter.nameserver.client import NameServerClient

    with _failing(), NameServerClient(_nameserver_list(nameservers)) as ns:
        return [(r.group, list(r.addresses)) for r in ns.route(topic)]


def _each(targets: list[tuple[str, list[str]]], op: Callable[[BrokerAdmin], T]) -> list[tuple[str, T]]:
    out = []
    with _failing():
        for group, addrs in targets:
            with BrokerAdmin(addrs) as admin:
                out.append((group, op(admin)))
    return out


def _table(columns: list[str], rows: list[list[Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps([dict(zip(columns, r, strict=True)) for r in rows]))
        return
    t = Table()
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    console.print(t)


def _ms(text: str, what: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC when it names no zone)."""
    try:
        return epoch_ms(text)
    except ValueError as e:
        fail(f"{what}: {e}", 2)


def _print_messages(found: list[FoundMessage], as_json: bool, group: str = "") -> None:
    if as_json:
        print(json.dumps([{**({"group": group} if group else {}), **m.to_json()} for m in found]))
        return
    for m in found:
        when = datetime.fromtimestamp(m.store_ms / 1000, UTC).isoformat(timespec="milliseconds")
        text = m.body[:60].decode(errors="replace")
        prefix = f"{group}/" if group else ""
        console.print(
            f"{prefix}{m.topic}/{m.queue_id}:{m.queue_offset} {m.msg_id} keys={','.join(m.keys)} "
            f"tags={m.tags} stored={when} {text}",
            markup=False,
        )


# -- topics ----------------------------------------------------------------------------------------------------
def topic_status(
    topic: TopicOpt,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Each queue's min offset (the first its log holds), max offset (its end) and last store time."""
    rows = []
    for group, queues in _each(_targets(dir, addresses, nameservers, topic), lambda a: a.topic_status(topic)):
        for q in queues:
            when = datetime.fromtimestamp(q.last_store_ms / 1000, UTC).isoformat() if q.last_store_ms else ""
            rows.append([group, q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset, when])
    _table(["group", "queue", "min_offset", "max_offset", "messages", "last_stored"], rows, as_json)


def topic_route(
    topic: TopicOpt,
    nameservers: NameServersOpt = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where the topic lives: each group's leader, nodes and queues (the name servers' route with
    --nameservers; the group's own leader and queue count otherwise)."""
    if nameservers:
        from broker_adapter.nameserver.client import NameServerClient

        with _failing(), NameServerClient(_nameserver_list(nameservers)) as ns:
            routes = ns.route(topic)
        rows = [[r.group, r.leader_address, ",".join(r.addresses), r.queues] for r in routes]
    else:
        addrs = addresses_of(dir, addresses, state_machine="broker")
        with _failing(), BrokerAdmin(addrs) as a:
            queues = len(a.topic_status(topic))
            route = a.route()
        rows = [["", route.leader_address, ",".join(addrs), queues]]
    _table(["group", "leader", "nodes", "queues"], rows, as_json)


def topic_delete(
    topic: TopicOpt,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
) -> None:
    """Delete a topic: its queues and the groups' offsets on it go; its messages stay in the log until retention;
    sends to it are refused until it is created again (docs/broker.md, Administration)."""
    for group, n in _each(_targets(dir, addresses, nameservers, topic), lambda a: a.delete_topic(topic)):
        console.print(f"{group + ': ' if group else ''}deleted topic {topic} ({n} queues)")


def topic_browse(
    topic: TopicOpt,
    queue: Annotated[int, typer.Option("--queue", help="queue id")] = 0,
    offset: Annotated[int, typer.Option("--offset", help="first queue offset")] = 0,
    count: Annotated[int, typer.Option("--count", help="messages at most")] = 32,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Read a queue from an offset without committing anything (``consume`` commits the group's offsets)."""
    with _failing(), BrokerAdmin(addresses_of(dir, addresses, state_machine="broker")) as a:
        found = a.browse(topic, queue, offset, count)
    _print_messages(found, as_json)


# -- consumer groups -------------------------------------------------------------------------------------------
def _members(targets: list[tuple[str, list[str]]], nameservers: str | None, group: str) -> list[str]:
    """A cluster's members from the name servers; a group's RocketMQ 5 consumers from its leader."""
    if not nameservers:
        return [m for _, ms in _each(targets, lambda a: a.group_members(group)) for m in ms]
    from broker_adapter.nameserver.client import NameServerClient

    with _failing(), NameServerClient(_nameserver_list(nameservers)) as ns:
        return ns.consumers(group)


def group_list(
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every consumer group with state (committed offsets, pop state or settings), its topics and total lag."""
    rows = [
        [group, g.group, ",".join(g.topics), g.lag, g.has_settings]
        for group, groups in _each(_targets(dir, addresses, nameservers), lambda a: a.list_groups())
        for g in groups
    ]
    _table(["broker_group", "consumer_group", "topics", "lag", "settings"], rows, as_json)


def group_describe(
    group: GroupOpt,
    topic: Annotated[str | None, typer.Option("--topic", help="every queue of this topic")] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per queue: committed offset, max offset, lag, in flight; members: a cluster's from the name servers
    (its consumers heartbeat there), a group's consumers that pull from or heartbeat to its leader."""
    targets = _targets(dir, addresses, nameservers, topic or "")
    described = _each(targets, lambda a: a.describe_group(group, topic))
    rows = [
        [g, q.topic, q.queue_id, q.committed, q.max_offset, q.lag, q.in_flight]
        for g, queues in described
        for q in queues
    ]
    members = _members(targets, nameservers, group)
    if as_json:
        cols = ["broker_group", "topic", "queue", "committed", "max_offset", "lag", "in_flight"]
        queues = [dict(zip(cols, r, strict=True)) for r in rows]
        print(json.dumps({"group": group, "members": members, "queues": queues}))
        return
    console.print(f"consumer group {group}: members {', '.join(members) or 'none known'}")
    _table(["broker_group", "topic", "queue", "committed", "max_offset", "lag", "in_flight"], rows, False)


def group_delete(
    group: GroupOpt, dir: DirOpt = None, addresses: AddressesOpt = None, nameservers: NameServersOpt = None
) -> None:
    """Delete a consumer group: its committed offsets, pop state and delivery settings (through the log)."""
    for g, _ in _each(_targets(dir, addresses, nameservers), lambda a: a.delete_group(group)):
        console.print(f"{g + ': ' if g else ''}deleted consumer group {group}")


def group_reset(
    group: GroupOpt,
    topic: TopicOpt,
    to: Annotated[str, typer.Option("--to", help="earliest, latest, offset or time")],
    offset: Annotated[int | None, typer.Option("--offset", help="--to offset: the offset")] = None,
    at: Annotated[
        str | None, typer.Option("--time", help="--to time: ms since the epoch or ISO 8601 (UTC if no zone)")
    ] = None,
    queue: Annotated[int | None, typer.Option("--queue", help="one queue (default: every queue)")] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set the group's offsets: to the first held message, the end, an offset, or the first message stored at
    or after a time (through the log: every node agrees; a consumer running meanwhile should be stopped)."""
    if to == "offset" and offset is None:
        fail("--to offset needs --offset N", 2)
    if to == "time" and at is None:
        fail("--to time needs --time T (ms since the epoch or ISO 8601)", 2)
    value = offset if to == "offset" else _ms(at, "--time") if to == "time" else 0
    done = _each(
        _targets(dir, addresses, nameservers, topic),
        lambda a: a.reset_offsets(group, topic, to, value or 0, queue),
    )
    _table(
        ["broker_group", "queue", "old", "new"],
        [[g, r.queue_id, r.old, r.new] for g, rs in done for r in rs],
        as_json,
    )


# -- messages --------------------------------------------------------------------------------------------------
def message_query(
    key: Annotated[str | None, typer.Option("--key", help="messages with this key")] = None,
    msg_id: Annotated[str | None, typer.Option("--id", help="the message with this id")] = None,
    topic: Annotated[str, typer.Option("--topic", help="only this topic (required with --from/--to)")] = "",
    start: Annotated[str | None, typer.Option("--from", help="stored at or after (ms or ISO 8601)")] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="stored before (ms or ISO 8601; default: now)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="messages at most (per group)")] = 32,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    nameservers: NameServersOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Find messages by key or id (through each node's key index, no log scan) or by store time; commits
    nothing."""
    if sum(x is not None for x in (key, msg_id, start)) != 1:
        fail("give one of --key K, --id ID or --from T [--to T] --topic TOPIC", 2)
    if start is not None and not topic:
        fail("a query by time needs --topic", 2)

    def query(a: BrokerAdmin) -> list[FoundMessage]:
        if key is not None:
            return a.query_by_key(key, topic, limit)
        if msg_id is not None:
            return a.query_by_id(msg_id, topic, limit)
        now = int(datetime.now(UTC).timestamp() * 1000) + 1
        return a.query_by_time(topic, _ms(start or "0", "--from"), _ms(end, "--to") if end else now, limit)

    results = _each(_targets(dir, addresses, nameservers, topic), query)
    if as_json:
        print(
            json.dumps([{"group": g, **m.to_json()} if g else m.to_json() for g, ms in results for m in ms])
        )
        return
    for g, ms in results:
        _print_messages(ms, False, g)
    if not any(ms for _, ms in results):
        console.print("no message found")


# -- dead letters ----------------------------------------------------------------------------------------------
@dlq_app.command("list")
def dlq_list(
    group: Annotated[
        str | None, typer.Option("--group", help="this group's dead letters, one by one")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="messages at most")] = 100,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Consumer groups with dead letters and how many; with --group, the dead letters themselves."""
    with _failing(), BrokerAdmin(addresses_of(dir, addresses, state_machine="broker")) as a:
        if group is None:
            _table(["group", "dead_letters"], [list(r) for r in a.dead_letter_groups()], as_json)
            return
        _print_messages(list(a.dead_letters(group, limit)), as_json)


@dlq_app.command("resend")
def dlq_resend(
    group: GroupOpt,
    queue: Annotated[int, typer.Option("--queue", help="queue of %DLQ%<group>")] = 0,
    offset: Annotated[
        int | None, typer.Option("--offset", help="the dead letter's offset (default: all)")
    ] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Send dead letters back to their original topic as new messages (new ids; body, tags, keys and user
    properties kept); the dead letters stay where they are."""
    with _failing(), BrokerAdmin(addresses_of(dir, addresses, state_machine="broker")) as a:
        picked = (
            [(queue, offset)]
            if offset is not None
            else [(m.queue_id, m.queue_offset) for m in a.dead_letters(group, 1_000_000)]
        )
        for q, o in picked:
            r = a.resend(group, q, o)
            console.print(
                f"%DLQ%{group}/{q}:{o} -> {r.topic}/{r.queue_id}:{r.queue_offset} msg_id {r.msg_id}"
            )


@dlq_app.command("export")
def dlq_export(
    group: GroupOpt,
    out: Annotated[Path, typer.Option("--out", help="JSON line per dead letter")],
    limit: Annotated[int, typer.Option("--limit", help="messages at most")] = 1_000_000,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Write the group's dead letters as JSON lines (commits nothing)."""
    n = 0
    with (
        _failing(),
        BrokerAdmin(addresses_of(dir, addresses, state_machine="broker")) as a,
        open(out, "w") as f,
    ):
        for m in a.dead_letters(group, limit):
            f.write(json.dumps(m.to_json()) + "\n")
            n += 1
    console.print(f"exported {n} dead letters of {group} to {out}")


# -- run-time settings -----------------------------------------------------------------------------------------
@config_app.command("get")
def config_get(dir: DirOpt = None, addresses: AddressesOpt = None, as_json: JsonOpt = False) -> None:
    """The run-time settings in force and where each comes from (the log, or the node config)."""
    with _failing(), BrokerAdmin(addresses_of(dir, addresses, state_machine="broker")) as a:
        shown = a.get_config()
    _table(["key", "value", "source"], [[k, v["value"], v["source"]] for k, v in shown.items()], as_json)


@config_app.command("set")
def config_set(
    values: Annotated[
        list[str],
        typer.Argument(
            help="key=value ... (retention_hours, retention_bytes, disk_max_used_percent, max_delay_ms)"
        ),
    ],
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change settings on every node of the group through the log, without a restart."""
    pairs = {}
    for v in values:
        k, sep, val = v.partition("=")
        if not sep or not k:
            fail(f"settings are key=value, got {v!r}", 2)
        pairs[k.strip()] = val.strip()
    with _failing(), BrokerAdmin(addresses_of(dir, addresses, state_machine="broker")) as a:
        shown = a.set_config(**pairs)
    _table(["key", "value", "source"], [[k, v["value"], v["source"]] for k, v in shown.items()], as_json)


def register(app: typer.Typer, topic_app: typer.Typer, group_app: typer.Typer) -> None:
    topic_app.command("status")(topic_status)
    topic_app.command("route")(topic_route)
    topic_app.command("delete")(topic_delete)
    topic_app.command("browse")(topic_browse)
    group_app.command("list")(group_list)
    group_app.command("describe")(group_describe)
    group_app.command("delete")(group_delete)
    group_app.command("reset")(group_reset)
    message_app.command("query")(message_query)
    app.add_typer(message_app, name="message")
    app.add_typer(dlq_app, name="dlq")
    app.add_typer(broker_app, name="broker")
