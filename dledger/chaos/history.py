"""The history of a chaos run: every operation a client invoked and how it ended, in real-time order.

The vocabulary is Jepsen's: an operation is ``invoke``d, then completes as ``ok`` (the system acknowledged it),
``fail`` (the system said it was not done: it must leave no trace) or ``info`` (indeterminate: a timeout, a
lost leader; it may or may not have happened). Checkers read nothing but this history and the nodes' final
files, so a run can be judged again later from its output directory (``history.jsonl``).

Times are seconds since the run started, from one monotonic clock shared by every thread of the runner, so
"a completed before b was invoked" is meaningful across clients (linearizability needs it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
OUTCOMES = (OK, FAIL, INFO)


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # seconds since the start of the run
    process: str  # the client (thread) that did it; one operation at a time per process
    type: str  # invoke | ok | fail | info, or "nemesis" for a fault event
    f: str  # what: send, consume, commit, restart, write, read, or a fault name
    value: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "time": round(self.time, 6),
                "process": self.process,
                "type": self.type,
                "f": self.f,
                **self.value,
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(line: str) -> Event:
        raw = json.loads(line)
        t, p, ty, f = raw.pop("time"), raw.pop("process"), raw.pop("type"), raw.pop("f")
        return Event(float(t), str(p), str(ty), str(f), raw)


class History:
    """An append-only, thread-safe list of events, optionally mirrored to a JSON-lines file as it grows."""

    def __init__(self, path: Path | None = None, clock=time.monotonic):
        self._clock = clock
        self._t0 = clock()
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._file = open(path, "w", buffering=1 << 16) if path is not None else None  # noqa: SIM115

    def now(self) -> float:
        return self._clock() - self._t0

    def add(self, process: str, type_: str, f: str, **value: Any) -> Event:
        with self._lock:
            e = Event(self.now(), process, type_, f, value)
            self._events.append(e)
            if self._file is not None:
                self._file.write(e.to_json() + "\n")
        return e

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    @staticmethod
    def load(path: Path) -> list[Event]:
        with open(path) as f:
            return [Event.from_json(line) for line in f if line.strip()]


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion (``type`` is ok / fail / info; info if it never completed)."""

    process: str
    f: str
    type: str
    invoke: float
    complete: float  # inf for an operation that never completed (indeterminate for ever)
    value: dict[str, Any]  # the invocation's fields updated with the completion's


def operations(events: Iterable[Event], f: str | None = None) -> list[Operation]:
    """Pair each process's invoke with its next completion; an unfinished invoke becomes ``info``."""
    open_: dict[str, Event] = {}
    out: list[Operation] = []
    for e in events:
        if e.type == INVOKE:
            open_[e.process] = e
        elif e.type in OUTCOMES and e.process in open_:
            inv = open_.pop(e.process)
            if f is None or inv.f == f:
                out.append(Operation(e.process, inv.f, e.type, inv.time, e.time, {**inv.value, **e.value}))
    for inv in open_.values():
        if f is None or inv.f == f:
            out.append(Operation(inv.process, inv.f, INFO, inv.time, float("inf"), dict(inv.value)))
    return out
