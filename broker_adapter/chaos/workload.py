"""The broker's chaos workload (``dledger chaos --workload broker``), recording every outcome in a ``History``.

- ``Producers``: concurrent idempotent producers (``broker_adapter.client.Producer``), one message per send.
  Each message's id is fixed before the first attempt, so a retry is recognised by the leader and stored once.
  A send is ``ok`` with the place the leader assigned, ``fail`` only when the broker rejected it as invalid
  (nothing was stored), and ``info`` otherwise: after a timeout or a lost leader the client cannot know.
- ``Consumers``: a consumer group; each consumer owns a fixed share of the queues, pulls from the leader,
  records what it received and commits the next offset after each batch. After an error it restarts from the
  group's committed offsets (recorded, so a checker can tell a redelivery after a restart from a duplicate).
- ``BrokerWorkload``: both on a broker group, found by the chaos runner through the entry point ``broker`` of
  ``dledger.chaos_workloads``; judged by ``broker_adapter.chaos.checkers`` and, with ``audit``, by the Spark
  audit of the final files (``dledger audit`` in its own process: it starts a JVM).

With ``--cluster N`` the workload brings its own topology: a local cluster (``broker_adapter/cluster/local.py``)
of N proxied groups and a name server. Producers and consumers then find the groups **through the name server**
(``Locator``): a producer sends round robin over every queue of every group the topic's route names, each group
through its own idempotent ``Producer``; consumer k owns every count-th (group, queue) of the route. Every event
names its group, and the checkers judge each group's events against that group's files (a message acknowledged
by one group and stored by another is "sent by no producer" there). A client whose group's addresses changed
(a membership fault replaced nodes) is made again from the new ones, as after a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_adapter.chaos import checkers
from broker_adapter.client import BrokerConnection, Consumer, Producer
from broker_adapter.nameserver.client import NameServerClient
from dledger import group as grp
from dledger.chaos.checkers import Verdict
from dledger.chaos.history import FAIL, INFO, INVOKE, OK, Event, History, operations
from dledger.chaos.workload import Judged, Topology, Workers, Workload
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError
from dledger.security.config import ClientSecurity

TOPIC = "chaos"
GROUP = "chaos-consumers"


def message_body(producer: str, seq: int, size: int) -> bytes:
    head = f"chaos|{producer}|{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


ROUTE_TTL_S = 5.0  # how long a producer or consumer keeps the name server's route before asking again


class Locator:
    """Where the workload's groups are. One group: its addresses from group.json (membership faults keep it
    current), the queues chosen by the producer. A cluster: the name servers' route of the topic."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        directory: Path | None = None,
        nameservers: bool = False,
        security: ClientSecurity | None = None,
    ):
        self.servers = list(servers)
        self.directory = directory
        self.security = security
        self.nameservers = nameservers
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[str, ...]] = {}
        self._queues: list[tuple[str, int | None]] = []
        self._fetched = -ROUTE_TTL_S

    def places(self, refresh: bool = False) -> list[tuple[str, int | None]]:
        """(group, queue) to send to: every queue of every group with the topic (queue None: the producer's
        own choice, one group)."""
        if not self.nameservers:
            return [("", None)]
        self._refresh(refresh)
        with self._lock:
            return list(self._queues)

    def addresses(self, group: str) -> tuple[str, ...]:
        if not self.nameservers:
            if self.directory is not None:
                g = grp.load(self.directory, missing_ok=True)
                if g is not None:
                    return tuple(g.addresses)
            return tuple(self.servers)
        self._refresh(False)
        with self._lock:
            return self._routes.get(group, ())

    def _refresh(self, force: bool) -> None:
        if not force and time.monotonic() - self._fetched < ROUTE_TTL_S:
            return
        try:
            with NameServerClient(self.servers, timeout_s=2.0, security=self.security) as ns:
                routes = ns.route(TOPIC)
        except DLedgerError:
            return  # the last route stays in use; asked again at the next failure
        with self._lock:
            self._fetched = time.monotonic()
            for r in routes:
                rest = [a for a in r.addresses if a != r.leader_address]
                self._routes[r.group] = tuple([r.leader_address, *rest] if r.leader_address else rest)
            self._queues = [(r.group, q) for r in routes for q in range(r.queues)]


class Clients:
    """One client per group, made again when the group's addresses changed (new members, dead ones gone)."""

    def __init__(self, locator: Locator, make):
        self.locator = locator
        self.make = make  # (group, addresses, generation) -> client
        self._clients: dict[str, tuple[tuple[str, ...], Any]] = {}
        self._generation = 0

    def get(self, group: str) -> Any:
        addresses = self.locator.addresses(group)
        held = self._clients.get(group)
        if held is not None and (held[0] == addresses or not addresses):
            return held[1]
        if held is not None:
            held[1].close()
        self._generation += 1
        client = self.make(group, list(addresses), self._generation)
        self._clients[group] = (addresses, client)
        return client

    def close(self) -> None:
        for _, c in self._clients.values():
            c.close()
        self._clients.clear()


