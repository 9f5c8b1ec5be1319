"""A leader's CPU per message by stage of a write (issue 27), from py-spy samples and ``/proc``.

A sampled stack belongs to the stage of the innermost frame that a rule in ``RULES`` names (a function, or a
file for the broader ``FALLBACK`` rules, tried only when no ``RULES`` entry matched any frame); what no rule
names goes to its thread's stage (``THREADS``: the I/O and flush threads persist) or to ``other``. So a
library frame (protobuf, grpc's Python code, ``storage/codec.py``) is charged to the project code that called
it: ``encode_into`` under ``RaftLog.append_new`` is propose, under ``FileLogStore.append`` persist.

The stages (docs/send-budget.md has the table and what it says):

- ``receive``: gRPC server side in Python, the servicer's method and its request reading (the unary ``Send``
  builds its response in its own lines: counted here too);
- ``check``: the leader's validation (``Sender._checked`` with its encoding of a unary send,
  ``message.check_stored``, topic and queue checks, the RocketMQ face's conversion);
- ``propose``: group commit, the idempotent-producer bookkeeping, ``Node.append``/``submit``, the ready loop
  and Raft core placing entries, the allocator's ``prepare``;
- ``persist``: log and index writes and fdatasync (I/O thread, flush thread, or inline);
- ``replicate``: building, writing and reading the peers' AppendEntries streams (core replication too);
- ``dispatch``: the state machine's apply (``BrokerStateMachine.apply``, ConsumeQueue writes, apply waiters);
- ``answer``: resolving committed appends and building and queueing the responses;
- ``other``: the event loop's native time (uvloop, grpc's Cython server and channel: this includes the
  deserialisation of requests and the serialisation of responses, which run in C with no Python frame),
  grpc's poller thread, ticks, metrics, and anything unnamed.

Sampling with ``--nonblocking`` cannot always tell a thread blocked in native code from one computing, so a
sample whose leaf is a known wait (``WAITS``) is not counted; a thread's CPU (``/proc/PID/task/TID/stat``) is
shared among its other samples, and the stages are scaled to the process's measured CPU, so they add up to it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

STAGES = ("receive", "check", "propose", "persist", "replicate", "dispatch", "answer", "other")
WAIT = "wait"

# (stage, pattern): a pattern with a "/" or ending in ".py" is part of a frame's file path; one ending in "."
# is the start of its function's qualified name (every method of a class); any other is the whole name. For
# each frame from the leaf outward the first rule that matches decides: the innermost named function wins.
RULES: tuple[tuple[str, str], ...] = (
    ("check", "Sender._checked"),
    ("check", "Sender._encode"),
    ("check", "Sender.check"),
    ("check", "Sender.send_stored"),  # its own lines: the loop of check_stored and the topic checks
    ("check", "check_stored"),
    ("check", "check_user_topic"),
    ("check", "Broker.ensure_topic"),
    ("check", "Broker.leader_state"),
    ("check", "_may_publish"),
    ("check", "broker_adapter/rocketmq/convert.py"),
    ("propose", "Sender._store"),
    ("propose", "broker_adapter/core/group_commit.py"),
    ("propose", "broker_adapter/core/allocator.py"),
    ("propose", "Node.append"),
    ("propose", "Node.submit"),
    ("propose", "Node._enqueue"),
    ("answer", "Proposals.committed"),  # resolving the appends a commit answers
    ("answer", "Node._committed"),
    ("answer", "ReadyLoop.commit_acked"),
    ("propose", "dledger/runtime/proposals.py"),
    ("propose", "RaftCore.propose"),
    ("propose", "RaftLog.append_new"),
    ("persist", "ReadyLoop.persist"),
    ("persist", "ReadyLoop.persist_inline"),
    ("persist", "ReadyLoop.flusher"),
    ("persist", "IoThread."),
    ("persist", "FileLogStore.append"),
    ("persist", "FileLogStore.sync"),
    ("persist", "DataDir.checkpoint_commit"),
    ("replicate", "Replication."),
    ("replicate", "RaftCore.step"),
    ("replicate", "dledger/runtime/peers.py"),
    ("replicate", "GrpcPeerTransport."),
    ("replicate", "_Pipe."),
    ("replicate", "RaftPeerServicer."),
    ("other", "ReadyLoop.ticker"),
    ("propose", "ReadyLoop.run"),  # the ready loop's own turn: the core's Ready and advance
    ("dispatch", "statemachine/"),
    ("dispatch", "broker_adapter/core/statemachine.py"),
    ("dispatch", "broker_adapter/core/consumequeue.py"),
    ("dispatch", "Node._on_applied"),
    ("dispatch", "Sender.applied"),
    ("answer", "_appended"),
    ("answer", "BrokerServicer.SendStream.<locals>.one"),  # builds the batch's result
    ("answer", "answer_each.<locals>.one"),  # queues the answer
    ("answer", "answer_each"),  # yields the answers
    ("answer", "DLedgerServicer.AppendStream.<locals>.one"),
    ("answer", "DLedgerServicer.AppendStream"),  # the generator yielding the answers
    ("receive", "answer_each.<locals>.reader"),
    ("receive", "DLedgerServicer.AppendStream.<locals>.reader"),
    ("receive", "DLedgerServicer."),
    ("receive", "BrokerServicer."),
    ("receive", "MessagingServicer."),
    ("receive", "Sends."),
    ("other", "prometheus_client/"),
)
# Tried only when no rule above matched any frame of the stack: whole packages.
FALLBACK: tuple[tuple[str, str], ...] = (
    ("check", "broker_adapter/core/message.py"),  # when no caller is named (under apply it is dispatch)
    ("check", "broker_adapter/core/topics.py"),
    ("replicate", "dledger/transport/"),
    ("propose", "dledger/core/"),
    ("persist", "storage/"),
    ("receive", "broker_adapter/rocketmq/"),
    ("receive", "grpc/aio/_server.py"),
)
# Leaves where a thread waits rather than computes (py-spy --nonblocking cannot always tell): not counted. The
# grpc poller's Python stack is only ``Thread.run``: its CPU still counts, charged to its thread's stage.
WAITS = (
    "EpollSelector.select",
    "Condition.wait",
    "Event.wait",
    "_worker",  # an idle pool worker (a busy one's leaf is the work it runs)
    "Thread.run",
    "FileIO.fdatasync",
)
# Leaves where the event loop runs native code (uvloop, grpc's Cython callbacks) or its own Python plumbing.
LOOP = ("Runner.run", "BaseEventLoop.run_forever", "BaseEventLoop._run_once", "Handle._run")
# Where a thread's unnamed samples, and its CPU when it has no sample that computes, go (by thread name).
THREADS = (("-io_", "persist"), ("-flush_", "persist"))


def _split(frame: str) -> tuple[str, str]:
    """``"func (file:line)"`` -> (func, file)."""
    func, _, where = frame.partition(" (")
    return func, where.rsplit(":", 1)[0].rstrip(")")


def _leaf(frames: Sequence[str]) -> str:
    return (frames[-1].split(" (")[0] if frames else "") or "(no frame)"


def matches(pattern: str, frame: str) -> bool:
    func, file = _split(frame)
    if "/" in pattern or pattern.endswith(".py"):
        return pattern in file
    if pattern.endswith("."):
        return func.startswith(pattern)
    return func == pattern


def classify(frames: Sequence[str], thread: str = "") -> str:
    """The stage of one sampled stack (frames outermost first, as py-spy writes them), or ``WAIT``."""
    if not frames:
        return "other"
    leaf = frames[-1]
    if any(matches(w, leaf) for w in WAITS):
        return WAIT
    if any(matches(w, leaf) for w in LOOP):
        return "other"
    for rules in (RULES, FALLBACK):
        for f in reversed(frames):
            for stage, pattern in rules:
                if matches(pattern, f):
                    return stage
    return thread_stage(thread)


def thread_stage(thread: str) -> str:
    return next((stage for part, stage in THREADS if part in thread), "other")


def samples(raw: Path) -> Iterator[tuple[int, str, list[str], int]]:
    """py-spy's raw output recorded with ``--threads``: (thread id, thread name, frames, count) per line."""
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        tid, name = 0, ""
        if frames and frames[0].startswith("thread ("):
            head = frames.pop(0)
            ident, _, name = head[len("thread (") :].partition("):")
            tid = int(ident, 16) if ident.startswith("0x") else int(ident)
            name = name.strip()
        yield tid, name, frames, int(count)


