"""``bench.jetstream`` runs end to end, so it cannot rot between full runs.

A tiny in-process run of ``python -m bench.jetstream --quick``: our broker group with both flush policies
always (every workload, including a real SIGKILL of the leader), and NATS JetStream as well when Debian's
``nats-server`` and ``nats-py`` are both installed here - the test prints which. It never apt-get installs
(CI runs without the ``bench`` extra). No process may survive the run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import time
from pathlib import Path

import pytest

from bench.jetstream import WORKLOADS, Row, main, summarize, table
from bench.jetstream_load import Plan, run
from bench.jetstream_nats import find_nats_server
from tests.bench.test_compare_smoke import _children_of


def _nats_available() -> tuple[bool, str]:
    binary, note = find_nats_server(install=False)
    if binary is None:
        return False, note
    if importlib.util.find_spec("nats") is None:
        return False, "nats-py is not installed (pip install '.[bench]'); NATS is skipped"
    return True, note


@pytest.mark.slow  # a whole benchmark run (make soak): keeps make test under 10 minutes
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_jetstream_bench_runs_end_to_end(tmp_path: Path, capsys) -> None:
    with_nats, why = _nats_available()
    systems = ["ours-sync", "ours-async", *(["nats"] if with_nats else [])]
    before = _children_of(os.getpid())
    argv = ["--quick", "--seconds", "0.5", "--warmup", "0.2", "--systems", ",".join(systems)]
    argv += ["--no-install", "--out", str(tmp_path)]  # every client kind the code has
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert _children_of(os.getpid()) <= before, "the harness left a process running"

    [js] = tmp_path.glob("jetstream-*.json")
    doc = json.loads(js.read_text())
    contenders = doc["meta"]["contenders"]
    assert [c for c in contenders if "/" not in c] == systems and doc["meta"]["commit"]
    rows = {(s["contender"], s["workload"]): s for s in doc["summary"]}
    for system in systems:
        for w in WORKLOADS:
            s = rows[(system, w)]
            assert s["median"] is not None and s["errors"] == 0, f"{system} {w}: {s}"
            # A 256-message call can outlast a 0.5 s window on a loaded machine (it then counts nothing);
            # single-message workloads always complete some calls in it.
            if w != "batched":
                assert s["median"] > 0, f"{system} {w}: {s}"
        assert rows[(system, "sequential")]["p50_ms"] > 0
    for c in contenders:  # every client kind of every system
        for w in ("sequential", "concurrent-64"):
            assert rows[(c, w)]["median"] > 0 and rows[(c, w)]["errors"] == 0, rows[(c, w)]
    md = js.with_suffix(".md").read_text()
    assert "| sequential (msg/s) |" in md and "Durability:" in md and doc["meta"]["commit"] in md
    if with_nats:
        assert "ours-sync / nats" in md
        assert rows[("ours-async", "sequential")]["ratio_to_nats"] > 0
        # A batched window may count nothing for NATS on a loaded machine (see above): the ratio is then
        # reported as missing (None, blank in the table), never as a number made up from a zero.
        ours, ref = rows[("ours-async", "batched")], rows[("nats", "batched")]["median"]
        if ref > 0:
            assert ours["ratio_to_nats"] == pytest.approx(ours["median"] / ref), ours
        else:
            assert ours["ratio_to_nats"] is None, ours
    with capsys.disabled():
        ran = ", ".join(contenders)
        print(f"\nbench.jetstream smoke: ran {ran}" + ("" if with_nats else f" only ({why})"))
    assert "written:" in out


def _row(c: str, w: str, value: float, rnd: int = 0) -> Row:
    return Row(c, w, rnd, value, 1.0, 2.0, 10, 0)


def test_summary_gives_medians_ranges_and_ratios_to_nats() -> None:
    rows = [
        _row("ours-sync", "sequential", 100, 0),
        _row("ours-sync", "sequential", 300, 1),
        _row("ours-sync", "sequential", 200, 2),
        _row("nats", "sequential", 400, 0),
        _row("nats", "sequential", 400, 1),
        _row("ours-sync", "leader-kill", 500),
        _row("nats", "leader-kill", 4000),
        Row("ours-sync", "leader-kill", 1, math.nan, math.nan, math.nan, 0, 1, "TimeoutError()"),
    ]
    s = {(x["contender"], x["workload"]): x for x in summarize(rows, ["ours-sync", "nats"])}
    seq = s[("ours-sync", "sequential")]
    assert (seq["median"], seq["min"], seq["max"], seq["rounds"]) == (200, 100, 300, 3)
    assert seq["ratio_to_nats"] == 0.5 and math.isnan(s[("nats", "sequential")]["ratio_to_nats"])
    kill = s[("ours-sync", "leader-kill")]
    assert (kill["median"], kill["errors"], kill["ratio_to_nats"]) == (500, 1, 0.125)
    text = table(list(s.values()), ["ours-sync", "nats"])
    assert "| sequential (msg/s) | 200 (100-300), p50 1.00 / p99 2.00 ms | 400 (400-400)" in text
    assert (
        "| leader-kill (ms, lower is better) | 500 (500-500), 1 errors | 4,000 (4,000-4,000) | 0.12x |"
        in text
    )


class _Sleepy:
    """A client that acknowledges after 2 ms, and fails every fifth call."""

    description = "test double"

    def __init__(self, mode: str):
        self.mode = mode
        self.calls = 0
        self.closed = False

    def _step(self) -> None:
        self.calls += 1
        if self.calls % 5 == 0:
            raise RuntimeError("refused")

    def connect(self, workers: int) -> None:
        self.workers = workers

    def send(self, worker: int, n: int) -> int:
        time.sleep(0.002)
        self._step()
        return n

    def close(self) -> None:
        self.closed = True


class _AsyncSleepy(_Sleepy):
    async def connect(self, workers: int) -> None:
        self.workers = workers

    async def send(self, worker: int, n: int) -> int:
        await asyncio.sleep(0.002)
        self._step()
        return n

    async def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("client", [_Sleepy("threads"), _AsyncSleepy("async")], ids=["threads", "async"])
def test_load_loop_counts_acknowledged_calls_in_the_window_and_errors(client) -> None:
    m = run(client, Plan("x", 4, 8), seconds=0.3, warmup_s=0.1)
    assert client.workers == 4 and client.closed
    assert m.messages > 0 and m.messages == 8 * len(m.latencies_s)
    assert m.errors > 0 and "refused" in m.first_error
    assert min(m.latencies_s) >= 0.002 and m.seconds == 0.3
    assert m.rate == m.messages / 0.3
    assert m.latency_ms(0.5) <= m.latency_ms(0.99)