class Producers(Workers):
    def __init__(
        self,
        history: History,
        locator: Locator,
        *,
        count: int = 3,
        body_size: int = 128,
        rate_per_s: float = 0.0,  # per producer; 0 = as fast as acknowledgements come back
        timeout_s: float = 2.0,
        retry_for_s: float = 6.0,
        topic: str = TOPIC,
    ):
        super().__init__()
        self.history = history
        self.locator = locator
        self.count = count
        self.body_size = body_size
        self.rate_per_s = rate_per_s
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self.topic = topic

    def start(self) -> None:
        for i in range(self.count):
            self._spawn(f"producer-{i}", lambda i=i: self._run(f"p{i}"))

    def _run(self, name: str) -> None:
        h = self.history
        producers = Clients(
            self.locator,
            lambda group, servers, gen: Producer(
                servers,
                producer_id=f"chaos-{name}" + (f"@{group}" if group else "") + (f"#{gen}" if gen > 1 else ""),
                timeout_s=self.timeout_s,
                retry_for_s=self.retry_for_s,
                security=self.locator.security,
            ),
        )
        try:
            seq = 0
            refresh = False
            while not self.stopping:
                started = time.monotonic()
                places = self.locator.places(refresh)
                if not places:
                    h.add(name, INFO, "route", error=f"no route for {self.topic} yet")
                    self._stop.wait(0.2)
                    refresh = True
                    continue
                group, queue = places[seq % len(places)]
                where = {"group": group} if group else {}
                producer = producers.get(group)
                msg = producer.outgoing(self.topic, message_body(name, seq, self.body_size), queue_id=queue)
                h.add(name, INVOKE, "send", msg_id=msg.msg_id, queue_id=msg.queue_id, seq=seq, **where)
                refresh = False
                try:
                    r = producer.send_messages(self.topic, [msg])[0]
                except (InvalidRequestError, NotFoundError) as e:
                    h.add(name, FAIL, "send", msg_id=msg.msg_id, error=str(e)[:200], **where)
                except DLedgerError as e:
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                    h.add(name, INFO, "send", msg_id=msg.msg_id, error=err, **where)
                    refresh = True
                else:
                    h.add(
                        name,
                        OK,
                        "send",
                        msg_id=r.msg_id,
                        queue_id=r.queue_id,
                        queue_offset=r.queue_offset,
                        commitlog_offset=r.commitlog_offset,
                        duplicate=r.duplicate,
                        **where,
                    )
                seq += 1
                if self.rate_per_s > 0:
                    self._stop.wait(max(0.0, 1.0 / self.rate_per_s - (time.monotonic() - started)))
        finally:
            producers.close()


