"""The checkers must catch what they claim to catch: lost, duplicated, unsent and misplaced messages, broken
queue order, divergent nodes, and non-linearizable register histories (synthetic inputs, no processes)."""

from __future__ import annotations

from broker_adapter.chaos.checkers import (
    NodeLog,
    StoredMessage,
    check_acked_present,
    check_nothing_unsent,
    check_queue_order,
)
from dledger.chaos.checkers import RegisterOp, check_linearizable, check_register, longest_unavailability
from dledger.chaos.history import Event, History

T = "chaos"


def _msg(index, msg_id, q, off, pos=None):
    pos = index * 1000 if pos is None else pos
    return StoredMessage(index, msg_id, T, q, off, pos + 48, pos)


def _send(h: list[Event], t, proc, msg_id, outcome="ok", q=0, off=0, index=0):
    h.append(Event(t, proc, "invoke", "send", {"msg_id": msg_id, "queue_id": q}))
    value = {"msg_id": msg_id}
    if outcome == "ok":
        value.update(queue_id=q, queue_offset=off, commitlog_offset=index * 1000 + 48)
    h.append(Event(t + 0.01, proc, outcome, "send", value))


def _log(node, msgs):
    lg = NodeLog(node)
    lg.messages = list(msgs)
    lg.entries = [(m.index, 1, m.index * 7) for m in msgs]
    lg.last_index = msgs[-1].index if msgs else -1
    return lg


def _consume(h, t, proc, msg_id, q, off):
    h.append(Event(t, proc, "ok", "consume", {"msg_id": msg_id, "queue_id": q, "queue_offset": off}))


def test_clean_history_passes():
    h: list[Event] = []
    _send(h, 0.0, "p0", "A", q=0, off=0, index=1)
    _send(h, 0.1, "p0", "B", q=0, off=1, index=2)
    _send(h, 0.2, "p1", "C", outcome="info")  # unknown and not stored: allowed
    _consume(h, 0.3, "c0", "A", 0, 0)
    _consume(h, 0.3, "c0", "B", 0, 1)
    logs = [_log(n, [_msg(1, "A", 0, 0), _msg(2, "B", 0, 1)]) for n in ("n0", "n1", "n2")]
    assert check_acked_present(h, logs, T).ok
    assert check_nothing_unsent(h, logs, T).ok
    assert check_queue_order(logs, T).ok


def test_lost_acknowledged_message_on_one_node_is_caught():
    h: list[Event] = []
    _send(h, 0.0, "p0", "A", q=0, off=0, index=1)
    _consume(h, 0.3, "c0", "A", 0, 0)
    logs = [_log("n0", [_msg(1, "A", 0, 0)]), _log("n1", [])]
    v = check_acked_present(h, logs, T)
    assert not v.ok and "n1" in v.violations[0] and "0 times" in v.violations[0]


def test_misplaced_acknowledgement_and_unconsumed_message_are_caught():
    h: list[Event] = []
    _send(h, 0.0, "p0", "A", q=0, off=5, index=1)  # acked at offset 5, stored at 0
    v = check_acked_present(h, [_log("n0", [_msg(1, "A", 0, 0)])], T)
    assert not v.ok
    assert any("stored at" in x for x in v.violations)
    assert any("never consumed" in x for x in v.violations)


def test_duplicate_delivery_needs_a_restart():
    h: list[Event] = []
    _send(h, 0.0, "p0", "A", q=0, off=0, index=1)
    _consume(h, 0.3, "c0", "A", 0, 0)
    _consume(h, 0.5, "c0", "A", 0, 0)
    logs = [_log("n0", [_msg(1, "A", 0, 0)])]
    assert not check_acked_present(h, logs, T).ok
    h.insert(5, Event(0.4, "c0", "ok", "load-offsets", {"offsets": {"0": 0}}))
    v = check_acked_present(h, logs, T)
    assert v.ok, v.violations
    assert v.stats["redelivered_after_restart"] == 1


