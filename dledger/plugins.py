"""Node plugins: the state machine a node runs and the gRPC services it adds, chosen by configuration.

A node's config names a plugin as ``"module:factory"`` (or an installed alias: ``kv``, ``counter``, ``broker``). The factory
takes the ``NodeConfig`` and returns an object with a ``state_machine`` and an ``attach(node, server)`` method
(``node`` is a ``NodeHandle``: the few members of the node a plugin may use) that registers the plugin's servicers on the node's gRPC server and returns their full service names (for health
checking and reflection). The broker is such a plugin (``broker_adapter.plugin:make``), which is how it stacks on
the node without the node importing it (the layers' arrows point one way: broker_adapter -> dledger).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from dledger.errors import ConfigError
from statemachine.api import StateMachine

if TYPE_CHECKING:
    import grpc

    from dledger.core.messages import Prepare, Role
    from dledger.nodeconfig import NodeConfig
    from dledger.transport.base import AppendedRun, NodeInfo
    from statemachine.apply_loop import Applied
    from storage.api import LogStore

# The aliases (kv, counter, broker) are entry points of this group (pyproject.toml), so the runtime names no
# module of the layers above it.
PLUGIN_ENTRY_POINTS = "dledger.plugins"


def builtin() -> dict[str, str]:
    """The installed plugin aliases: name -> ``"module:factory"``."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_ENTRY_POINTS)}


class NodeHandle(Protocol):
    """What a plugin may use of the node it runs on: identity, leadership, the log, and proposing entries."""

    @property
    def id(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def config(self) -> NodeConfig: ...

    @property
    def log_store(self) -> LogStore:
        """The node's log (read-only for a plugin: entries reach it only through ``append``/``submit``)."""
        ...

    @property
    def term(self) -> int:
        """The node's current term."""
        ...

    @property
    def leader_id(self) -> str | None:
        """The leader this node knows of (itself when it leads), or None during an election."""
        ...

    def is_leader(self) -> bool: ...

    def address_of(self, node_id: str) -> str | None:
        """A member's client address (from the configuration), or None for an unknown id."""
        ...

    def metadata(self) -> NodeInfo:
        """A snapshot of the node's state (role, term, leader, indices): cheap, but not for every request."""
        ...

    def add_role_listener(self, listener: Callable[[Role, int], None]) -> None:
        """Call ``listener(role, term)`` on every change of role or term, on the node's event loop."""
        ...

    def serving(self) -> AbstractContextManager[None]:
        """Held while a client's call waits here on the leader (a follower forwarding or relaying it): a
        follower then waits for its ``sync``-policy fdatasync off its event loop, so that such calls go on
        meanwhile (docs/decisions/0029-followers-serving-calls-sync-off-loop.md)."""
        ...

    async def append(self, bodies: list[bytes], prepare: Prepare | None = None) -> AppendedRun:
        """Append bodies as consecutive entries (leader only); resolves once they are committed.
        ``prepare(index, pos, body)`` may rewrite a body once its place in the log is known."""
        ...

    async def submit(
        self, bodies: list[bytes], prepare: Prepare | None = None
    ) -> list[Applied | BaseException]:
        """``append``, then wait until the state machine applied each body: its ``Applied`` result or error."""
        ...

    async def read_index(self, timeout_s: float | None = None) -> int:
        """Leader only: a linearizable read point (a quorum confirmed the leadership; applied here by return)."""
        ...

    async def wait_applied(self, index: int) -> None:
        """Return once this node's state machine has applied ``index`` (bound it with a timeout)."""
        ...


class NodePlugin(Protocol):
    """A plugin may also define ``async aclose()``: the node awaits it when stopping, after its server stopped
    (the broker's name-server registration ends there), and ``config_sections``: the names of the node config's
    tables it reads (``NodeConfig.sections``; its factory checks them), so that a table nobody reads is refused
    at start instead of ignored; ``security_rules()``: who may call its services on a secure node
    (``dledger.security.guard.ServiceRules``; a method no rule names needs admin); and
    ``credentials_reloaded(peer_credentials)``: a secure node reloaded its certificates, so channels the plugin
    dials itself are made anew with them (docs/security.md, "Rotating certificates")."""

    state_machine: StateMachine

    def attach(self, node: NodeHandle, server: grpc.aio.Server) -> Sequence[str]:
        """Register servicers on ``server``; return their full service names."""
        ...


def resolve(spec: str) -> Callable[[NodeConfig], NodePlugin]:
    """The factory a spec names; a bad spec is a ``ConfigError`` that says what was tried."""
    aliases = builtin()
    target = aliases.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"state_machine {spec!r} is neither a built-in ({', '.join(sorted(aliases))}) nor module:factory"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"state_machine {spec!r}: cannot import {module_name}: {e}") from None
    factory: Callable[[NodeConfig], NodePlugin] | None = getattr(module, attr, None)  # trusted to be one
    if not callable(factory):
        raise ConfigError(f"state_machine {spec!r}: {module_name} has no callable {attr!r}")
    return factory
