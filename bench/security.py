"""Benchmark: what do TLS and signed calls cost? A secure group against a plain one, in the same run.

Two real three-node broker groups (separate processes on 127.0.0.1, flush "sync", 1 KiB bodies): one plain, one
started with ``group up --secure`` (TLS on every port, peers proving their node id, every client call signed and
checked against the replicated permissions; docs/security.md). Alternating round by round, on each group:

- raw log appends: 64 asyncio tasks on one ``AsyncDLedgerClient`` (the admin, on the secure group);
- broker sends: 64 asyncio tasks on one ``AsyncProducer`` (a user allowed to publish to the topic).

It prints msg/s per round, medians and the ratios secure / plain (issue 17's target: at least 0.8x). On a loaded
machine compare the ratios, not the absolute figures.

    python -m bench.security [--seconds 3] [--rounds 3] [--callers 64] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.clients import BODY, _tasks
from broker_adapter.client import AsyncProducer, BrokerConnection
from dledger import group as grp
from dledger.client import AsyncDLedgerClient
from dledger.security.client import SecurityClient
from dledger.security.config import ClientSecurity

TOPIC = "bench-security"
QUEUES = 4
PUBLISHER = ("bench-publisher", "bench-publisher-secret")


async def _append(
    addresses: list[str], callers: int, seconds: float, security: ClientSecurity | None
) -> float:
    async with AsyncDLedgerClient(addresses, security=security) as c:
        return await _tasks(callers, seconds, lambda: c.append(BODY))


async def _send(addresses: list[str], callers: int, seconds: float, security: ClientSecurity | None) -> float:
    async with AsyncProducer(addresses, security=security) as p:
        return await _tasks(callers, seconds, lambda: p.send(TOPIC, BODY))


CASES: dict[str, Callable[..., Awaitable[float]]] = {"append": _append, "produce": _send}


def _prepare(g: grp.GroupSpec) -> tuple[ClientSecurity | None, ClientSecurity | None]:
    """The topic, and on the secure group a publisher: (admin's settings, the publisher's) or (None, None)."""
    admin = ClientSecurity.from_file(Path(g.security)) if g.security else None
    with BrokerConnection(g.addresses, security=admin) as c:
        c.create_topic(TOPIC, QUEUES)
    if admin is None:
        return None, None

    async def add() -> None:
        sc = SecurityClient(g.addresses, admin)
        try:
            await sc.call(
                "AddUser",
                {"access_key": PUBLISHER[0], "secret_key": PUBLISHER[1], "permissions": [f"publish:{TOPIC}"]},
            )
        finally:
            await sc.close()

    asyncio.run(add())
    return admin, ClientSecurity(admin.ca_file, *PUBLISHER)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every case, alternating")
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where the two groups live (default: a temporary dir)"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        d = args.dir or Path(tmp)
        groups: dict[str, grp.GroupSpec] = {}
        try:
            for mode in ("plain", "secure"):
                groups[mode], _ = grp.up(d / mode, 3, None, state_machine="broker", secure=mode == "secure")
            who = {mode: _prepare(g) for mode, g in groups.items()}
            print(f"two 3-node groups, flush sync, 1 KiB bodies, {args.callers} concurrent asyncio callers")
            figures: dict[tuple[str, str], list[float]] = {
                (case, mode): [] for case in CASES for mode in groups
            }

            async def measure() -> None:  # one event loop for every measurement
                for r in range(args.rounds):
                    for case, fn in CASES.items():
                        for mode, g in groups.items():
                            admin, publisher = who[mode]
                            sec = admin if case == "append" else publisher
                            rate = await fn(g.addresses, args.callers, args.seconds, sec)
                            figures[(case, mode)].append(rate)
                            print(f"round {r + 1}  {case:<8} {mode:<7} {rate:>9,.0f} msg/s", flush=True)

            asyncio.run(measure())
            print()
            for case in CASES:
                plain, secure = figures[(case, "plain")], figures[(case, "secure")]
                mp, ms = statistics.median(plain), statistics.median(secure)
                per_round = ", ".join(f"{s / p:.2f}" for s, p in zip(secure, plain, strict=True) if p)
                print(
                    f"{case:<8} plain median {mp:>9,.0f} msg/s, TLS + auth median {ms:>9,.0f} msg/s: "
                    f"{ms / mp:.2f}x  (per round {per_round})"
                )
        finally:
            for g in groups.values():
                grp.stop_group(g)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
