"""Settings for every test: small index files for every node the suite starts.

A node preallocates its index files whole (storage/index.py); at DLedger's 160 MiB a file, the hundreds of
nodes the suite creates wrote tens of gigabytes under /tmp at its peak. ``[storage] index_units_per_file``
(docs/storage.md) defaults to the environment variable DLEDGER_INDEX_UNITS_PER_FILE when a node's config does
not give it, so setting it here, once, at import (before any test starts a process) reaches every node: the
ones built in-process (``NodeConfig``), the ones ``dledger.group.create`` writes configs for, and the ones
``dledger group up`` / ``cluster up`` start in child processes, which inherit the environment. 65,536 units
make 2 MiB files; a test that needs another size sets it in the node's config, which wins.
"""

from __future__ import annotations

import os

from dledger.nodeconfig import INDEX_UNITS_ENV

TEST_INDEX_UNITS = 65_536  # 2 MiB index files
os.environ.setdefault(INDEX_UNITS_ENV, str(TEST_INDEX_UNITS))

# The modules that take longest, started first. pytest-xdist's ``--dist loadfile`` (make test) hands whole files
# to the two workers in collection order, so a long file collected late runs on its own at the end and sets the
# wall time; started first, the short files fill in around them. Figures: docs/benchmarks.md, Test suite time.
HEAVY_FIRST = (
    "tests/fuzz/test_grpc_surfaces_secure.py",
    "tests/fuzz/test_grpc_surfaces.py",
    "tests/chaos/test_runs.py",
    "tests/spark/test_standalone.py",
    "tests/property/test_raft_safety.py",
    "tests/spark/test_audit.py",
    "tests/broker/test_tour.py",
    "tests/cluster/test_cluster.py",
    "tests/broker/test_e2e.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(
        key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank))
    )  # stable: in-file order kept
