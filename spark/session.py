"""The Spark session the audit runs in, and shipping the audit's own code to the executors.

``local[*]`` by default; ``--master`` is honoured; under ``spark-submit`` the submitter's master applies. In local
mode the driver binds 127.0.0.1 and the web UI is off (nothing listens beyond the loopback). The executors get
the audit's Python modules (``spark``, ``storage``, ``broker_adapter``) as one zip added with ``addPyFile``, so a
cluster needs only pyspark, numpy and pyarrow installed, not this project.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Final

from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

ROOT: Final = Path(__file__).resolve().parent.parent
SHIPPED_PACKAGES: Final = ("spark", "storage", "broker_adapter")
# The dledger source and sink (spark.datasource) talk to the groups through the broker's clients, which use the
# log library's routing, transport and security: their workers need grpcio and protobuf installed too.
DATASOURCE_PACKAGES: Final = (*SHIPPED_PACKAGES, "dledger", "statemachine")
GATEWAY_LAUNCHES: Final = 3  # JVMs started for one session at most (``started``)


def code_zip(packages: tuple[str, ...] = SHIPPED_PACKAGES) -> str:
    """A zip of the packages the workers import, named by its content hash (so adding it twice is harmless)."""
    files = []
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            files.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + data)
    out_dir = Path(tempfile.gettempdir()) / f"dledger-audit-{os.getuid()}"
    out_dir.mkdir(mode=0o700, exist_ok=True)
    target = out_dir / f"dledger_audit_{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in files:
                z.writestr(name, data)
        os.replace(tmp, target)
    return str(target)


def under_spark_submit() -> bool:
    """True when this driver was launched by spark-submit (the JVM exists and chose the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, app_name: str = "dledger-audit") -> SparkSession:
    builder = SparkSession.builder.appName(app_name)
    if master is None and not under_spark_submit():
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.memory", os.environ.get("DLEDGER_AUDIT_DRIVER_MEMORY", "2g"))
            .config("spark.pyspark.python", sys.executable)
        )
        # PySpark starts local workers with $PYSPARK_PYTHON (default python3): use this interpreter, which
        # has numpy and pyarrow, unless the user chose one.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # The JVM's block manager and RPC endpoints bind this address: keep them on the loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
    )
    spark = started(builder)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def started(builder: SparkSession.Builder, pause_s: float = 1.0) -> SparkSession:
    """``builder.getOrCreate()``, launching the JVM again when it exits before reporting its port
    (``JAVA_GATEWAY_EXITED``): seen now and then when the launching process has gRPC threads running, as a
    test worker that just used the official RocketMQ client had. Any other error, or the last launch's, is raised."""
    for launch in range(1, GATEWAY_LAUNCHES + 1):
        try:
            return builder.getOrCreate()
        except PySparkRuntimeError as e:
            if e.getErrorClass() != "JAVA_GATEWAY_EXITED" or launch == GATEWAY_LAUNCHES:
                raise
            time.sleep(pause_s)
    raise AssertionError("unreachable")


def prepare(spark: SparkSession, data_bytes: int) -> None:
    """Per-run settings: ship the code; size shuffles to the data (about one partition per 128 MiB of log, at
    most eight per core), since every shuffle partition is a task and small audits are dominated by task
    overhead, not by work."""
    spark.sparkContext.addPyFile(code_zip())
    cores = spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, min(8 * cores, data_bytes // (128 << 20)))))


def _warm(batches):
    import spark.tasks  # noqa: F401  (numpy, pyarrow and the scan, imported once per worker)

    yield from batches


def warm_up(spark: SparkSession) -> None:
    """Start the Python workers (one per core) and import the scan in them: the part of a first audit that is
    start-up, not work. Benchmarks call it to report start-up apart; an audit does not need it."""
    spark.sparkContext.addPyFile(code_zip())
    cores = spark.sparkContext.defaultParallelism
    spark.range(0, cores, numPartitions=cores).mapInArrow(_warm, "id long").count()
