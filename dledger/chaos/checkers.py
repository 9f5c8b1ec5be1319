"""The generic checkers of a chaos run: the ``Verdict`` every checker returns, the linearizability of a register
history and the longest window without an acknowledgement.

``linearizable`` (``check_register``): the register history is linearizable (Wing & Gong's search with Lowe's
memoisation of (linearized set, state); histories are kept small enough to check). The broker's checkers (of
its messages in the nodes' final files) live with the broker, in ``broker_adapter.chaos.checkers``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dledger.chaos.history import FAIL, OK, Event, operations

EXAMPLES = 5


@dataclass(slots=True)
class Verdict:
    name: str
    violations: list[str] = field(default_factory=list)
    count: int = 0  # violations found (only the first EXAMPLES are kept as text)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.count == 0

    def violation(self, text: str) -> None:
        self.count += 1
        if len(self.violations) < EXAMPLES:
            self.violations.append(text)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "count": self.count,
            "examples": self.violations,
            **self.stats,
        }


# -- 4 -----------------------------------------------------------------------------------------------------------


UNKNOWN: Final = "\x00unknown"  # an outcome the client never learned (an indeterminate operation)


@dataclass(frozen=True, slots=True)
class RegisterOp:
    """A register operation: ``write`` of ``value``, ``read`` returning ``value`` (None: absent), ``cas`` of
    ``expected`` (None: absent) to ``value``, or ``delete``. ``observed`` is what the answer said of the state it
    met: a write's previous value, whether a cas swapped, whether a delete found the key (``UNKNOWN`` for an
    indeterminate operation, or a write whose answer did not say). ``complete`` is inf for an indeterminate
    operation (it may take effect at any time after its invocation); indeterminate reads are dropped (they
    constrain nothing)."""

    id: int
    f: str
    value: str | None
    invoke: float
    complete: float
    expected: str | None = None
    observed: object = UNKNOWN


def _step(op: RegisterOp, state: str | None) -> tuple[bool, str | None]:
    """Whether ``op`` may take effect on a register holding ``state``, and the state after it."""
    seen = op.observed
    if op.f == "read":
        return op.value == state, state
    if op.f == "write":
        return seen is UNKNOWN or seen == state, op.value
    if op.f == "delete":
        return seen is UNKNOWN or seen == (state is not None), None
    # cas: it swaps exactly when the register holds what it expects
    swaps = state == op.expected
    if seen is not UNKNOWN and seen != swaps:
        return False, state
    return True, op.value if swaps else state


def check_register(
    ops: Sequence[RegisterOp], initial: str | None = None, max_states: int = 2_000_000
) -> tuple[bool, list[RegisterOp] | None, str]:
    """Wing & Gong's linearizability search with Lowe's memoisation, for one register.

    Returns (linearizable, a linearization when it is, why not / "search space exhausted"). Each step picks a
    *minimal* pending operation (one invoked before every other pending operation completed), applies it to
    the register if it is legal, and backtracks otherwise; states already explored (set of linearized ops,
    register value) are cached, which keeps small histories fast."""
    ops = sorted(ops, key=lambda o: o.invoke)
    n = len(ops)
    if n == 0:
        return True, [], ""
    seen: set[tuple[int, str | None]] = set()
    full = (1 << n) - 1
    # Iterative DFS: stack of (done_mask, value, path).
    stack: list[tuple[int, str | None, tuple[int, ...]]] = [(0, initial, ())]
    explored = 0
    while stack:
        done, value, path = stack.pop()
        if done == full:
            return True, [ops[i] for i in path], ""
        key = (done, value)
        if key in seen:
            continue
        seen.add(key)
        explored += 1
        if explored > max_states:
            return False, None, f"search space exhausted after {max_states} states (history too large)"
        pending = [i for i in range(n) if not done >> i & 1]
        horizon = min(ops[i].complete for i in pending)
        for i in reversed(pending):
            op = ops[i]
            if op.invoke > horizon:
                continue  # some pending op completed before this one began: it must go first
            legal, after = _step(op, value)
            if legal:
                stack.append((done | 1 << i, after, (*path, i)))
    # Not linearizable: name the first read that no order explains (a hint for the reader).
    return (
        False,
        None,
        (
            "no linearization: some read, previous value, cas or delete outcome is explained by no legal order "
            "of the operations"
        ),
    )


REGISTER_FS: Final = ("write", "read", "cas", "delete")
_OBSERVED: Final = {"write": "previous", "cas": "swapped", "delete": "existed"}


def register_ops(events: Iterable[Event]) -> dict[str, list[RegisterOp]]:
    """Per key, the register operations of a history (``write``/``read``/``cas``/``delete`` events with ``key``,
    ``value``, a cas's ``expected``, and what a completed operation observed: ``previous``, ``swapped``,
    ``existed``)."""
    out: dict[str, list[RegisterOp]] = defaultdict(list)
    for k, o in enumerate(operations(events)):
        if o.f not in REGISTER_FS:
            continue
        if o.type == FAIL:
            continue  # did not happen
        if o.f == "read" and o.type != OK:
            continue
        complete = o.complete if o.type == OK else float("inf")
        seen_key = _OBSERVED.get(o.f)
        observed = o.value.get(seen_key, UNKNOWN) if o.type == OK and seen_key else UNKNOWN
        out[o.value["key"]].append(
            RegisterOp(k, o.f, o.value.get("value"), o.invoke, complete, o.value.get("expected"), observed)
        )
    return out


def check_linearizable(events: Sequence[Event], max_ops_per_key: int = 400) -> Verdict:
    v = Verdict("linearizable")
    per_key = register_ops(events)
    checked = 0
    for key, ops in sorted(per_key.items()):
        if len(ops) > max_ops_per_key:
            v.violation(
                f"key {key}: {len(ops)} operations is more than the checker takes ({max_ops_per_key})"
            )
            continue
        ok, _order, why = check_register(ops)
        checked += len(ops)
        if not ok:
            v.violation(f"key {key}: {why} ({len(ops)} operations)")
    v.stats.update(keys=len(per_key), operations=checked)
    return v


def longest_unavailability(
    events: Sequence[Event], start: float, end: float, acked: Sequence[str] = ("send", "write")
) -> tuple[float, float]:
    """The longest window between ``start`` and ``end`` without an acknowledged operation of a kind in
    ``acked`` (a workload's progress operations): (length s, from s)."""
    acks = sorted(e.time for e in events if e.type == OK and e.f in acked)
    points = [start, *[t for t in acks if start <= t <= end], end]
    best, at = 0.0, start
    for a, b in itertools.pairwise(points):
        if b - a > best:
            best, at = b - a, a
    return best, at
