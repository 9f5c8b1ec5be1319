"""The official Node.js RocketMQ 5 client (npm ``rocketmq-client-nodejs``, pinned) for the tests: installed once
with npm into ``.cache/npm/`` at the repository root (gitignored; a fresh clone installs it at its first run), then
driven through ``tests/rocketmq/js/node_client.js``, one process per produce or consume run.

The install goes to a temporary directory renamed into place, so concurrent test workers never see half of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE = "rocketmq-client-nodejs"
VERSION = "1.0.8"
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "npm" / f"{PACKAGE}-{VERSION}"
SCRIPT = Path(__file__).with_name("js") / "node_client.js"


def node() -> str | None:
    return shutil.which("node")


def install() -> Path:
    """The ``node_modules`` directory holding the pinned client (npm install on first use)."""
    modules = CACHE / "node_modules"
    if (modules / PACKAGE / "package.json").exists():
        return modules
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("node is installed but npm is not: install npm to run the Node.js client tests")
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".install-", dir=CACHE.parent))
    try:
        (work / "package.json").write_text(json.dumps({"name": "dledger-node-client-tests", "private": True}))
        r = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", f"{PACKAGE}@{VERSION}"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode != 0:
            raise RuntimeError(f"npm install {PACKAGE}@{VERSION} failed:\n{r.stderr[-3000:]}")
        try:
            work.rename(CACHE)
        except OSError:  # another worker got there first: its copy is as good
            if not (modules / PACKAGE / "package.json").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return modules


def run(home: Path, *args: str, timeout_s: float = 120) -> dict:
    """One run of the JS driver; its JSON answer. ``home`` gets the client's own log files."""
    env = {**os.environ, "NODE_PATH": str(install()), "HOME": str(home)}
    r = subprocess.run(
        [node() or "node", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )
    if r.returncode != 0:
        raise AssertionError(f"node {' '.join(args)} exited {r.returncode}:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])
