"""Benchmarks (docs/benchmarks.md). The groups a benchmark starts run in sessions of their own; they stop when the
benchmark's process is gone, however it ended (Ctrl-C, a timeout, kill -9), instead of running on unowned on a
shared machine (``DLEDGER_OWNER_PID``, dledger/owner.py). A caller that set the variable keeps its own."""

import os

from dledger.owner import OWNER_ENV

os.environ.setdefault(OWNER_ENV, str(os.getpid()))
