"""Broker commands and the dispatcher state machine: dense queue offsets, idempotent replay, clear conflicts."""

import io

import pytest

from broker_adapter.core import commands, message
from broker_adapter.core.statemachine import BrokerStateMachine, Dispatched, DispatchError
from statemachine.api import CommittedEntry


def _msg(topic, qid, qoff, pos, tags=None, body=b"payload"):
    props = {message.PROPERTY_TAGS: tags} if tags else {}
    raw = bytearray(message.encode(message.Message(topic=topic, body=body, queue_id=qid, properties=props)))
    message.patch_placement(raw, qoff, pos + 48)
    return bytes(raw)


class Log:
    """Assigns index and pos the way the leader does, for bodies given in order."""

    def __init__(self):
        self.index, self.pos = 0, 0

    def entries(self, bodies):
        out = []
        for b in bodies:
            out.append(CommittedEntry(self.index, 1, self.pos, b))
            self.index += 1
            self.pos += 48 + len(b)
        return out

    def msg(self, topic, qid, qoff, **kw):
        return _msg(topic, qid, qoff, self.pos, **kw)


def test_command_round_trip_and_validation():
    for cmd in (commands.CreateTopic("orders", 4), commands.CommitOffset("g1", "orders", 2, 17)):
        raw = commands.encode(cmd)
        assert commands.is_command(raw) and not commands.is_message(raw)
        assert commands.decode(raw) == cmd
    with pytest.raises(commands.CommandError, match="invalid topic"):
        commands.encode(commands.CreateTopic("bad topic!", 1))
    with pytest.raises(commands.CommandError, match="queues"):
        commands.encode(commands.CreateTopic("t", 0))
    with pytest.raises(commands.CommandError, match=">= 0"):
        commands.encode(commands.CommitOffset("g", "t", 0, -1))


