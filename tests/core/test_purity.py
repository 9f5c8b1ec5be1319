"""The Raft core is pure: no module in dledger/core imports anything that does I/O, reads a clock or threads."""

from __future__ import annotations

import ast
from pathlib import Path

import dledger.core

FORBIDDEN = {"asyncio", "grpc", "lmdb", "time", "os", "socket", "threading"}
CORE_DIR = Path(dledger.core.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_modules_import_no_io() -> None:
    modules = sorted(CORE_DIR.glob("*.py"))
    assert len(modules) >= 5, modules  # raft, raft_log, progress, quorum, messages, config
    bad = {p.name: sorted(_imports(p) & FORBIDDEN) for p in modules}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"I/O imports in the pure core: {bad}"


def test_the_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_text("import os.path\nfrom time import monotonic\nfrom . import sibling\n")
    assert _imports(p) & FORBIDDEN == {"os", "time"}
