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

    def put(self, key: str, value: str) -> str | None:
        """The value the put replaced (None: the key was absent): the write it overwrote is witnessed."""
        req = kv_pb2.PutRequest(key=key.encode(), value=value.encode())
        r = self.call(lambda kv: kv.Put(req, timeout=self.timeout_s), write=True)
        return r.previous.decode() if r.had_previous else None

    def compare_and_swap(self, key: str, expected: str | None, value: str) -> bool:
        """Whether ``key`` held ``expected`` (None: absent) and now holds ``value``."""
        req = kv_pb2.CompareAndSwapRequest(
            key=key.encode(),
            expected=(expected or "").encode(),
            expect_absent=expected is None,
            value=value.encode(),
        )
        return bool(self.call(lambda kv: kv.CompareAndSwap(req, timeout=self.timeout_s), write=True).swapped)

    def delete(self, key: str) -> bool:
        """Whether the key existed."""
        req = kv_pb2.DeleteRequest(key=key.encode())
        return bool(self.call(lambda kv: kv.Delete(req, timeout=self.timeout_s), write=True).existed)

    def get(self, key: str) -> str | None:
        req = kv_pb2.KVGetRequest(key=key.encode())
        r = self.call(lambda kv: kv.Get(req, timeout=self.timeout_s), write=False)
        return r.value.decode() if r.found else None

    def close(self) -> None:
        self._channels.close()


class Registers(Workers):
    """Clients of the register service over a few keys at a time: reads, puts of unique values (each answer
    names the value it replaced, so every acknowledged write is witnessed by the next), compare-and-swaps from
    the value last seen, and deletes.

    A key takes at most ``ops_per_key`` operations, then the clients move on to fresh keys, so that each
    key's history stays small enough for the linearizability checker (WGL is exponential in the worst case).
    An operation that was refused is ``fail``; one whose outcome is unknown is ``info`` and is never retried
    (none of them is idempotent)."""

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
        client = RegisterClient(self.servers, self.timeout_s)
        last: dict[str, str | None] = {}  # per key, the value this client saw last: what its cas expects
        try:
            written = 0
            while not self.stopping:
                n = next(self._ops)
                key = f"k{n // (self.ops_per_key * self.keys)}-{rng.randrange(self.keys)}"
                if rng.random() < self.read_fraction:
                    got = self._attempt(name, "read", key, {}, lambda k=key: {"value": client.get(k)})
                    if got is not None:
                        last[key] = got["value"]
                        continue
                else:
                    value = f"{name}-{written}"
                    written += 1
                    kind = rng.random()
                    if kind < 0.6:  # a put, which says what it replaced
                        got = self._attempt(
                            name,
                            "write",
                            key,
                            {"value": value},
                            lambda k=key, v=value: {"previous": client.put(k, v)},
                        )
                        if got is not None:
                            last[key] = value
                    elif kind < 0.9:
                        expected = last.get(key)
                        got = self._attempt(
                            name,
                            "cas",
                            key,
                            {"value": value, "expected": expected},
                            lambda k=key, e=expected, v=value: {"swapped": client.compare_and_swap(k, e, v)},
                        )
                        if got is not None and got["swapped"]:
                            last[key] = value
                        elif got is not None:
                            last.pop(key, None)  # it held something else, not known here
                    else:
                        got = self._attempt(
                            name, "delete", key, {}, lambda k=key: {"existed": client.delete(k)}
                        )
                        if got is not None:
                            last[key] = None
                    if got is not None:
                        continue
                self._stop.wait(0.02)  # after a failure: do not spin against a node that is down
        finally:
            client.close()

    def _attempt(
        self, name: str, f: str, key: str, fields: dict[str, Any], action: Callable[[], dict[str, Any]]
    ) -> dict[str, Any] | None:
        """One operation into the history: its invocation, then ok with what it observed, fail (it certainly
        did not happen) or info (it may have); the observed fields when ok."""
        h = self.history
        h.add(name, INVOKE, f, key=key, **fields)
        try:
            result = action()
        except OutcomeUnknownError as e:
            h.add(name, INFO, f, key=key, **fields, error=str(e)[:160])
        except (NotLeaderError, UnavailableError, InvalidRequestError) as e:
            h.add(name, FAIL, f, key=key, **fields, error=str(e)[:160])
        except DLedgerError as e:
            h.add(name, INFO, f, key=key, **fields, error=f"{type(e).__name__}: {str(e)[:160]}")
        else:
            h.add(name, OK, f, key=key, **fields, **result)
            return result
        return None


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
        self, events: Sequence[Event], groups: Sequence[Any]
    ) -> tuple[list[checkers.Verdict], dict[str, int]]:
        reg = [o for o in operations(events) if o.f in checkers.REGISTER_FS]
        ops = {
            "attempted": len(reg),
            "acked": sum(1 for o in reg if o.type == OK),
            "failed": sum(1 for o in reg if o.type == FAIL),
            "unknown": sum(1 for o in reg if o.type == INFO),
        }
        return [checkers.check_linearizable(events)], ops
