"""``dledger member list|add|promote|remove`` and ``dledger group replace-node``: membership changes of a local
group (docs/membership.md). The work is in ``dledger.group``; this module only parses and prints.

    dledger member list --dir D                  the configuration the leader uses: voters, learners, entry index
    dledger member add --dir D [--id n3]         start a new node (new dir, new port) and add it as a learner
    dledger member promote --dir D n3            make a caught-up learner a voter
    dledger member remove --dir D n1             remove a member (the leader hands over first if it is the one)
    dledger group replace-node --dir D n1        all of it for a dead node: add, catch up, promote, remove
    dledger group recover --dir D --from n0      a majority lost for good: n0 alone, with its log, then add
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dledger import group as grp
from dledger import group_members as members
from dledger.cliutil import console, fail
from dledger.errors import DLedgerError

member_app = typer.Typer(no_args_is_help=True, help="Change the members of a local group, one at a time.")

DirOption = Annotated[Path, typer.Option("--dir", help="the group directory (holds group.json)")]
NodeArg = Annotated[str, typer.Argument(help="the node id (as in `dledger group status`)")]


@member_app.command("list")
def member_list(
    dir: DirOption, as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False
) -> None:
    """The configuration in effect on the leader, and every node of the directory with its membership."""
    try:
        g = grp.load(dir)
    except DLedgerError as e:
        fail(str(e))
    lead = grp.configuration(g)
    rows = grp.status(g)
    if lead is None:
        fail("no leader answers: the configuration is what a leader says it is; retry once one is elected")
    if as_json:
        doc = {
            "leader": lead.node_id,
            "term": lead.term,
            "voters": list(lead.voters),
            "learners": list(lead.learners),
            "conf_index": lead.conf_index,
            "nodes": [r.to_json() for r in rows],
        }
        print(json.dumps(doc))
        return
    console.print(
        f"leader [green]{lead.node_id}[/green] at term {lead.term}: voters [bold]{', '.join(lead.voters)}[/bold]"
        + (f", learners [bold]{', '.join(lead.learners)}[/bold]" if lead.learners else "")
        + (f" (config entry {lead.conf_index})" if lead.conf_index >= 0 else " (the initial members)")
    )
    t = Table()
    for col in ("node", "member", "role", "address", "commit index"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r.id, r.member or "-", r.role, r.address, "" if r.commit_index is None else str(r.commit_index)
        )
    console.print(t)


@member_app.command("add")
def member_add(
    dir: DirOption,
    node_id: Annotated[
        str | None, typer.Option("--id", help="the new node's id (default: the next free nK)")
    ] = None,
    port: Annotated[int | None, typer.Option(help="its port on 127.0.0.1 (default: a free one)")] = None,
    promote: Annotated[bool, typer.Option(help="promote it to a voter once it has caught up")] = False,
) -> None:
    """Start a new node on a new directory and port and add it as a learner (it catches up from the leader)."""
    try:
        spec = members.add_member(dir, node_id, port)
        console.print(f"added learner [bold]{spec.id}[/bold] at {spec.address} ({spec.data_dir})")
        if promote:
            members.promote_member(dir, spec.id)
            console.print(f"promoted [bold]{spec.id}[/bold] to voter")
    except DLedgerError as e:
        fail(str(e))


@member_app.command("promote")
def member_promote(dir: DirOption, node: NodeArg) -> None:
    """Make learner NODE a voter once it holds everything committed."""
    try:
        members.promote_member(dir, node)
    except DLedgerError as e:
        fail(str(e))
    console.print(f"promoted [bold]{node}[/bold] to voter")


@member_app.command("remove")
def member_remove(
    dir: DirOption,
    node: NodeArg,
    keep_running: Annotated[bool, typer.Option(help="leave its process running (default: stop it)")] = False,
) -> None:
    """Remove NODE from the group (a leader hands leadership over first), stop it, drop it from group.json."""
    try:
        members.remove_member(dir, node, stop=not keep_running)
    except DLedgerError as e:
        fail(str(e))
    console.print(f"removed [bold]{node}[/bold]; its directory stays on disk")


def replace_node(
    dir: DirOption,
    node: NodeArg,
    port: Annotated[int | None, typer.Option(help="the new node's port (default: a free one)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the new node to catch up")] = 120.0,
) -> None:
    """Replace dead node NODE: a new node on a new dir and port joins as a learner, catches up (snapshot + log),
    is promoted, and NODE is removed. The group keeps serving throughout."""
    try:
        r = members.replace_node(dir, node, port, timeout)
    except DLedgerError as e:
        fail(str(e))
    console.print(
        f"replaced [red]{r.dead}[/red] by [green]{r.new}[/green] at {r.address}: caught up to index "
        f"{r.caught_up_index}, promoted, {r.dead} removed, in {r.seconds:.1f} s"
    )


def recover(
    dir: DirOption,
    from_node: Annotated[str, typer.Option("--from", help="the surviving node whose log the group keeps")],
    start: Annotated[bool, typer.Option(help="start the survivor once recovered")] = True,
) -> None:
    """When a majority of the group is gone for good: make FROM a one-node group with its whole log and
    configuration, ready for `member add`. Only what FROM never received is lost (docs/membership.md)."""
    try:
        r = members.recover_group(dir, from_node, start)
        if start:
            leader = grp.wait_for_leader(grp.load(dir))
            console.print(f"{r.describe()}\n{leader.id} leads the group again at {leader.address}")
        else:
            console.print(r.describe())
    except DLedgerError as e:
        fail(str(e))


def register(app: typer.Typer, group_app: typer.Typer) -> None:
    """Add ``member ...`` to ``app`` and ``replace-node`` to ``group_app`` (called by ``dledger.cli``)."""
    app.add_typer(member_app, name="member")
    group_app.command("replace-node")(replace_node)
    group_app.command("recover")(recover)
