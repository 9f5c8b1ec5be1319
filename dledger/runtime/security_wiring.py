"""A node's security wiring: what ``Node`` (node.py) does differently when its config has a ``[security]`` table
(docs/security.md), gathered in one place so the node reads the same with or without one (one concept per
module, docs/decisions/0002-runtime-package.md).

The security itself is dledger/security/: ``SecuredPlugin`` (dledger/security/node.py) wraps the node's plugin and
holds the certificate, key and CA bundle, the users and the guard. ``NodeSecurity`` plugs it into the node: the
plugin the node hosts, the credentials its server and its peer transport are built with, the server's
interceptor, and a certificate reload reaching the peer channels (SIGHUP, dledger/runtime/process.py;
``dledger cert reload``, dledger/security/service.py; docs/security.md, "Rotating certificates"). Without
``[security]`` each answers "nothing to add", and dledger.security.node is never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from dledger.errors import ConfigError
from dledger.nodeconfig import NodeConfig
from dledger.plugins import NodePlugin
from dledger.transport.base import PeerTransport
from dledger.transport.grpc import GrpcPeerTransport
from statemachine.api import StateMachine

if TYPE_CHECKING:
    from dledger.runtime.node import Node
    from dledger.security.node import SecuredPlugin
    from dledger.security.rotation import ReloadSummary


class NodeSecurity:
    """A node's ``[security]`` (``secured``), or its absence (``secured`` is None)."""

    def __init__(self, config: NodeConfig, plugin: NodePlugin | None, state_machine: StateMachine | None):
        self.node_id = config.node_id
        self.secured: SecuredPlugin | None = None
        if config.security is not None:  # TLS, peer identity, users and permissions (docs/security.md)
            from dledger.security.node import SecuredPlugin

            self.secured = SecuredPlugin(config, plugin, state_machine)
        # The plugin the node hosts: the secured one wraps the other.
        self.plugin: NodePlugin | SecuredPlugin | None = self.secured if self.secured is not None else plugin

    def peer_credentials(self) -> grpc.ChannelCredentials | None:
        """What the peer transport dials with (None: plaintext)."""
        return self.secured.peer_credentials() if self.secured is not None else None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """What the node's server serves TLS with (None: plaintext)."""
        return self.secured.server_credentials() if self.secured is not None else None

    def interceptors(self, node: Node) -> tuple[grpc.aio.ServerInterceptor, ...]:
        """What sees every call to the node's server first: the guard (dledger/security/guard.py)."""
        return (self.secured.interceptor(node),) if self.secured is not None else ()

    def reload(self, transport: PeerTransport | None) -> ReloadSummary:
        """``Node.reload_certificates``: the files read again; when they changed, the peers dialled anew with
        them (``GrpcPeerTransport.set_credentials``). ConfigError when there is no ``[security]`` or the files
        cannot serve (the old ones stay)."""
        if self.secured is None:
            raise ConfigError(f"node {self.node_id} has no [security]: there is no certificate to reload")
        summary = self.secured.reload()
        if summary["changed"] and isinstance(transport, GrpcPeerTransport):
            transport.set_credentials(self.secured.peer_credentials())
        return summary