def budget(
    stacks: Iterable[tuple[int, str, list[str], int]],
    cpu_before: Mapping[int, float],
    cpu_after: Mapping[int, float],
    total_s: float,
) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds per stage, adding up to ``total_s`` (the process's, from ``/proc``): each thread's CPU over
    the window is shared among its computing samples by stage; a thread with none (the grpc poller, whose
    Python stack is a wait) or unseen by py-spy (a native thread) goes whole to its thread's stage. Also what
    ``other`` is made of, in CPU seconds: its samples by leaf function, and the whole threads charged to it."""
    per_thread: dict[int, collections.Counter[tuple[str, str]]] = collections.defaultdict(collections.Counter)
    names: dict[int, str] = {}
    for tid, name, frames, n in stacks:
        names[tid] = name
        stage = classify(frames, name)
        if stage != WAIT:
            per_thread[tid][stage, _leaf(frames) if stage == "other" else ""] += n
    raw = dict.fromkeys(STAGES, 0.0)
    parts: collections.Counter[str] = collections.Counter()
    for tid, after in cpu_after.items():
        used = max(0.0, after - cpu_before.get(tid, 0.0))
        counts = per_thread.get(tid)
        if not counts:
            name = names.get(tid, "")
            counts = collections.Counter({(thread_stage(name), f"thread {name or '(native)'}"): 1})
        seen = sum(counts.values())
        for (stage, part), n in counts.items():
            raw[stage] += used * n / seen
            if stage == "other":
                parts[part] += used * n / seen
    measured = sum(raw.values())
    scale = total_s / measured if measured > 0 else 0.0
    return {s: v * scale for s, v in raw.items()}, {k: v * scale for k, v in parts.items()}
