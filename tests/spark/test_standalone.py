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
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark.audit import EXIT_OK, EXIT_VIOLATIONS
from tests.spark import builder as b


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    port = _free_port()
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
                    str(_free_port()),
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
                    str(_free_port()),
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
