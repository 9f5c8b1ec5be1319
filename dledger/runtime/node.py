"""The node: one asyncio process that owns time and I/O around a pure ``RaftCore``, wired from one piece per
concept (docs/decisions/0002-runtime-package.md).

``Node`` opens the data directory (``datadir``), builds the core, starts the tasks and supervises them: the
ready loop, the ticker and the flusher (``ready_loop``), one sender per peer (``peers``) and the apply loop. It
is also the client API surface (append, submit, get, metadata, reads, leadership transfer, snapshots) and the
commit seam: ``add_commit_listener`` and ``add_role_listener`` are how a state machine, a plugin or a piece of
the runtime learns what committed and who leads.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import random
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from dledger.core.messages import InstallSnapshot, Message, Prepare, Role
from dledger.core.raft import RaftCore
from dledger.errors import (
    ConfigError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    UnavailableError,
)
from dledger.metrics import NodeMetrics
from dledger.nodeconfig import NodeConfig
from dledger.plugins import NodePlugin
from dledger.plugins import resolve as resolve_plugin
from dledger.runtime.backup import backup_chunks
from dledger.runtime.datadir import DataDir, base_configuration, conf_checkpoint, save_confs
from dledger.runtime.futures import retrieve
from dledger.runtime.iothread import IoThread
from dledger.runtime.membership import Membership
from dledger.runtime.peers import Peers
from dledger.runtime.proposals import ApplyWaiters, PendingAppend, Proposals
from dledger.runtime.reads import Reads
from dledger.runtime.ready_loop import ReadyLoop
from dledger.runtime.security_wiring import NodeSecurity
from dledger.runtime.snapshots import Snapshots
from dledger.transport.base import AppendedRun, NodeInfo, PeerInfo, PeerTransport, SnapshotChunk
from dledger.transport.grpc import GrpcPeerTransport
from dledger.transport.server import NodeServer
from statemachine.api import StateMachine
from statemachine.apply_loop import Applied, ApplyLoop
from statemachine.snapshot import SnapshotInfo, SnapshotStore
from storage.api import HardState, LogStore, MetaStore
from storage.codec import Entry
from storage.errors import Compacted, IndexOutOfRange

if TYPE_CHECKING:
    from dledger.security.rotation import ReloadSummary

log = logging.getLogger("dledger.runtime")

_ROLE_NAMES = {
    Role.LEADER: "leader",
    Role.FOLLOWER: "follower",
    Role.CANDIDATE: "candidate",
    Role.PRE_CANDIDATE: "candidate",
}


class Node:
    """A Raft node. ``start()`` opens storage and serves; ``stop()`` shuts down cleanly (also on SIGTERM)."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        log_store: LogStore | None = None,
        meta_store: MetaStore | None = None,
        transport: PeerTransport | None = None,
        rng: random.Random | None = None,
        serve: bool = True,
        state_machine: StateMachine | None = None,
        plugin: NodePlugin | None = None,
    ):
        """``plugin`` (or ``config.state_machine``, resolved through ``dledger.plugins``) brings the state machine
        and any gRPC services it adds; ``state_machine`` alone hosts a state machine without services."""
        self.config = config
        self.group = config.group
        self.id = config.node_id
        self._rng = rng or random.Random()
        self._serve = serve
        self._core: RaftCore | None = None
        self._server: NodeServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self.calls_waiting = 0  # clients' calls waiting here on the leader (``serving``)
        self._stopped = asyncio.Event()
        self._stopping = False
        self._commit_listeners: list[Callable[[int], None]] = []
        self._role_listeners: list[Callable[[Role, int], None]] = []
        self._seen_role_term: tuple[Role, int] = (Role.FOLLOWER, -1)
        if plugin is None and config.state_machine:
            plugin = resolve_plugin(config.state_machine)(config)
        self._security = NodeSecurity(config, plugin, state_machine)  # [security], if any (docs/security.md)
        hosted = self.plugin = self._security.plugin
        unread = sorted(set(config.sections) - set(getattr(hosted, "config_sections", ())))
        if unread:
            raise ConfigError(
                f"node {config.node_id}: no part of it reads the table(s) {', '.join(f'[{t}]' for t in unread)} "
                f"of its config (state_machine = {config.state_machine!r}); remove them or fix their names"
            )
        self.state_machine = hosted.state_machine if hosted is not None else state_machine
        self._apply: ApplyLoop | None = None
        self.port = 0
        self.stats: collections.Counter[str] = collections.Counter()
        self.metrics = NodeMetrics()
        self.failure: BaseException | None = None  # why the node stopped on its own, if it did
        # The pieces (one concept each); they share the core through ``lambda: self._core`` (rebuilt after a
        # full disk) and the ready loop's wake-up event.
        self._data = DataDir(config, log_store, meta_store)
        self._io = IoThread(self.id)
        self._snapshots = Snapshots(
            self.id,
            config,
            self.state_machine,
            self._io,
            stats=self.stats,
            on_installed=self._snapshot_installed,
            closing=lambda: self._stopping,
        )
        self.peers = Peers(
            self.id,
            config,
            core=lambda: self._core,
            wake=self._wake,
            snapshots=self._snapshots,
            stats=self.stats,
            on_failure=self._fail,
        )
        self.peers.transport = transport
        self._ready: ReadyLoop | None = None
        self._proposals = Proposals(
            self.id,
            config,
            core=self._started_core,
            wake=self._wake,
            not_leader=self._not_leader,
            refusal=lambda: self._started_ready().refusal(),
            stats=self.stats,
            metrics=self.metrics,
        )
        self._members = Membership(
            self.id,
            config,
            core=lambda: self._core,
            wake=self._wake,
            peers=self.peers,
            not_leader=self._not_leader,
            running=lambda: not self._stopping,
            commit_index=lambda: self.commit_index,
            transfer=self.transfer_leadership,
            start_sender=self._start_sender,
        )
        self._reads = Reads(
            self.id,
            core=lambda: self._core,
            wake=self._wake,
            not_leader=self._not_leader,
            applied=lambda: self._apply.applied_index if self._apply is not None else self.commit_index,
            has_state_machine=lambda: self._apply is not None,
        )

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        data = self._data
        if not data.opened:
            try:
                await self._io.run(data.open)
            except BaseException:
                self._io.shutdown(wait=False)
                self._snapshots.shutdown(wait=False)
                raise
        hard_state = data.meta_store.load_hard_state()
        applied = -1
        if self.state_machine is not None:
            applied = await self._io.run(self._snapshots.restore, data.log_store)
            self._apply = ApplyLoop(self.state_machine, data.log_store, applied, on_applied=self._on_applied)
            self._proposals.waiters = ApplyWaiters(self._apply)
            self.add_commit_listener(self._apply.commit_advanced)
            self.add_role_listener(self._reads.on_role)
        self._snapshots.attach(
            data.log_store,
            self._apply,
            conf_at=lambda index: self._started_core().configuration_at(index),
            save_conf=lambda conf, checkpoint: save_confs(data.meta_store, conf, checkpoint),
            conf_checkpoint=lambda *at: self._started_core().raft_log.conf_checkpoint(*at),
        )
        self._proposals.log = data.log
        self._core = self._new_core(hard_state, applied)
        self._ready = ReadyLoop(
            self.id,
            cfg,
            data,
            self._io,
            self._core,
            wake=self._wake,
            proposals=self._proposals,
            peers=self.peers,
            committed=self._committed,
            read_states=self._reads.read_states_ready,
            watch_role=self._watch_role,
            rebuild_core=self._rebuild_core,
            stats=self.stats,
            metrics=self.metrics,
            calls_waiting=lambda: self.calls_waiting,
        )
        if self.peers.transport is None:
            control_timeout = max(0.2, cfg.raft.election_timeout_min_ms / 1000)
            self.peers.transport = GrpcPeerTransport(
                self.group,
                {p: a for p, a in cfg.peers.items() if p != self.id},
                control_timeout_s=control_timeout,
                credentials=self._security.peer_credentials(),
            )
        self.peers.after_step = self._ready.commit_acked
        self.peers.transport.set_reply_handler(self.peers.step_all)
        if self._serve:
            plugin, security = self.plugin, self._security
            attach = (lambda server: plugin.attach(self, server)) if plugin is not None else None
            self._server = NodeServer(
                self,
                self,
                cfg.bind,
                attach,
                credentials=security.server_credentials(),
                interceptors=security.interceptors(self),
            )
            self.port = self._server.port
            await self._server.start()
        if cfg.metrics_listen:
            self.metrics.watch(loop, lambda: (self.metadata(), dict(self.stats)))
            port = self.metrics.serve(cfg.metrics_listen)
            log.info(
                "%s: Prometheus metrics on http://%s:%d/metrics",
                self.id,
                cfg.metrics_listen.rpartition(":")[0],
                port,
            )
        self._tasks = [
            asyncio.create_task(self._ready.run(), name=f"{self.id}-ready"),
            asyncio.create_task(self._ready.ticker(), name=f"{self.id}-ticker"),
            *[
                asyncio.create_task(self.peers.sender(peer), name=f"{self.id}-send-{peer}")
                for peer in self.peers.queues
            ],
        ]
        self._tasks.append(asyncio.create_task(self._ready.flusher(), name=f"{self.id}-flusher"))
        if self._apply is not None:
            self._tasks.append(asyncio.create_task(self._apply.run(), name=f"{self.id}-apply"))
            self._tasks.append(asyncio.create_task(self._snapshots.recheck(), name=f"{self.id}-policy"))
        for t in self._tasks:
            t.add_done_callback(self._task_done)
        self._members.watch_conf()
        log.info(
            "%s started: group %s, term %d, last index %d, listening on %s, flush %s, event loop %s, "
            "gRPC experiments %s",
            self.id,
            self.group,
            hard_state.term,
            data.log_store.last_index,
            cfg.bind,
            cfg.flush,
            type(loop).__module__,
            os.environ.get("GRPC_EXPERIMENTS") or "(gRPC's defaults)",  # dledger/grpc_env.py
        )

    def _new_core(self, hard_state: HardState, applied: int) -> RaftCore:
        """The core, telling followers a new commit index with the next AppendEntries or at the next tick
        rather than with an empty AppendEntries per commit (``commit_at_tick``, docs/send-budget.md), and
        stepping down as leader after two periods without a quorum heard unless [raft] says otherwise
        (``check_quorum_periods``, docs/raft.md)."""
        cfg = self.config
        return RaftCore(
            self.id,
            cfg.voters,
            self._data.log_store,
            hard_state,
            dataclasses.replace(
                cfg.raft, commit_at_tick=True, check_quorum_periods=cfg.raft.check_quorum_periods or 2
            ),
            self._rng,
            applied=applied,
            conf=base_configuration(self._data.meta_store, cfg),
            conf_checkpoint=conf_checkpoint(self._data.meta_store, self.id),
        )

    def _rebuild_core(self, applied: int) -> RaftCore:
        """A core rebuilt from what storage holds (after a refused write): the state a restart would find."""
        self._core = self._new_core(self._data.meta_store.load_hard_state(), applied)
        return self._core

    def _started_core(self) -> RaftCore:
        """The core, for what runs only once ``start`` built it (rebuilt after a full disk: read it each time)."""
        assert self._core is not None, "the core exists once the node started"
        return self._core

    def _started_ready(self) -> ReadyLoop:
        assert self._ready is not None, "the ready loop exists once the node started"
        return self._ready

    def _fail(self, exc: BaseException) -> None:
        """Something the node cannot keep its promises after: record it and stop rather than limp on."""
        self.failure = self.failure or exc
        asyncio.get_running_loop().create_task(self.stop())

    def _task_done(self, t: asyncio.Task[None]) -> None:
        if t.cancelled() or self._stopping:
            return
        exc = t.exception()
        if exc is not None:
            log.critical("%s: task %s failed; stopping the node", self.id, t.get_name(), exc_info=exc)
            self._fail(exc)

    async def stop(self, grace_s: float = 0.5) -> None:
        """Stop serving, finish the write in progress, fail what waits, close files. Idempotent."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self.peers.closing = True
        log.info("%s stopping", self.id)
        if self._server is not None:
            await self._server.health.enter_graceful_shutdown()
        self._proposals.fail_queued(
            UnavailableError(f"node {self.id} is shutting down; the append was not proposed")
        )
        # Cancelling the ready loop never cuts a write in half: a persist already handed to the single I/O
        # thread runs to completion before the stores close, which is queued behind it on the same thread.
        ready_task = self._tasks[0] if self._tasks else None
        for t in self._tasks[1:]:
            t.cancel()
        if ready_task is not None:
            ready_task.cancel()
            await asyncio.gather(ready_task, return_exceptions=True)
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        self._proposals.fail_proposed(
            f"node {self.id} shut down before the entries committed", self.commit_index
        )
        self._reads.on_role(None, -1)
        await self._snapshots.cancel()
        self.peers.fail_waiters(UnavailableError(f"node {self.id} is shutting down"))
        if self._server is not None:
            await self._server.stop(grace_s)
        plugin_close = getattr(self.plugin, "aclose", None)  # optional: background work a plugin started
        if plugin_close is not None:
            await plugin_close()
        loop = asyncio.get_running_loop()
        if self.metrics.serving:
            await loop.run_in_executor(None, self.metrics.close)
        if self.peers.transport is not None:
            await self.peers.transport.close()
        if self._ready is not None:
            await loop.run_in_executor(None, self._ready.shutdown)  # a flush in progress ends first
        try:
            await self._io.run(self._data.close, self.commit_index, self.state_machine)
        except Exception as e:  # the storage may be what failed: report it, and still finish stopping
            log.error("%s: closing storage failed: %r", self.id, e)
            self.failure = self.failure or e
        finally:
            self._io.shutdown(wait=True)
            self._snapshots.shutdown(wait=True)
            log.info("%s stopped; counters: %s", self.id, dict(sorted(self.stats.items())))
            self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- the commit seam ---------------------------------------------------------------------------------------

    def add_role_listener(self, listener: Callable[[Role, int], None]) -> None:
        """Call ``listener(role, term)`` whenever this node's role or term changes (e.g. the broker resets what
        it allocated as leader)."""
        self._role_listeners.append(listener)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Held while a client's call waits here on the leader (``NodeHandle.serving``): the ready loop of a
        follower with such calls waits for its fdatasync off the event loop (``ReadyLoop.run``)."""
        self.calls_waiting += 1
        try:
            yield
        finally:
            self.calls_waiting -= 1

    def add_commit_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(commit_index)`` whenever the commit index advances (entries are in storage by then).

        This is where a state machine's apply loop plugs in: it reads the committed entries from the log."""
        self._commit_listeners.append(listener)

    def _committed(self, commit_index: int) -> None:
        """Entries up to ``commit_index`` are committed and persisted locally: resolve waiting appends with
        (index, pos) and tell the listeners."""
        self._proposals.committed(commit_index)
        self._members.committed(commit_index)
        for listener in self._commit_listeners:
            listener(commit_index)

    def _watch_role(self) -> None:
        """After each Ready: appends of a lost leadership fail; listeners hear of a new role or term; a new
        configuration's members are dialed."""
        core = self._started_core()
        self._proposals.on_role(core, self.commit_index)
        self._members.watch_conf_changed()
        if (core.role, core.term) != self._seen_role_term:
            self._seen_role_term = (core.role, core.term)
            for listener in self._role_listeners:
                listener(core.role, core.term)
            self._members.role_changed()

    def _start_sender(self, peer: str) -> None:
        t = asyncio.create_task(self.peers.sender(peer), name=f"{self.id}-send-{peer}")
        t.add_done_callback(self._task_done)
        self._tasks.append(t)

    def _on_applied(self, chunk: list[Applied]) -> None:
        """The apply loop applied ``chunk``: resolve proposers and reads waiting for it; snapshot by policy."""
        waiters, apply = self._proposals.waiters, self._apply
        assert waiters is not None and apply is not None, "only the apply loop applies, and it has waiters"
        waiters.applied(chunk)
        self._reads.resolve_applied(apply.applied_index)
        self._snapshots.maybe_snapshot()

    def _snapshot_installed(self, index: int) -> None:
        waiters = self._proposals.waiters
        assert waiters is not None, "only a node with a state machine installs snapshot data"
        waiters.covered(index)
        self._reads.resolve_applied(index)

    # -- peers (PeerHandler; the pieces' methods, so tests can intercept them on the node) -------------------

    def handle_message(self, msg: Message) -> Coroutine[Any, Any, list[Message]]:
        return self.peers.handle_message(msg)

    def handle_batch(self, messages: list[Message]) -> asyncio.Future[list[Message]]:
        return self.peers.handle_batch(messages)

    def handle_snapshot(
        self, msg: InstallSnapshot, chunks: AsyncIterator[SnapshotChunk]
    ) -> Coroutine[Any, Any, list[Message]]:
        return self.peers.handle_snapshot(msg, chunks)

    # -- clients (ClientHandler) -------------------------------------------------------------------------------

    def _not_leader(self) -> NotLeaderError | UnavailableError:
        """Not the leader: point at the one we know (FAILED_PRECONDITION), or UNAVAILABLE when none is known."""
        core = self._core
        leader = core.leader_id if core is not None else None
        if leader and leader != self.id:
            addr = self.peers.addresses.get(leader, "?")
            return NotLeaderError(
                leader, f"node {self.id} is not the leader; the leader is {leader} at {addr}"
            )
        return UnavailableError(
            f"node {self.id} is not the leader and no leader is known (an election is under way or there is "
            "no quorum); retry shortly"
        )

    def address_of(self, node_id: str) -> str | None:
        return self.peers.addresses.get(node_id)

    def leader_address(self) -> str | None:
        leader = self._core.leader_id if self._core is not None else None
        return self.peers.addresses.get(leader) if leader else None

    async def append(self, bodies: list[bytes], prepare: Prepare | None = None) -> AppendedRun:
        """Append bodies as consecutive entries; resolves once they are committed (and synced under ``sync``).

        ``prepare(index, pos, body)`` may fill in what depends on an entry's place (see ``RaftCore.propose``)."""
        return await self._enqueue(bodies, prepare, want_results=False).future

    async def submit(
        self, bodies: list[bytes], prepare: Prepare | None = None
    ) -> list[Applied | BaseException]:
        """Append bodies and wait until the state machine has applied them; one outcome per body: an
        ``Applied`` carrying the state machine's result, or the error it returned for that entry.

        Raises like ``append`` when the entries did not commit (not leader, outcome unknown, ...)."""
        if self._apply is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine")
        p = self._enqueue(bodies, prepare, want_results=True)
        try:
            await p.future
        except BaseException:
            for f in p.applied:  # they fail too ("outcome unknown"); the caller has its answer already
                f.add_done_callback(retrieve)
            raise
        return list(await asyncio.gather(*p.applied, return_exceptions=True))

    def _enqueue(self, bodies: list[bytes], prepare: Prepare | None, want_results: bool) -> PendingAppend:
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        return self._proposals.enqueue(bodies, prepare, want_results)

    def get(self, index: int) -> Entry:
        commit = self.commit_index
        if index < 0:
            raise InvalidRequestError(f"index must be >= 0, got {index}")
        if index > commit:
            raise NotFoundError(
                f"index {index} is not committed on node {self.id} (commit index {commit}); "
                "retry later or ask the leader"
            )
        log_store = self._data.log_store
        try:
            return log_store.entry(index)
        except Compacted:
            raise NotFoundError(
                f"index {index} was compacted on node {self.id} (first index {log_store.first_index})"
            ) from None
        except IndexOutOfRange as e:
            raise NotFoundError(f"index {index} is not held by node {self.id}: {e}") from None

    def metadata(self) -> NodeInfo:
        st = self._started_core().status()
        leader = st.leader
        return NodeInfo(
            group=self.group,
            node_id=self.id,
            address=self.config.address,
            role=_ROLE_NAMES.get(st.role, str(st.role)),
            term=st.term,
            leader_id=leader,
            leader_address=self.peers.addresses.get(leader) if leader else None,
            last_index=st.last_index,
            commit_index=self.commit_index,  # what this node holds in storage and serves (core may be ahead)
            applied_index=self._apply.applied_index if self._apply is not None else self.commit_index,
            peers=tuple(
                PeerInfo(
                    p,
                    a,
                    st.match.get(p, -1) if st.role is Role.LEADER else -1,
                    "voter" if p in st.voters else "learner" if p in st.learners else "",
                )
                for p, a in sorted(self.peers.addresses.items())
            ),
            data_dir=str(self.config.data_dir),
            pid=os.getpid(),
            flush=self.config.flush,
            voters=st.voters,
            learners=st.learners,
            conf_index=st.conf_index,
        )

    async def transfer_leadership(self, target: str) -> str:
        if target not in self.peers.addresses:
            raise InvalidRequestError(
                f"unknown node {target!r}; members: {', '.join(sorted(self.peers.addresses))}"
            )
        core = self._started_core()
        if core.role is not Role.LEADER:
            raise self._not_leader()
        if target == self.id:
            return self.id
        core.transfer_leadership(target)
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * self.config.raft.election_timeout_max_ms / 1000
        while loop.time() < deadline:
            if core.leader_id == target or (core.role is not Role.LEADER and core.leader_id):
                return core.leader_id
            await asyncio.sleep(self.config.raft.tick_ms / 1000)
        raise UnavailableError(
            f"leadership transfer to {target} did not complete in time; {core.leader_id} leads"
        )

    async def change_membership(
        self, kind: str, node_id: str, address: str
    ) -> tuple[int, int, tuple[str, ...], tuple[str, ...]]:
        """One membership change on the leader, answered once its config entry committed (``Membership.change``,
        docs/membership.md)."""
        return await self._members.change(kind, node_id, address)

    async def read_index(self, timeout_s: float | None = None) -> int:
        """A linearizable read point (Raft thesis 6.4): the leader confirms with a quorum that it still leads,
        then waits until its state machine has applied the commit index it had when asked. State read after
        this returns reflects every write acknowledged before the call.

        Raises ``NotLeaderError``/``UnavailableError`` (retriable) when this node is not, or stops being, the
        leader, or cannot reach a quorum within ``timeout_s`` (default: twice the maximum election timeout)."""
        if self._stopping:
            raise UnavailableError(f"node {self.id} is shutting down")
        if timeout_s is None:
            timeout_s = 2 * self.config.raft.election_timeout_max_ms / 1000
        return await self._reads.read_index(timeout_s)

    async def linearizable_read(self, read: Callable[[StateMachine], object]) -> object:
        """``read(state_machine)`` after ``read_index()``: e.g. ``await node.linearizable_read(lambda kv:
        kv.get(b"k"))``. ``read`` runs on the loop and must not block."""
        if self.state_machine is None:
            raise InvalidRequestError(f"node {self.id} runs no state machine")
        await self.read_index()
        return read(self.state_machine)

    async def wait_applied(self, index: int) -> None:
        """Return once the state machine has applied ``index`` (the caller bounds the wait): for a plugin that
        learned a read point from the leader (``dledger.security.catchup``)."""
        await self._reads.wait_applied(index)

    async def take_snapshot(self) -> SnapshotInfo | None:
        """Save the state machine as of its applied index, then compact the log before it (see
        ``Snapshots.take``); None when nothing was applied since the last snapshot."""
        return await self._snapshots.take()

    async def snapshot_now(self) -> tuple[bool, SnapshotInfo | None, int]:
        """On demand (``dledger snapshot``): (taken, newest snapshot, first log index afterwards)."""
        return await self._snapshots.snapshot_now()

    def backup(self) -> AsyncIterator[tuple[str, int, bytes]]:
        """An online backup of the group as this node holds it: (file, offset, data) chunks
        (``dledger.runtime.backup``; docs/operations.md)."""
        core = self._started_core()
        return backup_chunks(
            self.log_store,
            self._snapshots.snapshot_now,
            self._snapshots.stream,
            lambda: core.commit_index,
            core.configuration_at,
            self.config.group,
            self.state_machine.name if self.state_machine is not None else "",
            self.config.raft.segment_size,
        )

    def reload_certificates(self) -> ReloadSummary:
        """Read the ``[security]`` certificate, key and CA bundle again and use them without a restart (SIGHUP,
        ``dledger cert reload``; docs/security.md "Rotating certificates"): new TLS handshakes get the new
        certificate, peers are dialled anew with it (``NodeSecurity.reload``). ConfigError when there is no
        ``[security]`` or the files cannot serve (the old ones stay)."""
        return self._security.reload(self.peers.transport)

    # -- introspection -----------------------------------------------------------------------------------------

    @property
    def core(self) -> RaftCore | None:
        return self._core

    @property
    def log_store(self) -> LogStore:
        return self._data.log_store

    # The typed handle plugins get (dledger.plugins.NodeHandle) reads the role through these, not the core.
    @property
    def term(self) -> int:
        return self._core.term if self._core is not None else -1

    @property
    def leader_id(self) -> str | None:
        """The leader this node knows of (itself when leading); None when none is known."""
        return self._core.leader_id if self._core is not None else None

    def is_leader(self) -> bool:
        return self._core is not None and self._core.role is Role.LEADER

    @property
    def commit_index(self) -> int:
        """The highest index committed and persisted on this node (the core may know of a higher one)."""
        return self._ready.commit_index if self._ready is not None else -1

    @property
    def transport(self) -> PeerTransport | None:
        return self.peers.transport

    @property
    def snapshots(self) -> SnapshotStore | None:
        """The snapshot files (None until start, and without a state machine)."""
        return self._snapshots.store

    @property
    def snapshot_in_progress(self) -> bool:
        return self._snapshots.task is not None

    @property
    def disk_full(self) -> str | None:
        """Why writes are refused (a full disk), or None."""
        return self._ready.disk_full if self._ready is not None else None
