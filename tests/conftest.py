"""Settings for every test: small index files for every node the suite starts, quick Spark drivers.

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
from dledger.owner import OWNER_ENV

TEST_INDEX_UNITS = 65_536  # 2 MiB index files
os.environ.setdefault(INDEX_UNITS_ENV, str(TEST_INDEX_UNITS))

# Every ``dledger`` process a test starts (nodes and name servers run in sessions of their own, dledger/group.py)
# stops when this process is gone (dledger/owner.py): a run ended by its time limit, or an xdist worker ended by
# pytest-timeout, leaves none of them running on the machine. Each xdist worker names itself.
os.environ[OWNER_ENV] = str(os.getpid())

# Each xdist worker takes its nodes' ports from a range of its own (``dledger.ports.PORTS_ENV``, inherited by the
# processes it starts): tests kill nodes and start them again on the same port, and a port free for that moment
# was once taken by the other worker's next group (CI: a broker client reached a KV node, "Method not found").
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit():
    from dledger import ports as _ports

    _room = _ports.listen_room()  # the room free_ports walks, split between the workers
    _share = len(_room) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _k = int(_worker[2:])
    if _share >= 256:
        os.environ[_ports.PORTS_ENV] = f"{_room.start + _k * _share}-{_room.start + (_k + 1) * _share}"

# Every Spark driver a test starts (in-process sessions, ``dledger audit``, spark-submit) is a short-lived JVM
# over a few megabytes: its own start-up and the JIT's second tier are most of its time. Spark's launcher adds
# SPARK_SUBMIT_OPTS to the driver's command line (silently, unlike JAVA_TOOL_OPTIONS), so the suite's drivers
# stop at the quick first tier and use the serial collector: the Spark tests and the demo tour took 175 s
# against 215 with the JVM's defaults (docs/benchmarks.md, "Test suite time"). A production audit keeps them.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


# -- pytest-xdist: the longest files first ------------------------------------------------------------------------
# ``make test`` runs ``--dist loadfile``: a whole file on one worker. xdist hands out files by number of tests,
# most first, so the few files with one or two very long tests (a Spark audit, a chaos run) came last and one
# worker ran them alone while the other had finished. These files go first, longest first (seconds a run took
# on this 2-core machine under load, from ``--durations``/junit; rough is enough: only the order matters), the
# rest after them in xdist's own order; and a worker gets its next file only when it is about to start the
# last test of its current one, so a file is not held back behind another worker's long test.
LONG_FILES = {
    "tests/spark/test_audit.py": 185,
    "tests/cluster/test_cluster.py": 125,
    "tests/chaos/test_cluster.py": 50,
    "tests/integration/test_upgrade.py": 130,  # builds the previous release's venv (pip's cache makes it quick)
    "tests/security/test_rotation.py": 55,
    "tests/rocketmq/test_renewal.py": 35,
    "tests/spark/test_standalone.py": 98,
    "tests/chaos/test_runs.py": 63,
    "tests/rocketmq/test_delivery.py": 56,
    "tests/console/test_console.py": 37,
    "tests/property/test_raft_safety.py": 53,
    "tests/broker/test_tour.py": 49,
    "tests/integration/test_membership.py": 34,
    "tests/integration/test_group.py": 33,
    "tests/chaos/test_powerloss.py": 29,
    "tests/broker/test_e2e.py": 26,
    "tests/rocketmq/test_transactions_recall.py": 22,
    "tests/bench/test_compare_smoke.py": 21,
    "tests/cluster/test_secure_cluster.py": 20,
    "tests/fuzz/test_grpc_surfaces_secure.py": 20,
    "tests/rocketmq/test_failover.py": 20,
    "tests/bench/test_jetstream_smoke.py": 15,
    "tests/broker/test_retention_group.py": 14,
    "tests/integration/test_snapshots.py": 13,
    "tests/fuzz/test_grpc_surfaces.py": 11,
    "tests/rocketmq/test_clients.py": 11,
    "tests/bench/test_security_bench.py": 11,
    "tests/integration/test_repair.py": 10,
}


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node) -> None:
            longest = max(self.workqueue, key=lambda scope: LONG_FILES.get(scope, 0))
            self.workqueue.move_to_end(longest, last=False)  # max() keeps xdist's order among the rest
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # xdist tops a worker up at two pending tests; a worker runs a test once it knows the next one, so
            # one pending test is the last moment that does not leave it waiting.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return LongestFilesFirst(config, log)
