"""Where a client of a group sends its next request, and when it stops trying: one policy for every client
(``DLedgerClient``, ``AsyncDLedgerClient``, the broker's and the KV store's clients).

A ``Router`` remembers the leader of the moment: it learns it from not-leader hints and from successes,
forgets it when it fails, and otherwise rotates through the known addresses. ``Attempts`` is one operation's
retry loop without the loop: each failure either raises (not retriable, or the deadline passed) or says how
long to wait before the next try: a redirect is followed at once, anything else backs off 10 ms doubling to
200 ms with jitter, so a retry lands soon after an election without hammering a group that has no leader.
Callers do the waiting themselves (``time.sleep`` or ``asyncio.sleep``), so one policy serves both worlds.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence

from dledger.errors import DLedgerError, NotLeaderError, OutcomeUnknownError, UnavailableError

DEFAULT_BACKOFF_S = (0.01, 0.2)
MAX_REDIRECTS_IN_A_ROW = 3  # then back off: two nodes pointing at each other (stale hints) must not spin
# A retry is made only with at least this long left (or a quarter of the budget, if that is less): a try given a
# sliver of the deadline would time out and turn a refusal (safe to retry) into "outcome unknown".
MIN_ATTEMPT_S = 0.1


class Router:
    """The known addresses and the leader of the moment; safe to share between threads (each update is one
    attribute store, and a stale read only costs a redirect)."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        backoff_s: tuple[float, float] = DEFAULT_BACKOFF_S,
        rng: random.Random | None = None,
    ):
        if not addresses:
            raise ValueError("give at least one node address (host:port)")
        self.addresses = list(dict.fromkeys(addresses))
        self.leader: str | None = None
        self._rr = itertools.count()
        self._backoff = backoff_s
        self._rng = rng or random.Random()
        self.stats = {"retries": 0, "redirects": 0}

    def candidate(self) -> str:
        leader = self.leader
        if leader:
            return leader
        return self.addresses[next(self._rr) % len(self.addresses)]

    def succeeded(self, address: str) -> None:
        self.leader = address

    def learn(self, err: DLedgerError, address: str) -> bool:
        """Follow a not-leader hint that names another address (True: go there now); otherwise forget a
        leader that just failed."""
        hint = err.leader_hint if isinstance(err, NotLeaderError) else None
        if hint and ":" in hint and hint != address:
            self.leader = hint
            if hint not in self.addresses:
                self.addresses.append(hint)
            self.stats["redirects"] += 1
            return True
        if self.leader == address:
            self.leader = None
        return False

    def backoff(self, attempt: int) -> float:
        lo, hi = self._backoff
        return float(min(hi, lo * (2**attempt)) * (0.5 + self._rng.random()))

    def attempts(
        self,
        timeout_s: float,
        what: str = "the request",
        *,
        retry_unknown: bool = False,
        address: str | None = None,
        retry_pinned: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> Attempts:
        return Attempts(self, timeout_s, what, retry_unknown, address, retry_pinned, clock)


class Attempts:
    """The retries of one operation. ``target()`` names the node for the next try; ``failed(err, address)``
    returns how long to wait before it, or raises:

    - ``err`` itself when it is not retriable, or when it is ``OutcomeUnknownError`` and the request is not
      idempotent (``retry_unknown`` false); for a request pinned to one ``address``, at once, unless
      ``retry_pinned`` (then a not-leader error is raised, anything else retriable is retried there: a node
      restarting);
    - at the deadline, ``OutcomeUnknownError`` as it is (an unknown outcome stays unknown), anything else as
      ``UnavailableError`` naming the last error."""

    def __init__(
        self,
        router: Router,
        timeout_s: float,
        what: str,
        retry_unknown: bool,
        address: str | None,
        retry_pinned: bool,
        clock: Callable[[], float],
    ):
        self._router = router
        self.timeout_s = timeout_s
        self._what = what
        self._retry_unknown = retry_unknown
        self._address = address
        self._retry_pinned = retry_pinned
        self._clock = clock
        self.deadline = clock() + timeout_s
        self._attempt = 0
        self._redirects = 0

    def target(self) -> str:
        return self._address or self._router.candidate()

    def remaining(self) -> float:
        return self.deadline - self._clock()

    def succeeded(self, address: str) -> None:
        if self._address is None:
            self._router.succeeded(address)

    def failed(self, err: DLedgerError, address: str) -> float:
        router = self._router
        if self._address is None:
            redirected = router.learn(err, address)
        elif not self._retry_pinned or isinstance(err, NotLeaderError):
            raise err
        else:
            redirected = False
        if not err.retriable or (isinstance(err, OutcomeUnknownError) and not self._retry_unknown):
            raise err
        router.stats["retries"] += 1
        left = self.remaining() - min(MIN_ATTEMPT_S, self.timeout_s / 4)  # what the next try could wait
        if left <= 0:
            self._give_up(err)
        if redirected and self._redirects < MAX_REDIRECTS_IN_A_ROW:
            self._redirects += 1
            return 0.0
        self._redirects = 0
        delay = router.backoff(self._attempt)
        self._attempt += 1
        if delay >= left:
            self._give_up(err)
        return delay

    def _give_up(self, err: DLedgerError) -> None:
        if isinstance(err, OutcomeUnknownError):
            raise err
        raise UnavailableError(
            f"{self._what} did not succeed within {self.timeout_s} s; last error: {err}"
        ) from err
