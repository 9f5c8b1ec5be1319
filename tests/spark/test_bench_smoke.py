"""``make bench-spark``'s benchmark (``bench/spark_source.py``) in its smoke size: it runs to the end on a real group
and real Spark, the Spark read returns what the consumer read (the benchmark checks count and body bytes and exits
non-zero otherwise), and it prints both rates with their ratio and the stream's latency percentiles. Slow and
extra: the figures themselves are for docs/spark.md, not asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_spark_benchmark_runs_in_its_quick_size():
    done = subprocess.run(
        [sys.executable, "-m", "bench.spark_source", "--quick"],  # 50,000 messages; 5 s at 200 msg/s
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"run 0: consumer 50,000 in .* msg/s", out), out
    assert re.search(r"run 0: spark +50,000 in .* msg/s", out), out
    assert re.search(r"ratio spark/consumer \d+\.\d\d", out), out
    assert re.search(r"Python reader stages .*pull [\d.]+, columns [\d.]+, per-message path [\d.]+", out), out
    assert re.search(r"streaming latency.*: 1,000 messages .* p50 \d+ ms, p99 \d+ ms", out), out
