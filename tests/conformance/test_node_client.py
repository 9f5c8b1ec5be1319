"""Conformance of the official Node.js client (npm ``rocketmq-client-nodejs`` 1.0.8, unchanged): the Node test
files in ``tests/conformance/js/`` (Node's built-in runner, ``node --test``) against this module's plain and
secure groups, whose endpoints, topics and credentials they get in environment variables. One pytest test per
Node file; node's own report is the failure message. Skipped only where ``node`` is not installed (CI installs
it: ``.ci/run``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conformance.conftest import Plain, Secure, stored
from tests.rocketmq import node_client

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(node_client.node() is None, reason="node (Node.js) is not installed on this machine"),
]

JS = Path(__file__).with_name("js")
FILES = sorted(p.name for p in JS.glob("*.test.js"))


def node_env(plain: Plain, secure: Secure, home: Path) -> dict[str, str]:
    import json

    return {
        **os.environ,
        "NODE_PATH": str(node_client.install()),
        "HOME": str(home),  # the client writes its log files under $HOME/logs
        # grpc-js dials one host:port: the client is given one node, which forwards to the leader
        "CONF_ENDPOINT": plain.group.addresses[0],
        "CONF_TOPICS": json.dumps(plain.topics),
        "CONF_FIFO_GROUP": plain.fifo_group,
        "CONF_SECURE_ENDPOINT": secure.group.addresses[0],
        "CONF_SECURE_TOPIC": secure.topic,
        "CONF_SECURE_AK": secure.access_key,
        "CONF_SECURE_SK": secure.secret_key,
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secure.ca),
    }


def run_node_tests(env: dict[str, str], *files: str) -> subprocess.CompletedProcess:
    cmd = [
        node_client.node() or "node",
        "--test",
        "--test-reporter=spec",
        "--test-timeout=120000",
        "--test-force-exit",
        *files,
    ]
    return subprocess.run(cmd, cwd=JS, env=env, capture_output=True, text=True, timeout=280)


@pytest.mark.parametrize("js", FILES)
def test_node_client(plain, secure, tmp_path, js):
    if js == "unsupported.test.js":
        before = {k: stored(plain.group, plain.topics[k]) for k in ("priority", "lite")}
    r = run_node_tests(node_env(plain, secure, tmp_path), js)
    out = (r.stdout + "\n" + r.stderr).strip()
    assert r.returncode == 0, f"node --test {js} exited {r.returncode}:\n{out[-12000:]}"
    print(out)  # node's report of each test (pytest -rA or -s shows it)
    if js == "unsupported.test.js":  # the refused sends stored nothing
        assert (
            {k: stored(plain.group, plain.topics[k]) for k in ("priority", "lite")}
            == before
            == {
                "priority": 0,
                "lite": 0,
            }
        )
