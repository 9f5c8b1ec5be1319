"""``dledger kv put|get|delete|cas``: the key-value store of a group started with ``--state-machine kv``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dledger.cliutil import AddressesOpt, DirOpt, addresses_of, fail
from dledger.errors import DLedgerError
from dledger.transport.grpc import run_sync

kv_app = typer.Typer(help="Key-value store of a group running state_machine = kv.", no_args_is_help=True)


def _run(dir: Path | None, addresses: str | None, op):
    from dledger.kv.client import AsyncKVClient

    async def go():
        async with AsyncKVClient(addresses_of(dir, addresses, state_machine="kv")) as kv:
            return await op(kv)

    try:
        return run_sync(go())
    except DLedgerError as e:
        fail(f"{type(e).__name__}: {e}")


def _show(value: bytes | None) -> str:
    return "(absent)" if value is None else value.decode(errors="backslashreplace")


@kv_app.command()
def put(key: str, value: str, dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """Set KEY to VALUE (replicated; prints the log index and the previous value)."""
    w = _run(dir, addresses, lambda kv: kv.put(key.encode(), value.encode()))
    typer.echo(f"index {w.index} previous {_show(w.previous)}")


@kv_app.command()
def get(
    key: str,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
    serializable: Annotated[bool, typer.Option(help="read any node's applied state (may be stale)")] = False,
) -> None:
    """Print KEY's value (linearizable unless --serializable)."""
    r = _run(dir, addresses, lambda kv: kv.get(key.encode(), linearizable=not serializable))
    typer.echo(_show(r.value))


@kv_app.command()
def delete(key: str, dir: DirOpt = None, addresses: AddressesOpt = None) -> None:
    """Delete KEY."""
    w = _run(dir, addresses, lambda kv: kv.delete(key.encode()))
    typer.echo(f"index {w.index} existed {w.existed}")


@kv_app.command()
def cas(
    key: str,
    value: str,
    expected: Annotated[
        str | None, typer.Option(help="swap only if KEY holds this (omit: only if absent)")
    ] = None,
    dir: DirOpt = None,
    addresses: AddressesOpt = None,
) -> None:
    """Compare-and-swap: set KEY to VALUE if it holds --expected (or is absent)."""
    exp = expected.encode() if expected is not None else None
    w = _run(dir, addresses, lambda kv: kv.compare_and_swap(key.encode(), exp, value.encode()))
    typer.echo(f"index {w.index} swapped {w.swapped} current {_show(w.current)}")
    if not w.swapped:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(kv_app, name="kv")
