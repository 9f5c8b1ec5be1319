"""Peers a benchmark compares with come from Debian's packages: find the binary, or apt-get install it once.

Used by bench/compare/etcd.py (etcd-server) and bench/jetstream_nats.py (nats-server)."""

from __future__ import annotations

import os
import shutil
import subprocess


def _located(binary: str, extra_paths: tuple[str, ...]) -> str | None:
    return shutil.which(binary) or next((p for p in extra_paths if os.access(p, os.X_OK)), None)


def find_or_install(
    binary: str, package: str, label: str, install: bool = True, extra_paths: tuple[str, ...] = ()
) -> tuple[str | None, str]:
    """The path of ``binary`` (installing ``package`` with apt-get if allowed and possible), and a note saying
    what happened; ``label`` names the peer in the note ("... ; etcd is skipped")."""
    path = _located(binary, extra_paths)
    if path:
        return path, f"{binary} found at {path}"
    if not install:
        return None, f"{binary} is not installed (apt-get install -y {package}); {label} is skipped"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return (
            None,
            f"{binary} is not installed and this user cannot apt-get install {package}; {label} is skipped",
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", package]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:  # maybe the package lists are stale or missing: refresh once
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=600)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    path = _located(binary, extra_paths)
    if path:
        return path, f"installed Debian {package}: {path}"
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return None, f"apt-get install {package} failed ({' / '.join(tail)}); {label} is skipped"
