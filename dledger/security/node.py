"""Security on a node: what ``Node`` asks for when its config has a ``[security]`` table.

``SecuredPlugin`` wraps the node's plugin (or bare state machine): its state machine gains the replicated user
store (``users.SecuredStateMachine``), its services gain the Security service, and it hands the node the
server's TLS credentials and the interceptor (``guard``), and the peer channels' credentials (``tls``). With
replicated users, ``catchup`` makes an acknowledged user change hold on every node (the guard catches up before
a refusal; the service confirms a change on the other members before answering). A node without a state
machine has no replicated users: only the bootstrap admin (docs/security.md). Its certificate, key and CA bundle
are a ``rotation.Reloadable``: ``reload`` swaps them for what the files hold now, and everything built from them
follows (the proof, the command signer, the verifiers, the channels: docs/security.md "Rotating certificates").
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import grpc

from dledger.security import guard, service, tls
from dledger.security.catchup import CatchUp, default_bound_s
from dledger.security.config import read_credentials
from dledger.security.rotation import Material, MaterialFiles, Reloadable, ReloadSummary, check_material
from dledger.security.users import CommandVerifier, SecuredStateMachine, User, UserStore


class SecuredPlugin:
    def __init__(self, config: Any, inner: Any | None, state_machine: Any | None):
        self.config = config
        self.inner = inner
        self.users = UserStore()
        sec = config.security
        ak, sk = read_credentials(sec.admin)
        files = MaterialFiles(sec.cert, sec.key, sec.ca)
        # The certificate, key and CA bundle in use: ``reload`` (SIGHUP, ``dledger cert reload``) swaps them.
        self.tls = Reloadable(files.read, lambda m: check_material(m, files, config.node_id, config.group))
        m = self.tls.material
        base = inner.state_machine if inner is not None else state_machine
        self._commands = CommandVerifier(config.group, m.ca_pem)
        self.state_machine = (
            SecuredStateMachine(base, self.users, self._commands) if base is not None else None
        )
        self.admin = User(ak, sk, {"admin"})
        self._catch_up: CatchUp | None = None
        self._proof = tls.PeerProofPlugin(config.group, config.node_id, m.cert_pem, m.key_pem)
        self._signer = service.CommandSigner(config.group, m.cert_pem, m.key_pem)
        self._peers: tls.PeerVerifier | None = None  # made with the interceptor
        self.tls.on_reload(self._reloaded)

    def _reloaded(self, m: Material) -> None:
        """New material is in use: prove, sign and trust with it; channels dialled from now on use it."""
        self._proof.update(m.cert_pem, m.key_pem)
        self._signer.update(m.cert_pem, m.key_pem)
        self._commands.add_ca(m.ca_pem)
        if self._peers is not None:
            self._peers.set_ca(m.ca_pem)
        if self._catch_up is not None:
            self._catch_up.redial()
        hook = getattr(self.inner, "credentials_reloaded", None)  # ``NodePlugin``'s optional hook
        if hook is not None:  # the plugin's own channels (a broker's to its leader and name servers)
            hook(self.peer_credentials())

    def reload(self) -> ReloadSummary:
        """Read the certificate, key and CA files again and use them (docs/security.md, "Rotating
        certificates"); ConfigError naming the file when they cannot serve (the old ones stay)."""
        return self.tls.reload()

    def catch_up(self, node: Any) -> CatchUp | None:
        """The node's ``CatchUp`` (one per node, made on first use); None without replicated users."""
        if self.state_machine is None:
            return None
        if self._catch_up is None:
            bound = default_bound_s(self.config.raft.election_timeout_max_ms)
            ak, sk = self.admin.access_key, self.admin.secret_key
            self._catch_up = CatchUp(node, self.config.security.ca, ak, sk, bound)
        return self._catch_up

    async def aclose(self) -> None:
        if self._catch_up is not None:
            await self._catch_up.aclose()
        inner_close = getattr(self.inner, "aclose", None)
        if inner_close is not None:
            await inner_close()

    def __getattr__(self, attr: str) -> Any:  # the wrapped plugin's own members (e.g. the broker's)
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(attr)
        return getattr(inner, attr)

    def user_of(self, access_key: str) -> User | None:
        if access_key == self.admin.access_key:
            return self.admin
        return self.users.users.get(access_key)

    def attach(self, node: Any, server: grpc.aio.Server) -> Sequence[str]:
        names = tuple(self.inner.attach(node, server)) if self.inner is not None else ()
        if self.state_machine is None:
            return (*names, *service.attach_reload(node, server))
        catch_up = self.catch_up(node)
        return (
            *names,
            *service.attach(node, server, self.users, self.admin.access_key, self._signer, catch_up),
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        return self.tls.server_credentials()

    def interceptor(self, node: Any) -> guard.SecurityInterceptor:
        cfg = self.config
        users = self.users  # its revocation list is replaced when a snapshot loads: read it through the store
        verifier = self._peers = tls.PeerVerifier(
            cfg.group,
            self.tls.material.ca_pem,
            lambda: current_members(node),
            cfg.security.skew_s,
            revoked=lambda: users.revoked_certs,
        )
        catch_up = self.catch_up(node)
        return guard.SecurityInterceptor(
            cfg.node_id,
            self.user_of,
            verifier,
            cfg.security.skew_s,
            catch_up=catch_up.refresh if catch_up is not None else None,
            services=self._service_rules(),
        )

    def _service_rules(self) -> Sequence[guard.ServiceRules]:
        """The permission rules of the wrapped plugin's own services (``NodePlugin.security_rules``)."""
        inner = self.__dict__.get("inner")
        rules = getattr(inner, "security_rules", None) if inner is not None else None
        return tuple(rules()) if rules is not None else ()

    def peer_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for channels to peers (and name servers) with the material in use now: a channel made
        after a reload trusts the new bundle; every channel sends the current proof (``tls.PeerProofPlugin``)."""
        cfg, m = self.config, self.tls.material
        return tls.peer_channel_credentials(
            cfg.group, cfg.node_id, m.cert_pem, m.key_pem, m.ca_pem, proof=self._proof
        )


def current_members(node: Any) -> Container[str]:
    """Whom a peer proof may name: the members of the configuration in effect, so that a node added through the
    log is known as soon as its entry is, and a removed one is refused at once; the configured peers while the
    node knows no configuration (starting, or joining a group)."""
    core = node.core
    members: tuple[str, ...] = core.configuration.members if core is not None else ()
    return members or node.config.peers
