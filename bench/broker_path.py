"""Benchmark: the CPU each process spends on the broker's own Python work per message, in one process, without
gRPC or a node (issue 27; docs/send-budget.md, "The broker's own work").

A producer session's message goes through five broker steps that a raw log append does not: the client encodes
it in its stored form (``Numbering._stored``), the leader checks the bytes it did not encode
(``formats.check_stored``) and places them (``QueueOffsetAllocator.prepare_entry``: queue offset, position,
store time), and every node dispatches it when applied (``BrokerStateMachine.apply``: ConsumeQueue unit, producer
table, key index; the leader from the route it placed, a follower from the bytes). Each step runs here on the
same ``--messages`` 1 KiB messages and is timed with ``time.process_time`` (CPU of this process, so another
process's load moves it far less than wall time), best of ``--rounds``. ``total`` is what one message costs the
whole group: client + check + place + leader apply + 2 x follower apply.

Compare two revisions by running each tree's copy, e.g. ``git worktree add /tmp/base <rev>`` then
``PYTHONPATH=/tmp/base PYTHONSAFEPATH=1 python -m bench.broker_path`` beside ``python -m bench.broker_path``.

    python -m bench.broker_path [--messages 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from broker_adapter.core import formats
from broker_adapter.core.allocator import QueueOffsetAllocator
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.producing import Numbering
from statemachine.api import CommittedEntry

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "bench-path"
QUEUES = 4
APPLY_CHUNK = 256  # entries per apply call, as the apply loop hands them over under load


def _best(rounds: int, n: int, run: Callable[[], float]) -> float:
    """Microseconds of CPU per message: the best of ``rounds`` runs of ``run`` (which returns CPU seconds)."""
    return min(run() for _ in range(rounds)) * 1e6 / n


def _timed(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def measure(n: int, rounds: int, root: Path) -> dict[str, float]:
    producer = Numbering(None)
    out = {"client encode": _best(rounds, n, lambda: _timed(lambda: [_encode(producer) for _ in range(n)]))}
    raws = [_encode(producer) for _ in range(n)]
    out["leader check"] = _best(rounds, n, lambda: _timed(lambda: [formats.check_stored(r) for r in raws]))
    routes = [formats.check_stored(r) for r in raws]
    made = iter(range(1 << 30))

    def leader() -> tuple[BrokerStateMachine, list[CommittedEntry], float]:
        """A fresh leader's dispatcher with the messages placed: it, the entries, the CPU the placing took."""
        k = next(made)
        sm = BrokerStateMachine(root / f"leader{k}", index_dir=root / f"leader-index{k}")
        sm.topics[TOPIC] = QUEUES
        alloc = QueueOffsetAllocator(sm, lambda lo, hi: [], lambda: sm.applied_index)
        entries: list[CommittedEntry] = []
        pos = 0
        t = time.process_time()
        for i, (raw, route) in enumerate(zip(raws, routes, strict=True)):
            body, _ = alloc.prepare_entry(1, i, pos, raw, route)
            entries.append(CommittedEntry(i, 1, pos, body))
            pos += 48 + len(body)
        return sm, entries, time.process_time() - t

    def placing() -> float:
        sm, _, cpu = leader()
        sm.close()
        return cpu

    out["leader place"] = _best(rounds, n, placing)

    def applying(role: str) -> float:
        sm, entries, _ = leader()
        if role == "follower":  # a follower has no placed routes: it reads each message's bytes
            sm.close()
            k = next(made)
            sm = BrokerStateMachine(root / f"follower{k}", index_dir=root / f"follower-index{k}")
        cpu = _timed(lambda: [sm.apply(entries[i : i + APPLY_CHUNK]) for i in range(0, n, APPLY_CHUNK)])
        sm.close()
        return cpu

    out["leader apply"] = _best(rounds, n, lambda: applying("leader"))
    out["follower apply"] = _best(rounds, n, lambda: applying("follower"))
    out["total"] = sum(out.values()) + out["follower apply"]
    return out


def _encode(producer: Numbering) -> bytes:
    return producer._stored(TOPIC, QUEUES, BODY, None, None)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-broker-path-") as tmp:
        figures = measure(args.messages, args.rounds, Path(tmp))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, load {load}; {args.messages:,} messages of 1 KiB, best of "
        f"{args.rounds}; CPU us per message"
    )
    print("  ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
