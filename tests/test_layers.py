"""The import contract: the layers' arrows point one way (docs/decisions/0001-layers.md).

    storage  <-  statemachine  <-  dledger  <-  broker_adapter
    spark reads storage and broker_adapter.core.formats only
    spark.datasource also uses the broker's clients (not its core)

Every module of ours is parsed with ``ast`` (nothing is imported): ``import`` and ``from ... import`` anywhere
(inside functions and ``TYPE_CHECKING`` blocks too, relative ones resolved), ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name, and string constants that name a module of ours (``"pkg.mod"`` or
``"pkg.mod:attr"``, as a plugin table would). The layers above plug in through entry points (pyproject.toml),
which this test does not read: installed metadata is not an import.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("storage", "statemachine", "dledger", "broker_adapter", "spark")

# The most specific prefix of a module's name decides what it may import of ours (itself always).
ALLOWED: dict[str, tuple[str, ...]] = {
    "storage": ("storage",),
    "statemachine": ("storage", "statemachine"),
    "dledger.errors": (),  # a leaf: the core and everything above raise its errors
    "dledger.core": ("storage", "dledger.core", "dledger.errors"),  # pure Raft: no runtime, no state machines
    "dledger": ("storage", "statemachine", "dledger"),
    "broker_adapter.core.formats": ("storage",),  # and the standard library only (see STDLIB_ONLY)
    "broker_adapter": ("storage", "statemachine", "dledger", "broker_adapter"),
    # the protocol-neutral broker imports no face, client, cluster tooling or generated protos (docs/broker.md);
    # of the log library, only what a plugin is given: the seam, its errors and a node's role
    "broker_adapter.core": (
        "storage",
        "statemachine",
        "dledger.errors",
        "dledger.plugins",
        "dledger.core.messages",
        "broker_adapter.settings",
    ),
    "spark": ("storage", "spark", "broker_adapter.core.formats"),
    # the source and sink (issue 29) talk to running groups: through the broker's clients, never its core
    "spark.datasource": (
        "storage",
        "spark",
        "broker_adapter.core.formats",
        "broker_adapter.client",
        "broker_adapter.pulled",
        "broker_adapter.nameserver.client",
        "broker_adapter.v1",
        "dledger.errors",
        "dledger.security.config",
    ),
}
STDLIB_ONLY = ("broker_adapter.core.formats",)  # read by Spark's executors, which need nothing else installed

# (file, imported module) pairs tolerated for now, each with the branch that removes it.
ALLOW_LIST: set[tuple[str, str]] = set()

_NAME = re.compile(rf"^({'|'.join(PACKAGES)})(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$|^({'|'.join(PACKAGES)}):\w+$")


@dataclass(frozen=True, slots=True)
class Violation:
    path: str
    line: int
    module: str
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} imports {self.imported} ({self.rule})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module name) for every import the source makes, by statement or by name."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # "from pkg import mod" may import a submodule: name it precisely so pkg.formats is told apart.
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names if a.name != "*"]
            if any(a.name == "*" for a in node.names):
                out.append((node.lineno, target))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.match(node.value):
            out.append((node.lineno, node.value.partition(":")[0]))
    return sorted(set(out))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _rule_for(module: str) -> str | None:
    matches = [p for p in ALLOWED if _under(module, p)]
    return max(matches, key=len) if matches else None


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def violations(module: str, source: str, path: str, is_package: bool = False) -> list[Violation]:
    """What ``module`` (in file ``path``) imports against the layers."""
    rule = _rule_for(module)
    if rule is None:
        return []
    allowed = tuple(dict.fromkeys((*ALLOWED[rule], rule)))
    found = []
    for line, name in imports(module, source, is_package):
        if _ours(name):
            if not any(_under(name, a) for a in allowed):
                found.append(
                    Violation(path, line, module, name, f"{rule} may import only: {', '.join(allowed)}")
                )
        elif rule in STDLIB_ONLY and name.split(".")[0] not in sys.stdlib_module_names:
            found.append(Violation(path, line, module, name, f"{rule} may import the standard library only"))
    return found


def all_violations() -> list[Violation]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for v in violations(module_name(path), path.read_text(), rel, path.name == "__init__.py"):
                if not any(rel == f and _under(v.imported, m) for f, m in ALLOW_LIST):
                    out.append(v)
    return out


def test_every_import_points_down_the_layers() -> None:
    found = all_violations()
    assert not found, "imports against the layers:\n" + "\n".join(map(str, found))


def test_nothing_is_allow_listed() -> None:
    assert set() == ALLOW_LIST


def test_the_checker_finds_each_kind_of_violation() -> None:
    source = """\
from __future__ import annotations
import importlib
from typing import TYPE_CHECKING

from storage import codec
from dledger.errors import ConfigError

if TYPE_CHECKING:
    from broker_adapter.client import BrokerConnection

PLUGINS = {"broker": "broker_adapter.plugin:make"}


def late():
    import spark.audit
    return importlib.import_module("broker_adapter.demo")