class Consumers(Workers):
    """A consumer group; consumer k owns the k-th of every ``count`` places (group, queue) of the route."""

    def __init__(
        self,
        history: History,
        locator: Locator,
        queues: int,
        *,
        count: int = 2,
        group: str = GROUP,
        topic: str = TOPIC,
        batch: int = 64,
        timeout_s: float = 2.0,
        retry_for_s: float = 6.0,
    ):
        super().__init__()
        self.history = history
        self.locator = locator
        self.queues = queues  # per group
        self.count = count
        self.group = group
        self.topic = topic
        self.batch = batch
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        # Set by drain_to(): the consumers stop once every queue they own reached these end offsets.
        self._targets: dict[tuple[str, int], int] | None = None
        self._positions: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self.restarts = 0

    def start(self) -> None:
        for k in range(self.count):
            self._spawn(f"consumer-{k}", lambda k=k: self._run(k))

    def drain_to(self, end_offsets: dict[tuple[str, int], int], timeout_s: float) -> bool:
        """Let the consumers run until each queue is consumed up to ``end_offsets``; True if they got there."""
        with self._lock:
            self._targets = dict(end_offsets)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._caught_up() or all(not t.is_alive() for t in self._threads):
                break
            self._stop.wait(0.05)
        done = self._caught_up()
        self.stop()
        return done

    def _caught_up(self) -> bool:
        with self._lock:
            if self._targets is None:
                return False
            return all(self._positions.get(q, 0) >= end for q, end in self._targets.items())

    def _mine(self, k: int) -> list[tuple[str, int]]:
        groups = sorted({g for g, _ in self.locator.places()})
        return [(g, q) for g in groups for q in range(self.queues)][k :: self.count]

    def _run(self, k: int) -> None:
        name = f"c{k}"
        h = self.history
        consumers = Clients(
            self.locator,
            lambda group, servers, gen: Consumer(
                servers,
                self.group,
                timeout_s=self.timeout_s,
                retry_for_s=self.retry_for_s,
                security=self.locator.security,
            ),
        )
        mine = self._mine(k)
        while not mine and not self.stopping:
            self._stop.wait(0.2)
            mine = self._mine(k)
        try:
            offsets = self._load(consumers, name, mine)
            while not self.stopping:
                if offsets is None:
                    self._stop.wait(0.2)  # the group could not be read: try again shortly
                    offsets = self._load(consumers, name, mine)
                    continue
                idle = True
                try:
                    for g, q in mine:
                        where = {"group": g} if g else {}
                        consumer = consumers.get(g)
                        msgs = consumer.pull(self.topic, q, offsets[(g, q)], self.batch)
                        if not msgs:
                            continue
                        idle = False
                        for m in msgs:
                            h.add(
                                name,
                                OK,
                                "consume",
                                msg_id=m.msg_id,
                                queue_id=q,
                                queue_offset=m.queue_offset,
                                **where,
                            )
                        nxt = msgs[-1].queue_offset + 1
                        h.add(name, INVOKE, "commit", queue_id=q, offset=nxt, **where)
                        try:
                            consumer.commit(self.topic, q, nxt)
                        except DLedgerError as e:
                            h.add(name, INFO, "commit", queue_id=q, offset=nxt, error=str(e)[:200], **where)
                            raise
                        h.add(name, OK, "commit", queue_id=q, offset=nxt, **where)
                        offsets[(g, q)] = nxt
                        with self._lock:
                            self._positions[(g, q)] = nxt
                except DLedgerError as e:
                    h.add(name, INFO, "restart", error=f"{type(e).__name__}: {str(e)[:200]}")
                    with self._lock:
                        self.restarts += 1
                    self.locator.places(refresh=True)
                    offsets = self._load(consumers, name, mine)
                    continue
                if idle:
                    if self._caught_up():
                        return
                    g, q = mine[0]
                    try:  # long-poll one queue so an idle consumer does not spin
                        consumers.get(g).pull(self.topic, q, offsets[(g, q)], 1, wait_ms=100)
                    except DLedgerError:
                        self._stop.wait(0.05)
        finally:
            consumers.close()

    def _load(
        self, consumers: Clients, name: str, mine: list[tuple[str, int]]
    ) -> dict[tuple[str, int], int] | None:
        """The group's committed offsets for this consumer's queues (0 where nothing was committed); one
        ``load-offsets`` event per group."""
        offsets: dict[tuple[str, int], int] = {}
        try:
            for g, q in mine:
                offsets[(g, q)] = consumers.get(g).committed(self.topic, q) or 0
        except DLedgerError as e:
            self.history.add(name, INFO, "load-offsets", error=str(e)[:200])
            return None
        for g in sorted({g for g, _ in mine}):
            where = {"group": g} if g else {}
            loaded = {str(q): o for (gg, q), o in offsets.items() if gg == g}
            self.history.add(name, OK, "load-offsets", offsets=loaded, **where)
        with self._lock:
            self._positions.update(offsets)
        return offsets


