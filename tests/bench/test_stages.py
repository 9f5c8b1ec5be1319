"""``bench.stages`` charges hand-written py-spy stacks of a leader to the right stage of a write, and shares a
thread's measured CPU among its samples so that the stages add up to the process's CPU; ``bench.cpu_per_message``
runs end to end on a real group (so it cannot rot). No timing is asserted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import stages
from bench.cpu_per_message import WORKLOADS, main
from bench.send_budget import _py_spy
from tests.bench.test_compare_smoke import _children_of

SRC = "/work/tree"
LIB = "/venv/lib/python3.11/site-packages"
LOOP = [
    "_run_module_as_main (<frozen runpy>:198)",
    f"node ({SRC}/dledger/cli.py:136)",
    f"run ({LIB}/uvloop/__init__.py:92)",
    "Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)",
]
WORKER = [
    "Thread._bootstrap (/usr/lib/python3.11/threading.py:1002)",
    "Thread.run (/usr/lib/python3.11/threading.py:982)",
    "_worker (/usr/lib/python3.11/concurrent/futures/thread.py:83)",
    "_WorkItem.run (/usr/lib/python3.11/concurrent/futures/thread.py:58)",
]


def f(func: str, path: str, line: int = 1) -> str:
    return f"{func} ({SRC}/{path}:{line})"


def on_loop(*frames: str) -> list[str]:
    return [*LOOP, *frames]


STACKS = {
    "session send: the leader checks the stored bytes": (
        on_loop(
            f("answer_each.<locals>.one", "dledger/batch_stream.py"),
            f("BrokerServicer.SendStream.<locals>.one", "broker_adapter/service.py"),
            f("Sender.send_stored", "broker_adapter/core/send.py"),
            f("check_stored", "broker_adapter/core/message.py"),
            f("peek_route", "broker_adapter/core/message.py"),
        ),
        "check",
    ),
    "unary send: the leader encodes as it checks": (
        on_loop(
            f("BrokerServicer.Send", "broker_adapter/service.py"),
            f("Sender.send", "broker_adapter/core/send.py"),
            f("Sender._checked", "broker_adapter/core/send.py"),
            f("Sender._encode", "broker_adapter/core/send.py"),
            f("encode_send", "broker_adapter/core/message.py"),
        ),
        "check",
    ),
    "the servicer's own lines": (on_loop(f("BrokerServicer.Send", "broker_adapter/service.py")), "receive"),
    "group commit": (
        on_loop(
            f("Sender._store", "broker_adapter/core/send.py"),
            f("GroupCommit.propose", "broker_adapter/core/group_commit.py"),
        ),
        "propose",
    ),
    "the core encodes an entry it places (storage code, not a write)": (
        on_loop(
            f("ReadyLoop.run", "dledger/runtime/ready_loop.py"),
            f("Proposals.propose_queued", "dledger/runtime/proposals.py"),
            f("RaftCore.propose", "dledger/core/raft.py"),
            f("RaftLog.append_new", "dledger/core/raft_log.py"),
            f("encode_into", "storage/codec.py"),
        ),
        "propose",
    ),
    "the allocator stamps a placement (message.py, called by the allocator)": (
        on_loop(
            f("RaftLog._prepared", "dledger/core/raft_log.py"),
            f("QueueOffsetAllocator.prepare_entry", "broker_adapter/core/allocator.py"),
            f("patch_placement", "broker_adapter/core/message.py"),
        ),
        "propose",
    ),
    "the core builds AppendEntries as it proposes": (
        on_loop(
            f("ReadyLoop.run", "dledger/runtime/ready_loop.py"),
            f("RaftCore.propose", "dledger/core/raft.py"),
            f("Replication._send_append", "dledger/core/replication.py"),
            f("RaftLog.frames_from", "dledger/core/raft_log.py"),
        ),
        "replicate",
    ),
    "a pipe write to a follower": (
        on_loop(
            f("Peers.sender", "dledger/runtime/peers.py"),
            f("GrpcPeerTransport.deliver", "dledger/transport/grpc.py"),
            f("_Pipe.write", "dledger/transport/grpc.py"),
            f"_StreamRequestMixin._write ({LIB}/grpc/aio/_call.py:500)",
        ),
        "replicate",
    ),
    "a log write on the I/O thread": (
        [
            *WORKER,
            f("ReadyLoop.persist", "dledger/runtime/ready_loop.py"),
            f("FileLogStore.append", "storage/filestore.py"),
            f("scan_frames", "storage/codec.py"),
        ],
        "persist",
    ),
    "apply reads a message (message.py under apply)": (
        on_loop(
            f("ApplyLoop.run", "statemachine/apply_loop.py"),
            f("BrokerStateMachine.apply", "broker_adapter/core/statemachine.py"),
            f("BrokerStateMachine._dispatch", "broker_adapter/core/statemachine.py"),
            f("peek_route", "broker_adapter/core/message.py"),
        ),
        "dispatch",
    ),
    "a ConsumeQueue write": (
        on_loop(
            f("ApplyLoop.apply_available", "statemachine/apply_loop.py"),
            f("ConsumeQueue.write_appended", "broker_adapter/core/consumequeue.py"),
        ),
        "dispatch",
    ),
    "an ack commits and answers the appends": (
        on_loop(
            f("_Pipe._read", "dledger/transport/grpc.py"),
            f("Peers.step_all", "dledger/runtime/peers.py"),
            f("ReadyLoop.commit_acked", "dledger/runtime/ready_loop.py"),
            f("Proposals.committed", "dledger/runtime/proposals.py"),
        ),
        "answer",
    ),
    "an ack read from a follower": (
        on_loop(
            f("_Pipe._read", "dledger/transport/grpc.py"),
            f("Peers.step_all", "dledger/runtime/peers.py"),
            f("RaftCore.step", "dledger/core/raft.py"),
        ),
        "replicate",
    ),
    "a raw append's response": (
        on_loop(
            f("DLedgerServicer.AppendStream.<locals>.one", "dledger/transport/grpc.py"),
            f("_appended", "dledger/transport/grpc.py"),
        ),
        "answer",
    ),
    "a raw append stream's reader": (
        on_loop(f("DLedgerServicer.AppendStream.<locals>.reader", "dledger/transport/grpc.py")),
        "receive",
    ),
    "the RocketMQ face converts a message": (
        on_loop(
            f("MessagingServicer._unary", "broker_adapter/rocketmq/servicer.py"),
            f("Sends.send", "broker_adapter/rocketmq/sending.py"),
            f("outgoing", "broker_adapter/rocketmq/convert.py"),
        ),
        "check",
    ),
    "the RocketMQ face's own lines": (
        on_loop(
            f("MessagingServicer._unary", "broker_adapter/rocketmq/servicer.py"),
            f("Sends.send", "broker_adapter/rocketmq/sending.py"),
        ),
        "receive",
    ),
    "the event loop in native code (uvloop, grpc's Cython)": (on_loop(), "other"),
    "a tick": (on_loop(f("ReadyLoop.ticker", "dledger/runtime/ready_loop.py")), "other"),
    "an idle pool worker": (WORKER[:3], stages.WAIT),
    "fdatasync (blocked in the kernel)": (
        [
            *WORKER,
            f("ReadyLoop.persist", "dledger/runtime/ready_loop.py"),
            f("FileIO.fdatasync", "storage/fileio.py"),
        ],
        stages.WAIT,
    ),
}


@pytest.mark.parametrize("name", list(STACKS))
def test_classify_charges_a_stack_to_its_stage(name: str) -> None:
    frames, stage = STACKS[name]
    assert stages.classify(frames, "MainThread") == stage


def test_a_threads_unnamed_samples_go_to_its_stage() -> None:
    busy = [*WORKER[:3], "_WorkItem.run (/usr/lib/python3.11/concurrent/futures/thread.py:58)"]
    assert stages.classify(busy, "n1-io_0") == "persist"
    assert stages.classify(busy, "n1-flush_0") == "persist"
    assert stages.classify(busy, "ThreadPoolExecutor-0_0") == "other"


def test_every_rule_names_a_stage() -> None:
    for stage, _ in (*stages.RULES, *stages.FALLBACK):
        assert stage in stages.STAGES


def _raw(tmp_path: Path) -> Path:
    raw = tmp_path / "stacks.txt"
    check = STACKS["session send: the leader checks the stored bytes"][0]
    persist = STACKS["a log write on the I/O thread"][0]
    raw.write_text(
        "\n".join(
            [
                "thread (100): MainThread;" + ";".join(check) + " 3",
                "thread (100): MainThread;" + ";".join(on_loop()) + " 1",
                "thread (101): n1-io_0;" + ";".join(persist) + " 2",
                "thread (101): n1-io_0;" + ";".join(WORKER[:3]) + " 40",  # idle: not counted
                "thread (102): Thread-1 (_poll_wrapper);" + ";".join(WORKER[:2]) + " 9",  # only waits
                "not a stack line",
            ]
        )
        + "\n"
    )
    return raw


def test_samples_reads_threads_and_frames(tmp_path: Path) -> None:
    rows = list(stages.samples(_raw(tmp_path)))
    assert [(tid, name, n) for tid, name, _, n in rows] == [
        (100, "MainThread", 3),
        (100, "MainThread", 1),
        (101, "n1-io_0", 2),
        (101, "n1-io_0", 40),
        (102, "Thread-1 (_poll_wrapper)", 9),
    ]
    assert rows[0][2][-1].startswith("peek_route (")


def test_budget_shares_each_threads_cpu_and_adds_up_to_the_process(tmp_path: Path) -> None:
    before = {100: 1.0, 101: 0.5, 102: 0.0, 103: 0.0}
    # main thread 0.8 s (3 check samples, 1 loop), I/O thread 0.2 s, the poller 0.4 s (its samples are all
    # waits: charged whole to its thread), 103 a native thread py-spy never sees: 0.6 s
    after = {100: 1.8, 101: 0.7, 102: 0.4, 103: 0.6}
    secs, others = stages.budget(stages.samples(_raw(tmp_path)), before, after, total_s=2.0)
    assert set(secs) == set(stages.STAGES)
    assert sum(secs.values()) == pytest.approx(2.0)
    assert secs["check"] == pytest.approx(0.6)
    assert secs["persist"] == pytest.approx(0.2)
    assert secs["other"] == pytest.approx(0.2 + 0.4 + 0.6)
    assert others["Runner.run"] == pytest.approx(0.2)
    assert others["thread Thread-1 (_poll_wrapper)"] == pytest.approx(0.4)
    assert others["thread (native)"] == pytest.approx(0.6)
    scaled, _ = stages.budget(stages.samples(_raw(tmp_path)), before, after, total_s=4.0)
    assert scaled["check"] == pytest.approx(1.2)  # scaled to the process's measured CPU


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_bench_cpu_runs_every_workload_on_a_real_group(capsys) -> None:
    before = _children_of(os.getpid())
    assert main(["--seconds", "0.5", "--rounds", "1"]) == 0
    assert _children_of(os.getpid()) <= before, "the benchmark left a process running"
    out = capsys.readouterr().out
    for w in WORKLOADS:
        assert f"round 1 {w}" in out and f"{w:<13} median" in out
    assert "send-64 / append-64: throughput" in out and "send-batch / append-batch" in out
    if _py_spy() is not None:
        table = out.split("leader CPU per message by stage")[1].splitlines()
        assert all(s in table[1] for s in stages.STAGES)
        rows = set()
        for line in table[2:]:
            if not line.strip():
                break
            rows.add(line.split()[0])
        # A window in which the leader moved (a loaded machine) gives no stages, and says so.
        moved = {w for w in WORKLOADS if f"  {w}: the leader changed in the window" in out}
        assert rows and rows | moved == set(WORKLOADS) and not rows & moved