def test_dispatch_builds_dense_queues_and_offsets(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    (created,) = sm.apply(log.entries([commands.encode(commands.CreateTopic("orders", 2))]))
    assert created == commands.CreateTopic("orders", 2)
    results = []
    for i in range(6):
        results += sm.apply(log.entries([log.msg("orders", i % 2, i // 2, tags="A")]))
    assert all(isinstance(r, Dispatched) for r in results)
    assert [sm.max_offset("orders", q) for q in (0, 1)] == [3, 3]
    unit = sm.queue("orders", 1).get(2)
    assert unit.commitlog_offset == results[5].commitlog_offset and unit.tags_code == message.tags_code("A")
    sm.apply(log.entries([commands.encode(commands.CommitOffset("g", "orders", 1, 2))]))
    assert sm.committed_offset("g", "orders", 1) == 2
    (bad,) = sm.apply(log.entries([commands.encode(commands.CommitOffset("g", "orders", 5, 2))]))
    assert isinstance(bad, commands.CommandError) and "unknown queue" in str(bad)
    sm.close()


def test_replay_is_idempotent_and_conflicts_are_named(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    first = log.entries([log.msg("t", 0, 0)]) + log.entries([log.msg("t", 0, 1)])
    sm.apply(first)
    sm.close()
    sm = BrokerStateMachine(tmp_path / "cq")  # a restart without a snapshot replays what was dispatched
    sm.apply(first)
    assert sm.max_offset("t", 0) == 2 and sm.next_offset("t", 0) == 2
    sm.close()
    sm = BrokerStateMachine(tmp_path / "cq")
    e = first[0]
    moved = [CommittedEntry(e.index, e.term, e.pos + 8, _msg("t", 0, 0, e.pos + 8))]  # same offset, elsewhere
    with pytest.raises(DispatchError, match="ConsumeQueue points at"):
        sm.apply(moved)
    sm.close()
    sm = BrokerStateMachine(tmp_path / "cq")
    sm.apply(first)
    with pytest.raises(DispatchError, match="next offset is 2"):
        sm.apply(log.entries([log.msg("t", 0, 5)]))
    sm.close()


def test_a_replay_reads_the_units_it_checks_ahead_and_still_names_a_conflict(tmp_path, monkeypatch):
    from broker_adapter.core import statemachine

    monkeypatch.setattr(statemachine, "REPLAY_UNITS", 8)  # blocks of 8 units: 50 messages span seven reads
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    entries = []
    for q in range(50):
        entries += log.entries([log.msg("t", q % 2, q // 2)])
    sm.apply(entries)
    sm.close()

    sm = BrokerStateMachine(tmp_path / "cq")  # a restart without a snapshot: every unit is checked
    reads = []
    real = statemachine.ConsumeQueue.raw_units
    monkeypatch.setattr(
        statemachine.ConsumeQueue,
        "raw_units",
        lambda cq, q, n: reads.append((cq.queue_id, q)) or real(cq, q, n),
    )
    for i in range(0, 50, 5):  # in apply chunks, as the apply loop hands them
        sm.apply(entries[i : i + 5])
    assert sorted(reads) == [(qid, q) for qid in (0, 1) for q in (0, 8, 16, 24)]
    assert sm.next_offset("t", 0) == sm.next_offset("t", 1) == 25
    sm.close()

    sm = BrokerStateMachine(tmp_path / "cq")
    sm.apply(entries[:20])  # units 0-9 of each queue read ahead (0-7, then 8-15)
    cq = sm.queue("t", 0)
    cq.put(10, 1, 2, 3)  # a unit rewritten under what was read ahead: read again, and the conflict named
    e = entries[20]
    with pytest.raises(DispatchError, match="offset 10: ConsumeQueue points at 1 \\(size 2\\)"):
        sm.apply([e])
    sm.close()


def test_snapshot_round_trip_truncate_beyond_and_repair(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    sm.apply(log.entries([commands.encode(commands.CreateTopic("t", 1))]))
    ends, entries = [], []
    for q in range(5):
        entries += log.entries([log.msg("t", 0, q)])
        sm.apply(entries[-1:])
        ends.append(log.pos)
    sm.apply(log.entries([commands.encode(commands.CommitOffset("g", "t", 0, 3))]))
    buf = io.BytesIO()
    sm.save_snapshot(buf)
    units = sm.queue("t", 0).read(0, 5)
    sm.close()

    again = BrokerStateMachine(tmp_path / "cq")
    again.load_snapshot(io.BytesIO(buf.getvalue()))
    assert again.topics == {"t": 1} and again.committed_offset("g", "t", 0) == 3
    assert not again.short_queues
    # The log now ends after the third message: the queue is not open yet, so it is cut when first opened.
    assert again.truncate_beyond(ends[2]) == 0
    assert again.max_offset("t", 0) == 3
    # A snapshot covering units the ConsumeQueue lacks leaves a hole (size-0 units) and asks for a repair.
    again.load_snapshot(io.BytesIO(buf.getvalue()))
    assert again.short_queues == {("t", 0): 5} and again.max_offset("t", 0) == 5
    assert again.queue("t", 0).get(4).size == 0
    assert again.repair((e.index, e.pos, e.body) for e in entries) == 2
    assert again.queue("t", 0).read(0, 5) == units and not again.short_queues
    again.close()
    reopened = BrokerStateMachine(tmp_path / "cq")
    assert reopened.queue("t", 0).read(0, 5) == units
    reopened.close()


def test_hole_survives_reopen_and_dispatch_continues_after_it(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq", units_per_file=4)
    cq = sm.queue("t", 0)
    cq.skip_to(6)  # spans a file boundary
    assert cq.max_offset == 6 and cq.get(5).size == 0
    sm.close()
    again = BrokerStateMachine(tmp_path / "cq", units_per_file=4)
    assert again.queue("t", 0).max_offset == 6
    assert again.queue("t", 0).read(0, 4) == []  # the hole's first file does not exist
    log = Log()
    for q in range(6):
        e = log.entries([log.msg("t", 0, q)])[0]
    again.short_queues[("t", 0)] = 6
    assert again.repair([(e.index, e.pos, e.body)]) == 1  # only the last message is still in the log
    assert again.queue("t", 0).get(5).commitlog_offset == e.pos + 48
    again.close()


def test_producer_table_is_bounded_and_survives_a_snapshot(tmp_path, monkeypatch):
    from broker_adapter.core import statemachine as dispatcher

    monkeypatch.setattr(dispatcher, "PRODUCER_WINDOW", 3)
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    sm.apply(log.entries([commands.encode(commands.CreateTopic("t", 1))]))
    for seq in range(5):
        props = {message.PROPERTY_PRODUCER_ID: "p1", message.PROPERTY_SEQUENCE: str(seq)}
        raw = bytearray(message.encode(message.Message(topic="t", body=b"b", properties=props)))
        message.patch_placement(raw, seq, log.pos + 48)
        sm.apply(log.entries([bytes(raw)]))
    assert sm.sent("p1", 4).queue_offset == 4
    assert sm.sent("p1", 0) is True, "older than the window: known as sent, result forgotten"
    assert sm.sent("p1", 5) is False and sm.sent("p2", 0) is False
    buf = io.BytesIO()
    sm.save_snapshot(buf)
    sm.close()
    again = BrokerStateMachine(tmp_path / "cq")
    again.load_snapshot(io.BytesIO(buf.getvalue()))
    assert [again.sent("p1", s) for s in range(6)] == [sm.sent("p1", s) for s in range(6)]
    assert again.next_offset("t", 0) == 5
    again.close()


def test_producer_table_takes_sequences_out_of_order_and_counts_a_repeat_once(tmp_path):
    """Concurrent sends of one producer reach the log out of sequence order; a sequence already in the log
    (a retry the leader should have caught) is counted as a duplicate, the others are not."""
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    sm.apply(log.entries([commands.encode(commands.CreateTopic("t", 1))]))
    for q, seq in enumerate([0, 2, 1, 2]):
        props = {message.PROPERTY_PRODUCER_ID: "p1", message.PROPERTY_SEQUENCE: str(seq)}
        raw = bytearray(message.encode(message.Message(topic="t", body=b"b", properties=props)))
        message.patch_placement(raw, q, log.pos + 48)
        sm.apply(log.entries([bytes(raw)]))
    assert sm.duplicates == 1
    assert [sm.sent("p1", s).queue_offset for s in (0, 1)] == [0, 2]
    assert sm.sent("p1", 2).queue_offset == 3, "the repeat's place is the one remembered"
    assert sm.sent("p1", 3) is False
    assert list(sm.producers["p1"].order) == [0, 2, 1] and sm.producers["p1"].last_seq == 2
    sm.close()


def test_a_message_not_placed_by_the_broker_is_skipped_not_fatal(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    log = Log()
    sm.apply(log.entries([commands.encode(commands.CreateTopic("t", 1))]))
    forged = _msg("t", 0, 7, pos=12345)  # e.g. raw bytes appended through the DLedger API
    (result,) = sm.apply(log.entries([forged]))
    assert isinstance(result, message.MessageFormatError) and "not placed by the broker" in str(result)
    (ok,) = sm.apply(log.entries([log.msg("t", 0, 0)]))
    assert isinstance(ok, Dispatched) and ok.queue_offset == 0
    sm.close()
