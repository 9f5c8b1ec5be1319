"""What every ``dledger`` command shares: the consoles, the error exit and the ``--dir``/``--addresses`` pair.

Public so that the commands of other layers (the KV store, the broker, chaos) answer and fail the same way
without reaching into ``dledger.cli``'s private helpers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from dledger import group as grp

# A pipe or a log file gets a wide table rather than rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True, soft_wrap=True)  # error lines stay whole (scripts grep them)

DirOpt = Annotated[Path | None, typer.Option("--dir", help="a local group directory")]
AddressesOpt = Annotated[str | None, typer.Option("--addresses", help="node addresses, comma separated")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def addresses_of(dir: Path | None, addresses: str | None, state_machine: str | None = None) -> list[str]:
    """The group's node addresses: ``--addresses`` as given, else those of the local group in ``--dir``."""
    if addresses:
        return [a.strip() for a in addresses.split(",") if a.strip()]
    if dir is not None:
        g = grp.load(dir, missing_ok=True)
        if g is None:
            hint = f" --state-machine {state_machine}" if state_machine else ""
            fail(f"no group in {dir} (start one with: dledger group up --dir {dir}{hint})", 2)
        if g.security and not (os.environ.get("DLEDGER_SECURITY") or os.environ.get("DLEDGER_CA_FILE")):
            # A secure local group: its commands use the group's CA and bootstrap admin (docs/security.md).
            os.environ["DLEDGER_SECURITY"] = g.security
        return g.addresses
    fail("give --dir (a local group) or --addresses host:port,...", 2)
