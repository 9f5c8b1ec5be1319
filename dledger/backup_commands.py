"""``dledger backup`` and ``dledger restore`` (docs/operations.md): parsing and printing; the work is in
``dledger.backups``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dledger import group as grp
from dledger.cliutil import AddressesOpt, DirOpt, addresses_of, console, fail
from dledger.errors import DLedgerError


def backup(
    out: Annotated[Path, typer.Option("--out", help="a new folder for the backup")],
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    group: Annotated[str, typer.Option(help="the group's name (with --addresses)")] = "dledger",
) -> None:
    """An online, consistent backup of a running group: the leader takes a snapshot, then streams it and the
    committed log after it; writes go on meanwhile. Checked as it arrives, with a manifest of checksums."""
    from dledger.backups import take

    g = grp.load(dir, missing_ok=True) if dir is not None and not addresses else None
    security = grp.client_security(g.security).get("security") if g is not None else None
    try:
        b = take(addresses_of(dir, addresses), g.name if g is not None else group, out, security)
    except DLedgerError as e:
        fail(str(e))
    e = b.end
    snap = f"a snapshot at index {e.snapshot_index} and " if e.snapshot_index >= 0 else ""
    console.print(
        f"backup of group {e.group} in {b.path}: {snap}the log to index {e.index} (term {e.term}); "
        f"{sum(int(str(f['size'])) for f in b.files.values())} bytes, voters {', '.join(e.conf.voters)}"
    )


def restore(
    from_: Annotated[Path, typer.Option("--from", help="the backup folder (`dledger backup --out`)")],
    dir: Annotated[Path, typer.Option("--dir", help="a new group directory")],
    nodes: Annotated[int, typer.Option(help="nodes of the new group")] = 3,
    base_port: Annotated[int | None, typer.Option(help="first port (default: free ports)")] = None,
    flush: Annotated[str, typer.Option(help="sync or async")] = "sync",
    start: Annotated[bool, typer.Option(help="start the new group and wait for its leader")] = True,
) -> None:
    """Build a new local group from a backup (refused, naming the file, if the backup is damaged): every node
    holds the snapshot and the log, and a new configuration of the new nodes."""
    from dledger.backups import restore as restore_group

    try:
        g, b, index = restore_group(from_, dir, nodes, base_port, flush)
        console.print(
            f"restored group {g.name} to index {b.end.index} in {dir}: {len(g.nodes)} nodes "
            f"({', '.join(g.addresses)}), their configuration at index {index}"
        )
        if start:
            for spec in g.nodes:
                grp.start_node(spec)
            leader = grp.wait_for_leader(g)
            console.print(f"{leader.id} leads at {leader.address}")
    except DLedgerError as e:
        fail(str(e))


def register(app: typer.Typer) -> None:
    app.command("backup")(backup)
    app.command("restore")(restore)
