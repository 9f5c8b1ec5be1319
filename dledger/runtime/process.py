"""A node as an operating-system process (``dledger node``): its event loop, and the signals it answers.

SIGTERM and SIGINT stop the node cleanly (its log flushed, its lock released); SIGHUP, on a node with
``[security]``, reloads its certificate, key and CA bundle (docs/security.md, "Rotating certificates"); anything
else is the node's own business (dledger/runtime/node.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal

from dledger.errors import ConfigError, UnavailableError
from dledger.nodeconfig import NodeConfig
from dledger.runtime.node import Node

log = logging.getLogger(__name__)


def serve(config: NodeConfig) -> None:
    """Run one node in the foreground on uvloop until SIGTERM/SIGINT (``dledger node``).

    uvloop, not asyncio's own loop: a node's work per replicated entry is mostly event-loop plumbing around
    grpc.aio (callbacks, futures, epoll), and uvloop does that part in C; measured side by side in
    docs/send-budget.md. A required dependency (pyproject.toml), so there is no fallback to hide a missing one."""
    import uvloop  # here, not at the top: importing the runtime (tests, clients) does not need it

    uvloop.run(run_node(config))


async def run_node(config: NodeConfig) -> None:
    """Run one node in the foreground until SIGTERM/SIGINT (``dledger node``). A SIGTERM that arrives while the
    node starts (its owner gone, dledger/owner.py, or a supervisor's stop) is kept, and the node stops cleanly as
    soon as it has started, rather than dying of the signal with its stores half open."""
    node = Node(config)
    loop = asyncio.get_running_loop()
    stop_asked = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_asked.set)
    await node.start()
    install_signal_handlers(node)
    if stop_asked.is_set():
        await node.stop()
    await node.wait_stopped()
    if node.failure is not None:
        raise UnavailableError(
            f"node {config.node_id} stopped after a failure: {node.failure!r}"
        ) from node.failure


def install_signal_handlers(node: Node) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: loop.create_task(node.stop()))
    if node.config.security is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: _reload(node))


def _reload(node: Node) -> None:
    """SIGHUP: reload the certificate, key and CA bundle (``Node.reload_certificates``); files that cannot serve
    are logged and change nothing."""
    try:
        node.reload_certificates()
    except ConfigError as e:
        log.error("%s: SIGHUP: certificates not reloaded: %s", node.id, e)
