"""The KV workload of a chaos run: clients of linearizable registers, and the linearizability checker's verdict.

The registers are the built-in KV store's gRPC service (``state_machine = "kv"``, ``dledger.v1.KV``: puts
through the log, gets through the leader's read index).

Unlike ``dledger.kv.client`` (which retries within a deadline), one call here is one attempt set with a
few not-leader redirects, and every failure is classified for the history: NotLeaderError / UnavailableError
(not done) or OutcomeUnknownError (may have been done), which is what the linearizability checker needs. The
leader routing and the error table are the clients' own (``dledger.routing``, ``dledger.transport.convert``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from dledger.chaos import checkers
from dledger.chaos.history import FAIL, INFO, INVOKE, OK, Event, History, operations
from dledger.chaos.workload import Workers, Workload
from dledger.connections import Channels
from dledger.errors import (
    DLedgerError,
    InvalidRequestError,
    NotLeaderError,
    OutcomeUnknownError,
    UnavailableError,
)
from dledger.routing import Router
from dledger.transport import convert
from dledger.v1 import kv_pb2, kv_pb2_grpc


class RegisterClient:
    """A synchronous client of the register service that follows the leader (``dledger.routing.Router``); one
    call = one attempt set. Errors are rebuilt by ``dledger.transport.convert.error_from_rpc``, which tells a
    write whose call broke in flight (``OutcomeUnknownError``) from one that was refused or never sent."""

    def __init__(self, servers: Sequence[str], timeout_s: float = 1.0):
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self._channels = Channels(None)
        self._router = Router(self.servers)

    def _call(self, fn: Callable[[kv_pb2_grpc.KVStub], Any], address: str, write: bool) -> Any:
        try:
            return fn(self._channels.stub(address, kv_pb2_grpc.KVStub))
        except grpc.RpcError as e:
            raise convert.error_from_rpc(e, address, write=write) from None

    def call(self, fn: Callable[[kv_pb2_grpc.KVStub], Any], *, write: bool, redirects: int = 2) -> Any:
        """Send to the known leader (or the next server); follow up to ``redirects`` not-leader hints. Errors
        propagate: NotLeaderError / UnavailableError (not done), OutcomeUnknownError (may have been done)."""
        for _ in range(redirects + 1):
            target = self._router.candidate()
            try:
                result = self._call(fn, target, write)
            except DLedgerError as e:
                if not self._router.learn(e, target):
                    raise
                continue
            self._router.succeeded(target)
            return result
        raise NotLeaderError(None, f"still not the leader after {redirects} redirects")

    def put(self, key: str, value: str) -> int:
        req = kv_pb2.PutRequest(key=key.encode(), value=value.encode())
        return self.call(lambda kv: kv.Put(req, timeout=self.timeout_s), write=True).index

    def get(self, key: str) -> str | None:
        req = kv_pb2.KVGetRequest(key=key.encode())
        r = self.call(lambda kv: kv.Get(req, timeout=self.timeout_s), write=False)
        return r.value.decode() if r.found else None

    def close(self) -> None:
        self._channels.close()


class Registers(Workers):
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


class KVWorkload(Workload):
    """``--workload kv``: register clients on a KV group; judged by the linearizability checker."""

    state_machine = "kv"
    progress = ("write",)

    def __init__(self, cfg: Any, history: History):
        super().__init__()
        self.cfg = cfg
        self.history = history

    def start(self, servers: Sequence[str]) -> None:
        cfg = self.cfg
        self.workers = [Registers(self.history, servers, clients=cfg.registers, keys=cfg.keys, seed=cfg.seed)]
        super().start(servers)

    def judge(
        self, events: Sequence[Event], group: Any, commit_index: int
    ) -> tuple[list[checkers.Verdict], dict[str, int]]:
        reg = [o for o in operations(events) if o.f in ("write", "read")]
        ops = {
            "attempted": len(reg),
            "acked": sum(1 for o in reg if o.type == OK),
            "failed": sum(1 for o in reg if o.type == FAIL),
            "unknown": sum(1 for o in reg if o.type == INFO),
        }
        return [checkers.check_linearizable(events)], ops
