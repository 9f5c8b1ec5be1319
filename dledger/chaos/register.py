"""Client of the linearizable registers the KV workload reads and writes: the built-in KV store's gRPC service
(``state_machine = "kv"``, ``dledger.v1.KV``: puts through the log, gets through the leader's read index).

Unlike ``statemachine.kvclient`` (which retries within a deadline), one call here is one attempt set with a
few not-leader redirects, and every failure is classified for the history: NotLeaderError / UnavailableError
(not done) or OutcomeUnknownError (may have been done), which is what the linearizability checker needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from dledger.errors import DLedgerError, NotLeaderError, OutcomeUnknownError, UnavailableError
from dledger.transport import convert
from dledger.v1 import kv_pb2, kv_pb2_grpc


class RegisterClient:
    """A synchronous client of the register service that follows the leader; one call = one attempt set."""

    def __init__(self, servers: Sequence[str], timeout_s: float = 1.0):
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._leader: str | None = None
        self._rr = 0

    def _call(self, fn: Callable[[kv_pb2_grpc.KVStub], Any], address: str) -> Any:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.insecure_channel(address)
        try:
            return fn(kv_pb2_grpc.KVStub(ch))
        except grpc.RpcError as e:
            md = dict(e.trailing_metadata() or ())
            code = e.code()
            details = e.details() or ""
            if code == grpc.StatusCode.UNAVAILABLE and details.startswith("failed to connect"):
                # no connection was ever made: the request was not sent, so nothing was done
                raise UnavailableError(f"{address}: {details}") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                code == grpc.StatusCode.UNAVAILABLE
                and convert.REFUSED_KEY not in md
                and convert.OUTCOME_UNKNOWN_KEY not in md
            ):
                raise OutcomeUnknownError(f"{code.name}: {e.details()}") from None
            raise convert.error_from_status(code, e.details() or "", md) from None

    def call(self, fn: Callable[[kv_pb2_grpc.KVStub], Any], redirects: int = 2) -> Any:
        """Send to the known leader (or the next server); follow up to ``redirects`` not-leader hints. Errors
        propagate: NotLeaderError / UnavailableError (not done), OutcomeUnknownError (may have been done)."""
        if self._leader is None:
            self._leader = self.servers[self._rr % len(self.servers)]
            self._rr += 1
        target = self._leader
        for _ in range(redirects + 1):
            try:
                return self._call(fn, target)
            except NotLeaderError as e:
                hint = e.leader_hint
                if not hint or ":" not in hint or hint == target:
                    self._leader = None
                    raise
                target = self._leader = hint
            except DLedgerError:
                self._leader = None
                raise
        raise NotLeaderError(None, f"still not the leader after {redirects} redirects")

    def put(self, key: str, value: str) -> int:
        req = kv_pb2.PutRequest(key=key.encode(), value=value.encode())
        return self.call(lambda kv: kv.Put(req, timeout=self.timeout_s)).index

    def get(self, key: str) -> str | None:
        req = kv_pb2.KVGetRequest(key=key.encode())
        r = self.call(lambda kv: kv.Get(req, timeout=self.timeout_s))
        return r.value.decode() if r.found else None

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