class BrokerWorkload(Workload):
    """Producers and a consumer group on a broker group, or on a cluster of them (the topic created first)."""

    state_machine = "broker"
    progress = ("send",)

    def __init__(self, cfg: Any, history: History):
        super().__init__()
        self.cfg = cfg
        self.history = history
        self.consumers: Consumers | None = None
        self.locator: Locator | None = None
        self.cluster: Any = None  # broker_adapter.cluster.local.ClusterSpec of a --cluster run
        self.security: ClientSecurity | None = None
        self.directory: Path | None = None

    def topology(self, cfg: Any, raft: dict[str, int]) -> Topology:
        if cfg.groups <= 1:
            top = super().topology(cfg, raft)
            self.directory = top.groups[0][0]
            self.security = ClientSecurity.from_file(Path(top.security)) if top.security else None
            return top
        from broker_adapter.cluster import local

        cluster = self.cluster = local.create(
            cfg.directory,
            cfg.groups,
            cfg.nodes,
            1,
            flush=cfg.flush,
            raft=dict(raft),
            heartbeat_ms=500,
            secure=cfg.secure,
            proxied=cfg.proxied,
        )
        self.security = cluster.client_security()
        if cfg.secure:
            self.before_join = self._issue_certificate

        def start() -> None:
            for n in cluster.nameservers:
                local.start_nameserver(n)

        def stop() -> None:
            for n in cluster.nameservers:
                local.stop_nameserver(n)

        groups = [(Path(cluster.directory) / g, cluster.group(g)) for g in cluster.groups]
        return Topology(groups, cluster.nameserver_addresses, cluster.security, start, stop)

    def _issue_certificate(self, group: grp.GroupSpec, node_id: str) -> None:
        """A joining node of a secure cluster's group: its certificate from the cluster's CA, naming its group
        (the by-hand path of docs/security.md, "Adding a node", which ``member add`` then finds in place)."""
        from broker_adapter.cluster import local

        local.issue_member_certificate(self.cluster, group.name, node_id)

    def start(self, servers: Sequence[str]) -> None:
        cfg = self.cfg
        if self.cluster is not None:
            from broker_adapter.cluster import local

            local.wait_registered(self.cluster, 30.0)
            local.create_topic(self.cluster, TOPIC, cfg.queues)
            self.locator = Locator(servers, nameservers=True, security=self.security)
        else:
            with BrokerConnection(servers, timeout_s=2.0, retry_for_s=30.0, security=self.security) as admin:
                if TOPIC not in {t.topic for t in admin.list_topics()}:
                    admin.create_topic(TOPIC, cfg.queues)
            self.locator = Locator(servers, directory=self.directory, security=self.security)
        producers = Producers(self.history, self.locator, count=cfg.producers, body_size=cfg.body_size)
        self.consumers = Consumers(self.history, self.locator, cfg.queues, count=cfg.consumers)
        self.workers = [producers, self.consumers]
        super().start(servers)

    def finish(self, servers: Sequence[str], notes: list[str]) -> None:
        """Let the consumer group run to the end of every queue of every group."""
        assert self.locator is not None
        ends: dict[tuple[str, int], int] = {}
        groups = sorted({g for g, _ in self.locator.places(refresh=True)})
        for g in groups:
            with BrokerConnection(
                list(self.locator.addresses(g)), timeout_s=2.0, retry_for_s=30.0, security=self.security
            ) as admin:
                info = {t.topic: t for t in admin.list_topics()}[TOPIC]
            ends.update({(g, q): off for q, off in enumerate(info.max_offsets)})
        if self.consumers is not None and not self.consumers.drain_to(ends, 90):
            notes.append(f"the consumer group did not reach the end offsets {ends} within 90 s")

    def judge(
        self, events: Sequence[Event], groups: Sequence[Judged]
    ) -> tuple[list[Verdict], dict[str, int]]:
        several = len(groups) > 1
        verdicts: list[Verdict] = []
        for j in groups:
            mine = [e for e in events if e.value.get("group", j.name) == j.name] if several else list(events)
            logs = checkers.read_group([(n.id, n.data_dir) for n in j.group.nodes], j.commit_index)
            here = [
                checkers.check_acked_present(mine, logs, TOPIC),
                checkers.check_nothing_unsent(mine, logs, TOPIC),
                checkers.check_queue_order(logs, TOPIC),
            ]
            suffix = f" {j.name}" if several else ""
            ack_log = write_ack_log(mine, self.cfg.out / f"acks{suffix.replace(' ', '-')}.jsonl")
            if self.cfg.audit:
                report = self.cfg.out / (f"audit-{j.name}" if several else "audit")
                here.append(spark_audit(j, ack_log, report))
            for v in here:
                v.name += suffix
            verdicts += here
        return verdicts, checkers.summarize_sends(events)


def write_ack_log(events: Sequence[Event], path: Path) -> Path:
    """The producers' outcomes in the audit's ack-log format (acknowledged, or ``acked: false`` if unknown)."""
    with open(path, "w") as f:
        for o in operations(events, "send"):
            if o.type == OK:
                rec = {k: o.value[k] for k in ("msg_id", "queue_id", "queue_offset", "commitlog_offset")}
                f.write(json.dumps({"topic": TOPIC, **rec}) + "\n")
            elif o.type == INFO:
                f.write(json.dumps({"msg_id": o.value["msg_id"], "acked": False}) + "\n")
    return path


def audited_directories(group: Judged) -> tuple[list[str], list[str]]:
    """(the members' node directories, the names of the former members' directories left in the group's)."""
    members = [n.data_dir for n in group.group.nodes]
    former = sorted(
        p.name
        for p in group.directory.iterdir()
        if (p / "data").is_dir() and str(p.resolve()) not in {str(Path(m).resolve()) for m in members}
    )
    return members, former


def spark_audit(group: Judged, ack_log: Path, report: Path, timeout_s: float = 600) -> Verdict:
    """Checker 4: ``dledger audit`` of the final files, in its own process (it starts a JVM). The audit reads
    the group's members at the end: a node removed or replaced by a membership fault left its directory in the
    group's (``dledger.group_members``), with a log that stops where it left; it is not a member to judge."""
    v = Verdict("spark_audit")
    members, former = audited_directories(group)
    v.stats["members"] = [n.id for n in group.group.nodes]
    v.stats["former_members_skipped"] = former
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dledger",
            "audit",
            *members,
            "--ack-log",
            str(ack_log),
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    v.stats["exit_status"] = proc.returncode
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        v.violation(f"dledger audit exited {proc.returncode}: " + " | ".join(tail))
    return v
