"""The audit on a Spark standalone cluster (``--master spark://...``), not only in local mode.

The test starts a master and a worker from pyspark's own launcher (``bin/spark-class``, the classes that
``sbin/start-master.sh`` and ``start-worker.sh`` run), on 127.0.0.1 with free ports, then runs ``dledger audit``
as a user would on their cluster: its driver connects to the master and its tasks run in the worker's executor,
which gets the audit's code shipped by ``spark.session.code_zip``. A clean group passes; a group with one node's
committed entry altered fails and the corruption is named. Both processes are stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger import group as grp
from spark.audit import EXIT_OK, EXIT_VIOLATIONS
from tests.spark import builder as b


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    home = _spark_home()
    spark_class = home / "bin" / "spark-class"
    work = tmp_path_factory.mktemp("spark-standalone")
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work),
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    port, master_ui, worker_ui = grp.free_ports(3)
    master_url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    logs = {name: open(work / f"{name}.log", "w") for name in ("master", "worker")}  # noqa: SIM115
    try:
        procs.append(
            subprocess.Popen(
                [
                    str(spark_class),
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(master_ui),
                ],
                stdout=logs["master"],
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    str(spark_class),
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "2",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(worker_ui),
                    "--work-dir",
                    str(work / "worker"),
                    master_url,
                ],
                stdout=logs["worker"],
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + 120
        while "Registering worker" not in (work / "master.log").read_text():
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail(
                    "the standalone master and worker did not come up:\n"
                    + (work / "master.log").read_text()[-3000:]
                    + (work / "worker.log").read_text()[-3000:]
                )
            time.sleep(0.2)
        yield master_url, env
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for f in logs.values():
            f.close()


def _audit(master_url: str, env: dict, report: Path, *dirs: Path) -> tuple[int, dict, str]:
    cmd = [
        sys.executable,
        "-m",
        "dledger",
        "audit",
        *map(str, dirs),
        "--master",
        master_url,
        "--report",
        str(report),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode in (EXIT_OK, EXIT_VIOLATIONS), r.stdout + r.stderr[-4000:]
    return r.returncode, json.loads((report / "audit.json").read_text()), r.stdout


@pytest.mark.slow  # 80 s (make soak); the audit itself is tested in local mode by tests/spark/test_audit.py
def test_the_audit_runs_on_a_standalone_cluster_and_finds_corruption(standalone, tmp_path):
    master_url, env = standalone
    laid = b.lay_out(b.message_items(term=1, per_queue=20))
    group = tmp_path / "g"
    written = [b.write_node(group / f"n{k}", laid, commit=len(laid) - 1) for k in range(3)]
    rc, doc, out = _audit(master_url, env, tmp_path / "clean", group)
    assert rc == EXIT_OK, out
    assert doc["ok"] is True
    b.flip_body_byte(written[2], 7)  # one committed entry's body on one node
    rc, doc, out = _audit(master_url, env, tmp_path / "corrupt", group)
    assert rc == EXIT_VIOLATIONS, out
    failed = [c for c in doc["checks"] if c["violations"]]
    assert failed, doc
    assert "n2" in json.dumps(failed) and "7" in json.dumps(failed)


SOURCE_SCRIPT = """
import sys
from spark.datasource import register
from spark.session import build_session

master, servers = sys.argv[1], sys.argv[2]
spark = build_session(master, app_name="dledger-source-standalone")
register(spark)
df = spark.read.format("dledger").option("addresses", servers).option("topic", "sa").load()
df.selectExpr("body", "keys").write.format("dledger").option("addresses", servers).option(
    "topic", "sa-copy"
).mode("append").save()
print("COUNT", df.count(), df.rdd.getNumPartitions())
spark.stop()
"""


@pytest.mark.slow
def test_the_dledger_source_and_sink_run_on_a_standalone_cluster(standalone, tmp_path):
    """The executors import the source from the zip ``register`` ships (their working directory is the worker's,
    not this tree): a batch read of a live group's topic and a write of it to another topic."""
    from broker_adapter.client import BrokerConnection, Consumer, Producer
    from spark.session import ROOT

    master_url, env = standalone
    g, _ = grp.up(tmp_path / "g", 3, None, state_machine="broker")
    try:
        with BrokerConnection(g.addresses) as c:
            c.create_topic("sa", 2)
            c.create_topic("sa-copy", 2)
        with Producer(g.addresses) as p:
            p.send_batch("sa", [(f"m{i}".encode(), None, [f"k{i}"]) for i in range(50)])
        script = tmp_path / "job.py"
        script.write_text(SOURCE_SCRIPT)
        r = subprocess.run(
            [sys.executable, str(script), master_url, ",".join(g.addresses)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT)},
        )
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
        assert "COUNT 50 2" in r.stdout
        with Consumer(g.addresses, "check") as c:
            copied = list(c.messages("sa-copy", idle_s=1.0))
        assert sorted(m.body for m in copied) == sorted(f"m{i}".encode() for i in range(50))
    finally:
        grp.stop_group(g)
