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
from dledger.chaos.checkers import Verdict
from dledger.chaos.history import FAIL, INFO, INVOKE, OK, Event, History, operations
from dledger.chaos.workload import Workers, Workload
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError

TOPIC = "chaos"
GROUP = "chaos-consumers"


def message_body(producer: str, seq: int, size: int) -> bytes:
    head = f"chaos|{producer}|{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


class Producers(Workers):
    def __init__(
        self,
        history: History,
        servers: Sequence[str],
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
        self.servers = list(servers)
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
        with Producer(
            self.servers, producer_id=f"chaos-{name}", timeout_s=self.timeout_s, retry_for_s=self.retry_for_s
        ) as producer:
            seq = 0
            while not self.stopping:
                started = time.monotonic()
                msg = producer.outgoing(self.topic, message_body(name, seq, self.body_size))
                h.add(name, INVOKE, "send", msg_id=msg.msg_id, queue_id=msg.queue_id, seq=seq)
                try:
                    r = producer.send_messages(self.topic, [msg])[0]
                except (InvalidRequestError, NotFoundError) as e:
                    h.add(name, FAIL, "send", msg_id=msg.msg_id, error=str(e)[:200])
                except DLedgerError as e:
                    h.add(name, INFO, "send", msg_id=msg.msg_id, error=f"{type(e).__name__}: {str(e)[:200]}")
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
                    )
                seq += 1
                if self.rate_per_s > 0:
                    self._stop.wait(max(0.0, 1.0 / self.rate_per_s - (time.monotonic() - started)))


class Consumers(Workers):
    """A consumer group; consumer k owns the queues q with q % count == k."""

    def __init__(
        self,
        history: History,
        servers: Sequence[str],
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
        self.servers = list(servers)
        self.queues = queues
        self.count = count
        self.group = group
        self.topic = topic
        self.batch = batch
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        # Set by drain_to(): the consumers stop once every queue they own reached these end offsets.
        self._targets: dict[int, int] | None = None
        self._positions: dict[int, int] = {}
        self._lock = threading.Lock()
        self.restarts = 0

    def start(self) -> None:
        for k in range(self.count):
            self._spawn(f"consumer-{k}", lambda k=k: self._run(k))

    def drain_to(self, end_offsets: dict[int, int], timeout_s: float) -> bool:
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

    def _run(self, k: int) -> None:
        name = f"c{k}"
        h = self.history
        mine = [q for q in range(self.queues) if q % self.count == k]
        with Consumer(
            self.servers, self.group, timeout_s=self.timeout_s, retry_for_s=self.retry_for_s
        ) as consumer:
            offsets = self._load(consumer, name, mine)
            while not self.stopping:
                if offsets is None:
                    self._stop.wait(0.2)  # the group could not be read: try again shortly
                    offsets = self._load(consumer, name, mine)
                    continue
                idle = True
                try:
                    for q in mine:
                        msgs = consumer.pull(self.topic, q, offsets[q], self.batch)
                        if not msgs:
                            continue
                        idle = False
                        for m in msgs:
                            h.add(
                                name, OK, "consume", msg_id=m.msg_id, queue_id=q, queue_offset=m.queue_offset
                            )
                        nxt = msgs[-1].queue_offset + 1
                        h.add(name, INVOKE, "commit", queue_id=q, offset=nxt)
                        try:
                            consumer.commit(self.topic, q, nxt)
                        except DLedgerError as e:
                            h.add(name, INFO, "commit", queue_id=q, offset=nxt, error=str(e)[:200])
                            raise
                        h.add(name, OK, "commit", queue_id=q, offset=nxt)
                        offsets[q] = nxt
                        with self._lock:
                            self._positions[q] = nxt
                except DLedgerError as e:
                    h.add(name, INFO, "restart", error=f"{type(e).__name__}: {str(e)[:200]}")
                    with self._lock:
                        self.restarts += 1
                    offsets = self._load(consumer, name, mine)
                    continue
                if idle:
                    if self._caught_up():
                        return
                    try:  # long-poll one queue so an idle consumer does not spin
                        consumer.pull(self.topic, mine[0], offsets[mine[0]], 1, wait_ms=100)
                    except DLedgerError:
                        self._stop.wait(0.05)

    def _load(self, consumer: Consumer, name: str, mine: list[int]) -> dict[int, int] | None:
        """The group's committed offsets for this consumer's queues (0 where nothing was committed)."""
        try:
            offsets = {q: consumer.committed(self.topic, q) or 0 for q in mine}
        except DLedgerError as e:
            self.history.add(name, INFO, "load-offsets", error=str(e)[:200])
            return None
        self.history.add(name, OK, "load-offsets", offsets={str(q): o for q, o in offsets.items()})
        with self._lock:
            for q, o in offsets.items():
                self._positions[q] = o
        return offsets


class BrokerWorkload(Workload):
    """Producers and a consumer group on a broker group (the topic created first)."""

    state_machine = "broker"
    progress = ("send",)

    def __init__(self, cfg: Any, history: History):
        super().__init__()
        self.cfg = cfg
        self.history = history
        self.consumers: Consumers | None = None

    def start(self, servers: Sequence[str]) -> None:
        cfg = self.cfg
        with BrokerConnection(servers, timeout_s=2.0, retry_for_s=30.0) as admin:
            if TOPIC not in {t.topic for t in admin.list_topics()}:
                admin.create_topic(TOPIC, cfg.queues)
        producers = Producers(self.history, servers, count=cfg.producers, body_size=cfg.body_size)
        self.consumers = Consumers(self.history, servers, cfg.queues, count=cfg.consumers)
        self.workers = [producers, self.consumers]
        super().start(servers)

    def finish(self, servers: Sequence[str], notes: list[str]) -> None:
        """Let the consumer group run to the end of every queue."""
        with BrokerConnection(servers, timeout_s=2.0, retry_for_s=30.0) as admin:
            info = {t.topic: t for t in admin.list_topics()}[TOPIC]
        ends = {q: off for q, off in enumerate(info.max_offsets)}
        if self.consumers is not None and not self.consumers.drain_to(ends, 90):
            notes.append(f"the consumer group did not reach the end offsets {ends} within 90 s")

    def judge(
        self, events: Sequence[Event], group: Any, commit_index: int
    ) -> tuple[list[Verdict], dict[str, int]]:
        logs = checkers.read_group([(n.id, n.data_dir) for n in group.nodes], commit_index)
        verdicts = [
            checkers.check_acked_present(events, logs, TOPIC),
            checkers.check_nothing_unsent(events, logs, TOPIC),
            checkers.check_queue_order(logs, TOPIC),
        ]
        ack_log = write_ack_log(events, self.cfg.out / "acks.jsonl")
        if self.cfg.audit:
            verdicts.append(spark_audit(self.cfg.directory, ack_log, self.cfg.out / "audit"))
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


def spark_audit(directory: Path, ack_log: Path, report: Path, timeout_s: float = 600) -> Verdict:
    """Checker 4: ``dledger audit`` of the final files, in its own process (it starts a JVM)."""
    v = Verdict("spark_audit")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dledger",
            "audit",
            str(directory),
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