def test_committed_offset_going_back_is_caught():
    h = [
        Event(0.1, "c0", "invoke", "commit", {"queue_id": 0, "offset": 3}),
        Event(0.2, "c0", "ok", "commit", {"queue_id": 0, "offset": 3}),
        Event(0.3, "c1", "ok", "load-offsets", {"offsets": {"0": 1}}),
    ]
    v = check_acked_present(h, [_log("n0", [])], T)
    assert not v.ok and "loaded offset 1" in v.violations[0]


def test_unsent_rejected_and_duplicated_messages_are_caught():
    h: list[Event] = []
    _send(h, 0.0, "p0", "A", q=0, off=0, index=1)
    _send(h, 0.1, "p0", "R", outcome="fail")
    logs = [_log("n0", [_msg(1, "A", 0, 0), _msg(2, "A", 0, 1), _msg(3, "R", 0, 2), _msg(4, "X", 0, 3)])]
    v = check_nothing_unsent(h, logs, T)
    text = " ".join(v.violations)
    assert "no producer sent it" in text and "rejected" in text and "2 times" in text


def test_queue_order_and_divergence_are_caught():
    gap = [_msg(1, "A", 0, 0), _msg(2, "B", 0, 2)]
    assert "expected 1" in check_queue_order([_log("n0", gap)], T).violations[0]
    a = _log("n0", [_msg(1, "A", 0, 0), _msg(2, "B", 0, 1)])
    b = _log("n1", [_msg(1, "A", 0, 0), _msg(2, "C", 0, 1)])
    v = check_queue_order([a, b], T)
    assert not v.ok and "holds C" in v.violations[0]
    bad_phys = _log("n0", [StoredMessage(1, "A", T, 0, 0, 99, 1000)])
    assert "PHYSICALOFFSET" in check_queue_order([bad_phys], T).violations[0]


def _op(i, f, v, a, b):
    return RegisterOp(i, f, v, a, b)


def test_register_linearizable_histories():
    # w1 completes, then a read sees it; a concurrent write may be seen or not
    ops = [
        _op(0, "write", "1", 0, 1),
        _op(1, "read", "1", 2, 3),
        _op(2, "write", "2", 2.5, 5),
        _op(3, "read", "1", 4, 4.5),
    ]
    ok, order, _ = check_register(ops)
    assert ok and [o.id for o in order][:2] == [0, 1]
    # an indeterminate write may take effect late
    ops = [_op(0, "write", "1", 0, float("inf")), _op(1, "read", None, 1, 2), _op(2, "read", "1", 3, 4)]
    assert check_register(ops)[0]


def test_register_stale_read_is_not_linearizable():
    ops = [_op(0, "write", "1", 0, 1), _op(1, "write", "2", 2, 3), _op(2, "read", "1", 4, 5)]
    ok, _, why = check_register(ops)
    assert not ok and "no linearization" in why
    # a read of a value never written
    assert not check_register([_op(0, "write", "1", 0, 1), _op(1, "read", "9", 2, 3)])[0]
    # reads going back in time: 2 then 1 while both writes completed before
    ops = [
        _op(0, "write", "1", 0, 1),
        _op(1, "write", "2", 0, 1),
        _op(2, "read", "2", 2, 3),
        _op(3, "read", "1", 4, 5),
    ]
    assert not check_register(ops)[0]


def test_linearizable_verdict_reads_a_history(tmp_path):
    h = History(tmp_path / "h.jsonl")
    h.add("r0", "invoke", "write", key="k", value="a")
    h.add("r0", "ok", "write", key="k", value="a")
    h.add("r1", "invoke", "read", key="k")
    h.add("r1", "ok", "read", key="k", value="a")
    h.add("r1", "invoke", "read", key="k")
    h.add("r1", "ok", "read", key="k", value=None)  # the write is lost: not linearizable
    h.close()
    v = check_linearizable(History.load(tmp_path / "h.jsonl"))
    assert not v.ok and v.stats["operations"] == 3


def test_longest_unavailability():
    h = [Event(t, "p", "ok", "send", {}) for t in (1.0, 1.5, 4.0)]
    assert longest_unavailability(h, 0.0, 5.0) == (2.5, 1.5)