"""
    found = violations("dledger.somewhere", source, "dledger/somewhere.py")
    assert [(v.line, v.imported) for v in found] == [
        (9, "broker_adapter.client.BrokerConnection"),
        (11, "broker_adapter.plugin"),
        (15, "spark.audit"),
        (16, "broker_adapter.demo"),
    ]
    assert str(found[0]) == (
        "dledger/somewhere.py:9: dledger.somewhere imports broker_adapter.client.BrokerConnection "
        "(dledger may import only: storage, statemachine, dledger)"
    )


def test_relative_imports_and_the_most_specific_rule() -> None:
    # spark may read broker_adapter.core.formats, and nothing else of the broker
    assert not violations("spark.x", "from broker_adapter.core.formats import UNIT_SIZE\n", "spark/x.py")
    assert not violations("spark.x", "from broker_adapter.core import formats\n", "spark/x.py")
    bad = violations("spark.x", "from broker_adapter.core import message\n", "spark/x.py")
    assert [v.imported for v in bad] == ["broker_adapter.core.message"]
    # the audit may not use the broker's clients; the source and sink may, and still not the broker's core
    bad = violations("spark.audit", "from broker_adapter.client import Consumer\n", "spark/audit.py")
    assert [v.imported for v in bad] == ["broker_adapter.client.Consumer"]
    src = "from broker_adapter.client import Consumer\nfrom broker_adapter.core import message\n"
    bad = violations("spark.datasource.source", src, "spark/datasource/source.py")
    assert [v.imported for v in bad] == ["broker_adapter.core.message"]
    # the core is stricter than the rest of dledger; a relative import is resolved first
    bad = violations(
        "dledger.core.raft", "from ..node import Node\nfrom . import quorum\n", "dledger/core/raft.py"
    )
    assert [v.imported for v in bad] == ["dledger.node.Node"]
    # formats: the standard library and storage only
    bad = violations(
        "broker_adapter.core.formats", "import struct\nimport numpy\n", "broker_adapter/core/formats.py"
    )
    assert [v.imported for v in bad] == ["numpy"]
    # the broker's core imports no face of it
    bad = violations(
        "broker_adapter.core.pop",
        "from broker_adapter.rocketmq import convert\nfrom broker_adapter.core import message\n",
        "broker_adapter/core/pop.py",
    )
    assert [v.imported for v in bad] == ["broker_adapter.rocketmq.convert"]
    # storage imports nothing of ours
    assert [v.imported for v in violations("storage.x", "import statemachine.api\n", "storage/x.py")] == [
        "statemachine.api"
    ]


# -- the plugin seam: what the log layer knows of its tenants (issue 26) --------------------------------------
# Nothing under dledger/ names a broker, RocketMQ or name-server key, method or message in its code (names and
# string constants: comments and docstrings are prose): the broker brings those itself (its [broker] table,
# broker_adapter/settings.py; its permission rules, broker_adapter/security_rules.py; its protos,
# proto/broker_adapter/v1; its name servers' certificates, `dledger cluster certs`; its chaos workload, an entry
# point). No module is exempt.
_TENANT = re.compile(r"broker|rocketmq|nameserver|name_server|MessagingService|SHARDINGKEY", re.IGNORECASE)


def tenant_knowledge(source: str, path: str) -> list[tuple[int, str]]:
    """(line, text) of every name or string constant in the code that names a tenant (docstrings excluded)."""
    tree = ast.parse(source, path)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.arg):
            text = node.name if not isinstance(node, ast.arg) else node.arg
        if text is not None and _TENANT.search(text):
            found.append((getattr(node, "lineno", 0), text))
    return found


def test_the_log_layer_names_no_tenant() -> None:
    bad = []
    for f in sorted((ROOT / "dledger").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        bad += [f"{rel}:{line}: {text!r}" for line, text in tenant_knowledge(f.read_text(), rel)]
    assert not bad, "tenant knowledge under dledger/ (it belongs to the plugin):\n" + "\n".join(bad)


# The log library apart from its tooling (issue 26): what a program embedding a node or a client imports never
# pulls in the local-group runner, the CLI, chaos, membership scripts or certificate issuing.
TOOLING: tuple[str, ...] = (
    "dledger.__main__",
    "dledger.backup_commands",
    "dledger.backups",
    "dledger.chaos",
    "dledger.cli",
    "dledger.cliutil",
    "dledger.group",
    "dledger.group_members",
    "dledger.kv.cli",
    "dledger.member",
    "dledger.protogen",
    "dledger.recovery",
    "dledger.security.bootstrap",
    "dledger.security.certs",
    "dledger.security.cli",
)


def test_the_log_library_imports_no_tooling() -> None:
    bad = []
    for f in sorted((ROOT / "dledger").rglob("*.py")):
        module = module_name(f)
        if any(_under(module, t) for t in TOOLING):
            continue
        for line, name in imports(module, f.read_text(), f.name == "__init__.py"):
            if any(_under(name, t) for t in TOOLING):
                bad.append(f"{f.relative_to(ROOT)}:{line}: {module} imports {name}")
    assert not bad, "the library imports its tooling:\n" + "\n".join(bad)


def test_the_tenant_check_sees_code_not_prose() -> None:
    source = (
        '"""A module about the broker."""\nRULES = {"/dledger.v1.Broker/Send": 1}\ndef f(nameservers): pass\n'
    )
    assert [t for _, t in tenant_knowledge(source, "x.py")] == ["/dledger.v1.Broker/Send", "nameservers"]
