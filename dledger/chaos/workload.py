"""Client workloads that run while the nemesis injects faults, recording every outcome in a ``History``.

- ``Producers``: concurrent idempotent producers (``broker_adapter.client.Producer``), one message per send.
  Each message's id is fixed before the first attempt, so a retry is recognised by the leader and stored once.
  A send is ``ok`` with the place the leader assigned, ``fail`` only when the broker rejected it as invalid
  (nothing was stored), and ``info`` otherwise: after a timeout or a lost leader the client cannot know.
- ``Consumers``: a consumer group; each consumer owns a fixed share of the queues, pulls from the leader,
  records what it received and commits the next offset after each batch. After an error it restarts from the
  group's committed offsets (recorded, so a checker can tell a redelivery after a restart from a duplicate).
- ``Registers``: clients of the KV service's registers (``dledger.chaos.register``): writes of unique values
  and reads of a few keys, for the linearizability checker.

Every workload runs in threads (the clients are synchronous), bounded by ``stop()`` and by its deadlines.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence

from broker_adapter.client import Consumer, Producer
from dledger.chaos.history import FAIL, INFO, INVOKE, OK, History
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError

TOPIC = "chaos"
GROUP = "chaos-consumers"


def message_body(producer: str, seq: int, size: int) -> bytes:
    head = f"chaos|{producer}|{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


class _Workers:
    """Threads that loop until ``stop()``; a crash of a worker is recorded, not swallowed."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.crashes: list[str] = []

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as e:  # a bug in the workload must fail the run, loudly
                self.crashes.append(f"{name}: {type(e).__name__}: {e}")
                raise

        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"workload threads did not stop within {timeout_s} s: {alive}")


class Producers(_Workers):
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


class Consumers(_Workers):
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


class Registers(_Workers):
    """Clients of the register service: random writes of unique values and reads, over a few keys at a time.

    A key takes at most ``ops_per_key`` operations, then the clients move on to fresh keys, so that each
    key's history stays small enough for the linearizability checker (WGL is exponential in the worst case).
    A write that was refused is ``fail``; one whose outcome is unknown is ``info`` and is never retried (a
    register write is not idempotent)."""

    def __init__(
        self,
        history: History,
        servers: Sequence[str],
        *,
        clients: int = 3,
        keys: int = 3,
        ops_per_key: int = 60,
        read_fraction: float = 0.5,
        timeout_s: float = 1.0,
        seed: int = 0,
    ):
        super().__init__()
        self.history = history
        self.servers = list(servers)
        self.clients = clients
        self.keys = keys
        self.ops_per_key = ops_per_key
        self.read_fraction = read_fraction
        self.timeout_s = timeout_s
        self.seed = seed
        self._ops = itertools.count()

    def start(self) -> None:
        for i in range(self.clients):
            self._spawn(f"register-{i}", lambda i=i: self._run(f"r{i}", random.Random(self.seed * 1000 + i)))

    def _run(self, name: str, rng: random.Random) -> None:
        from dledger.chaos.register import RegisterClient
        from dledger.errors import NotLeaderError, OutcomeUnknownError, UnavailableError

        h = self.history
        client = RegisterClient(self.servers, self.timeout_s)
        try:
            written = 0
            while not self.stopping:
                n = next(self._ops)
                key = f"k{n // (self.ops_per_key * self.keys)}-{rng.randrange(self.keys)}"
                if rng.random() < self.read_fraction:
                    h.add(name, INVOKE, "read", key=key)
                    try:
                        value = client.get(key)
                    except (NotLeaderError, UnavailableError, InvalidRequestError) as e:
                        h.add(name, FAIL, "read", key=key, error=str(e)[:160])
                    except DLedgerError as e:
                        h.add(name, INFO, "read", key=key, error=f"{type(e).__name__}: {str(e)[:160]}")
                    else:
                        h.add(name, OK, "read", key=key, value=value)
                        continue
                    self._stop.wait(0.02)
                else:
                    value = f"{name}-{written}"
                    written += 1
                    h.add(name, INVOKE, "write", key=key, value=value)
                    try:
                        client.put(key, value)
                    except OutcomeUnknownError as e:
                        h.add(name, INFO, "write", key=key, value=value, error=str(e)[:160])
                    except (NotLeaderError, UnavailableError, InvalidRequestError) as e:
                        h.add(name, FAIL, "write", key=key, value=value, error=str(e)[:160])
                    except DLedgerError as e:
                        h.add(
                            name,
                            INFO,
                            "write",
                            key=key,
                            value=value,
                            error=f"{type(e).__name__}: {str(e)[:160]}",
                        )
                    else:
                        h.add(name, OK, "write", key=key, value=value)
                        continue
                    self._stop.wait(0.02)  # after a failure: do not spin against a node that is down
        finally:
            client.close()
