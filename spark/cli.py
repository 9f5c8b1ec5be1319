"""``dledger audit``: the audit's command, registered into the ``dledger`` CLI by ``dledger.cli``.

The options are parsed by ``spark.audit.parser`` (the same as ``spark-submit spark/audit_job.py``), so this
command forwards its arguments untouched, ``--help`` included. PySpark is imported only when the command runs,
so the rest of the CLI starts fast.
"""

from __future__ import annotations

import typer

_FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def audit(ctx: typer.Context) -> None:
    """Replay every node's files in Spark and prove that the group agrees (read-only).

    dledger audit DIR... [--master URL] [--ack-log FILE] [--report DIR]; exit 0 pass, 1 violations,
    2 unusable input. `dledger audit --help` lists the options.
    """
    from spark.audit import main

    raise typer.Exit(main(list(ctx.args)))


def register(app: typer.Typer) -> None:
    app.command("audit", context_settings=_FORWARD)(audit)