def test_previous_values_cas_and_delete_outcomes_witness_every_acknowledged_write():
    from dledger.chaos.checkers import UNKNOWN

    def op(i, f, v, a, b, expected=None, observed=UNKNOWN):
        return RegisterOp(i, f, v, a, b, expected, observed)

    # a put that says it replaced nothing, after an acknowledged put: that write was lost
    lost = [op(0, "write", "a", 0, 1, observed=None), op(1, "write", "b", 2, 3, observed=None)]
    assert not check_register(lost)[0]
    assert check_register(
        [op(0, "write", "a", 0, 1, observed=None), op(1, "write", "b", 2, 3, observed="a")]
    )[0]
    # concurrent puts: each may have replaced the other, but not both nothing
    both = [op(0, "write", "a", 0, 3, observed=None), op(1, "write", "b", 1, 2, observed=None)]
    assert not check_register(both)[0]
    # cas: it swaps exactly when the register holds what it expects
    base = [op(0, "write", "a", 0, 1, observed=None)]
    assert check_register([*base, op(1, "cas", "c", 2, 3, "a", True), op(2, "read", "c", 4, 5)])[0]
    assert not check_register([*base, op(1, "cas", "c", 2, 3, "a", False)])[0]
    assert not check_register([*base, op(1, "cas", "c", 2, 3, "z", True)])[0]
    assert check_register([*base, op(1, "cas", "c", 2, float("inf"), "a"), op(2, "read", "c", 4, 5)])[0]
    # delete: it says whether the key existed, and leaves it absent
    assert check_register([*base, op(1, "delete", None, 2, 3, observed=True), op(2, "read", None, 4, 5)])[0]
    assert not check_register([*base, op(1, "delete", None, 2, 3, observed=False)])[0]
    assert not check_register([*base, op(1, "delete", None, 2, 3, observed=True), op(2, "read", "a", 4, 5)])[
        0
    ]


def test_the_history_carries_what_each_operation_observed(tmp_path):
    h = History(tmp_path / "h.jsonl")
    for process, f, fields, result in [
        ("r0", "write", {"value": "a"}, {"previous": None}),
        ("r1", "cas", {"value": "b", "expected": "a"}, {"swapped": True}),
        ("r0", "write", {"value": "c"}, {"previous": "a"}),  # but b replaced a: c must have replaced b
    ]:
        h.add(process, "invoke", f, key="k", **fields)
        h.add(process, "ok", f, key="k", **fields, **result)
    h.close()
    v = check_linearizable(History.load(tmp_path / "h.jsonl"))
    assert not v.ok and "key k" in v.violations[0]


def test_failover_times_count_a_new_leader_after_a_fault_that_hit_the_leader():
    from dledger.chaos.runner import failovers

    def ev(t, type_, f, **v):
        return Event(t, "x", type_, f, v)

    events = [
        ev(0.0, "observe", "leader", node="n0", term=1),
        ev(1.0, "nemesis", "kill-leader", phase="start", node="n0"),
        ev(1.8, "observe", "leader", node="n1", term=2),  # 0.8 s
        ev(2.0, "nemesis", "kill-leader", phase="heal"),
        ev(3.0, "nemesis", "kill-random", phase="start", node="n2"),  # not the leader: no failover
        ev(3.5, "nemesis", "kill-random", phase="heal"),
        ev(4.0, "nemesis", "partition-isolate-leader", phase="start", sides=[["n1"], ["n0", "n2"]]),
        ev(5.0, "nemesis", "partition-isolate-leader", phase="heal"),  # n1 led on: no failover
        ev(9.0, "observe", "leader", node="n2", term=3),
        ev(10.0, "nemesis", "powerloss-all", phase="start", nodes=["n0", "n1", "n2"]),
        ev(11.0, "nemesis", "powerloss-all", phase="heal"),
        ev(13.5, "observe", "leader", node="n0", term=4),  # a dead leader: counted past the heal, 3.5 s
    ]
    assert failovers(events) == [0.8, 3.5]
