"""The replicated consumption state of RocketMQ 5 groups (``invisibility``) and what carries it: pop / ack /
change-invisible commands, receipt handles, message conversion. Pure units; a hypothesis property checks that the
state is replay-deterministic (a snapshot taken anywhere and restored gives the same state as a node that never
restarted) and that an acknowledged offset is never delivered again."""

from __future__ import annotations

import gzip
import hashlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import Code, Encoding, MessageType, definition_pb2

from broker_adapter.core import commands, message
from broker_adapter.core.invisibility import WINDOW, Outcome, PopStates
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.rocketmq import convert
from broker_adapter.rocketmq.recall import RecallHandle, RecallHandleError
from broker_adapter.rocketmq.receipt import ReceiptHandle, ReceiptHandleError
from broker_adapter.rocketmq.status import RocketMQError
from statemachine.api import CommittedEntry

G, T = "g", "t"


def pop(now, offsets, invisible=1000, skip=()):
    return commands.Pop(G, T, 0, now, invisible, tuple(offsets), tuple(skip))


def test_pop_ack_redeliver_and_window():
    s = PopStates()
    p = s.pop(pop(0, [0, 1, 2]), start=0, end=3)
    assert [(d.offset, d.epoch, d.attempt) for d in p.deliveries] == [(0, 1, 1), (1, 2, 1), (2, 3, 1)]
    assert p.deadline_ms == 1000
    # Still invisible at 999: nothing granted twice; offset 3 does not exist yet.
    assert s.pop(pop(999, [0, 1, 2, 3]), 0, 3).deliveries == ()
    assert s.ack(commands.Ack(G, T, 0, 1, 2)).outcome is Outcome.DONE
    assert s.ack(commands.Ack(G, T, 0, 1, 2)).outcome is Outcome.ALREADY
    q = s.get((G, T, 0))
    assert (q.low, q.next) == (0, 3)
    # At 1000 the unacknowledged 0 and 2 are deliverable again, as attempt 2, with new epochs.
    assert q.deliverable(1000, 3, 10) == [0, 2]
    p2 = s.pop(pop(1000, [0, 2]), 0, 3)
    assert [(d.offset, d.attempt) for d in p2.deliveries] == [(0, 2), (2, 2)]
    assert s.ack(commands.Ack(G, T, 0, 0, 1)).outcome is Outcome.REDELIVERED  # the old handle
    assert s.ack(commands.Ack(G, T, 0, 0, p2.deliveries[0].epoch)).outcome is Outcome.DONE
    assert s.ack(commands.Ack(G, T, 0, 7, 1)).outcome is Outcome.NOT_DELIVERED
    assert (q.low, q.next) == (2, 3)
    # Changing the invisible time issues a new epoch; the old one is then stale.
    h = s.change_invisible(commands.ChangeInvisible(G, T, 0, 2, p2.deliveries[1].epoch, 1500, 5000))
    assert (h.outcome, h.deadline_ms) == (Outcome.DONE, 6500)
    assert s.ack(commands.Ack(G, T, 0, 2, p2.deliveries[1].epoch)).outcome is Outcome.REDELIVERED
    assert s.ack(commands.Ack(G, T, 0, 2, h.epoch)).outcome is Outcome.DONE
    assert (q.low, q.next, q.inflight) == (3, 3, {})
    # Out-of-order and beyond-window offsets are never granted; the window bounds the state.
    assert s.pop(pop(2000, [4]), 0, 10).deliveries == ()
    s2 = PopStates()
    got = s2.pop(pop(0, range(WINDOW + 5)), 0, WINDOW + 5).deliveries
    assert len(got) == WINDOW


def test_skipped_offsets_count_as_done():
    s = PopStates()
    p = s.pop(pop(0, [1], skip=[0, 2]), 0, 3)
    assert [d.offset for d in p.deliveries] == [1]
    q = s.get((G, T, 0))
    assert (q.low, q.next, set(q.inflight)) == (1, 3, {1})


ops = st.lists(
    st.one_of(
        st.tuples(st.just("pop"), st.integers(0, 20), st.integers(1, 4), st.integers(1, 5)),
        st.tuples(st.just("ack"), st.integers(0, 12), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("change"), st.integers(0, 12), st.integers(0, 30), st.integers(0, 5)),
    ),
    max_size=60,
)


def run_ops(s: PopStates, seq, clock: list[int], acked: set[int]) -> None:
    for op, a, b, c in seq:
        clock[0] += 1
        now = clock[0]
        q = s.view((G, T, 0), 0)
        if op == "pop":
            offsets = q.deliverable(now, a, b)
            for d in s.pop(pop(now, offsets, invisible=c), 0, a).deliveries:
                assert d.offset not in acked, f"acknowledged offset {d.offset} delivered again"
        elif op == "ack":
            if s.ack(commands.Ack(G, T, 0, a, b)).outcome is Outcome.DONE:
                acked.add(a)
        else:
            s.change_invisible(commands.ChangeInvisible(G, T, 0, a, b, now, c))
        q = s.get((G, T, 0))
        if q is not None:
            assert all(q.low <= o < q.next for o in q.inflight) and q.next - q.low <= WINDOW
            # nothing is skipped here: every delivered offset not in flight was acknowledged
            assert all(o in q.inflight or o in acked for o in range(q.next))


@settings(max_examples=150, deadline=None)
@given(ops, ops)
def test_replay_and_snapshot_give_the_same_state(first, second):
    a, clock_a, acked_a = PopStates(), [0], set()
    run_ops(a, first, clock_a, acked_a)
    b = PopStates.from_json(a.to_json())  # a node restarting from a snapshot taken here
    assert b.to_json() == a.to_json()
    clock_b, acked_b = list(clock_a), set(acked_a)
    run_ops(a, second, clock_a, acked_a)
    run_ops(b, second, clock_b, acked_b)
    assert a.to_json() == b.to_json()


def test_dispatcher_applies_pops_and_snapshots_them(tmp_path):
    sm = BrokerStateMachine(tmp_path / "cq")
    entries, pos = [], 0

    def add(body):
        nonlocal pos
        entries.append(CommittedEntry(len(entries), 1, pos, body))
        pos += 48 + len(body)

    add(commands.encode(commands.CreateTopic(T, 1)))
    for i in range(3):
        raw = bytearray(message.encode(message.Message(topic=T, body=b"x", queue_id=0)))
        message.patch_placement(raw, i, pos + 48)
        add(bytes(raw))
    add(commands.encode(pop(5, [0, 1, 2])))
    add(commands.encode(commands.Ack(G, T, 0, 0, 1)))
    add(commands.encode(commands.Ack(G, T, 0, 1, 2)))
    add(commands.encode(commands.Pop(G, T, 7, 5, 5, (0,))))  # unknown queue: refused on every node
    results = sm.apply(entries)
    assert [d.offset for d in results[4].deliveries] == [0, 1, 2]
    assert isinstance(results[-1], commands.CommandError)
    assert sm.committed_offset(G, T, 0) == 2  # the group's offset follows its acknowledgements
    buf = io.BytesIO()
    sm.save_snapshot(buf)
    restored = BrokerStateMachine(tmp_path / "cq2")
    restored.load_snapshot(io.BytesIO(buf.getvalue()))
    assert restored.pops.to_json() == sm.pops.to_json()
    # An explicit offset (UpdateOffset / CommitOffset) restarts the group's consumption there.
    restored.apply([CommittedEntry(99, 1, pos, commands.encode(commands.CommitOffset(G, T, 0, 1)))])
    q = restored.pops.get((G, T, 0))
    assert (q.low, q.next, q.inflight) == (1, 1, {})


def test_receipt_handles_round_trip_and_refuse_tampering():
    h = ReceiptHandle("group-1", "topic%x", 3, 1 << 40, 7, 1_700_000_000_000)
    text = h.encode()
    assert ReceiptHandle.decode(text) == h
    for bad in ("", "v2abc", "v1!!!", text[:-3], text[:10] + ("A" if text[10] != "A" else "B") + text[11:]):
        with pytest.raises(ReceiptHandleError):
            ReceiptHandle.decode(bad)


@given(
    st.text(min_size=1, max_size=30),
    st.text(max_size=30),
    st.integers(0, 2**62),
    st.integers(-(2**40), 2**50),
    st.text(min_size=1, max_size=60),
)
def test_recall_handles_round_trip(group, topic, offset, due, msg_id):
    h = RecallHandle(group, topic, offset, due, msg_id)
    assert RecallHandle.decode(h.encode()) == h


def test_recall_handles_refuse_tampering_and_receipt_handles():
    text = RecallHandle("dledger", "topic%x", 12, 1_700_000_000_000, "01" + "AB" * 16).encode()
    receipt = ReceiptHandle("g", "t", 0, 1, 1, 2).encode()
    flipped = text[:10] + ("A" if text[10] != "A" else "B") + text[11:]
    for bad in ("", "r2abc", "r1!!!", text[:-3], flipped, receipt, "r1" + receipt[2:]):
        with pytest.raises(RecallHandleError):
            RecallHandle.decode(bad)


def v2(body=b"b", **sp) -> definition_pb2.Message:
    m = definition_pb2.Message(body=body)
    m.topic.name = T
    m.system_properties.message_id = "01" + "AB" * 12 + "0000002A"
    for k, v in sp.items():
        if k == "keys":
            m.system_properties.keys.extend(v)
        else:
            setattr(m.system_properties, k, v)
    return m


def test_conversion_keeps_rocketmq_properties_both_ways():
    src = v2(b"hello", tag="TagA", keys=["k1", "k2"], message_group="orders-1", born_host="producer-host")
    src.user_properties["color"] = "red"
    out = convert.outgoing(src, 2, "host@1@0@x", 1000)
    assert (out.queue_id, out.tags, list(out.keys), out.msg_id) == (
        2,
        "TagA",
        ["k1", "k2"],
        src.system_properties.message_id,
    )
    assert (out.producer_id, out.sequence) == (
        "host@1@0@x",
        42,
    )  # the sequence inside the client's message id
    assert out.properties == {
        "color": "red",
        message.PROPERTY_MESSAGE_GROUP: "orders-1",
        message.PROPERTY_BORN_HOST: "producer-host",
    }
    props = dict(out.properties)
    props.update(
        {message.PROPERTY_TAGS: "TagA", message.PROPERTY_KEYS: "k1 k2", message.PROPERTY_UNIQ_KEY: out.msg_id}
    )
    stored = message.Message(topic=T, body=b"hello", queue_id=2, queue_offset=9, properties=props)
    back = convert.incoming(stored, receipt_handle="v1x", attempt=3, invisible_ms=1500)
    sp = back.system_properties
    assert (back.body, sp.tag, list(sp.keys), sp.message_id, sp.message_group) == (
        b"hello",
        "TagA",
        ["k1", "k2"],
        out.msg_id,
        "orders-1",
    )
    assert (sp.message_type, sp.queue_offset, sp.delivery_attempt, sp.receipt_handle) == (
        MessageType.FIFO,
        9,
        3,
        "v1x",
    )
    assert dict(back.user_properties) == {"color": "red", message.PROPERTY_MESSAGE_GROUP: "orders-1"}
    assert sp.born_host == "producer-host"
    assert sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"body": b""}, Code.MESSAGE_BODY_EMPTY),
        ({"body": b"x" * 1001}, Code.MESSAGE_BODY_TOO_LARGE),
        ({"tag": "a|b"}, Code.ILLEGAL_MESSAGE_TAG),
        ({"keys": ["with space"]}, Code.ILLEGAL_MESSAGE_KEY),
        ({"props": {message.PROPERTY_TAGS: "x"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"props": {"k": "bad\x01value"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"props": {message.PROPERTY_MESSAGE_GROUP: "g"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (
            {"props": {"RETRY_TOPIC": "t"}},
            Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
        ),  # the broker counts retries by it
        ({"props": {"RECONSUME_TIME": "0"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"props": {f"k{i}": "v" for i in range(129)}}, Code.MESSAGE_PROPERTIES_TOO_LARGE),
        ({"props": {"k": "v" * 16384}}, Code.MESSAGE_PROPERTIES_TOO_LARGE),
        ({"message_group": "g" * 65}, Code.ILLEGAL_MESSAGE_GROUP),
        (
            {"body": gzip.compress(b"\0" * 10_000_000), "body_encoding": Encoding.GZIP},
            Code.MESSAGE_BODY_TOO_LARGE,
        ),
        ({"body": gzip.compress(b"hello")[:-6], "body_encoding": Encoding.GZIP}, Code.MESSAGE_CORRUPTED),
        ({"body": b"not gzip", "body_encoding": Encoding.GZIP}, Code.MESSAGE_CORRUPTED),
        (
            {"props": {message.PROPERTY_MESSAGE_GROUP: "g"}, "message_group": "h"},
            Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
        ),
        ({"message_id": ""}, Code.ILLEGAL_MESSAGE_ID),
    ],
)
def test_bad_messages_get_the_protocol_codes(fields, code):
    props = fields.pop("props", {})
    body = fields.pop("body", b"b")
    m = v2(body, **fields)
    m.user_properties.update(props)
    with pytest.raises(RocketMQError) as err:
        convert.outgoing(m, 0, "c", 1000)
    assert err.value.code == code


def test_gzip_bodies_are_stored_inflated_member_after_member():
    one = convert.outgoing(v2(gzip.compress(b"x" * 1000), body_encoding=Encoding.GZIP), 0, "c", 1000)
    two = convert.outgoing(
        v2(gzip.compress(b"ab") + gzip.compress(b"cd"), body_encoding=Encoding.GZIP), 0, "c", 1000
    )
    assert (one.body, two.body) == (b"x" * 1000, b"abcd")


def test_a_received_fifo_message_sent_on_with_its_properties_is_taken():
    """A consumer sees its message group as __SHARDINGKEY too; sending that message on keeps the group."""
    received = convert.incoming(
        message.Message(topic=T, body=b"b", properties={message.PROPERTY_MESSAGE_GROUP: "g", "k": "v"})
    )
    again = v2(message_group=received.system_properties.message_group)
    again.user_properties.update(received.user_properties)
    out = convert.outgoing(again, 0, "c", 1000)
    assert out.properties == {"k": "v", message.PROPERTY_MESSAGE_GROUP: "g"}


@pytest.mark.parametrize(
    "fields",
    [
        {"message_type": MessageType.LITE},
        {"lite_topic": "x"},
        {"message_type": MessageType.PRIORITY},
        {"priority": 3},
    ],
)
def test_unsupported_message_types(fields):
    with pytest.raises(RocketMQError) as err:
        convert.check_type(v2(**fields))
    assert err.value.code == Code.UNSUPPORTED and "not supported" in err.value.message


def test_message_kinds_delay_and_transaction():
    assert convert.check_type(v2()) == convert.NORMAL
    assert convert.check_type(v2(message_type=MessageType.TRANSACTION)) == convert.TRANSACTION
    delayed = v2()
    delayed.system_properties.delivery_timestamp.FromMilliseconds(5_000)
    assert convert.check_type(delayed) == convert.DELAY and convert.delivery_ms(delayed) == 5_000
    with pytest.raises(RocketMQError) as err:
        convert.check_type(v2(message_type=MessageType.DELAY))  # no delivery time
    assert err.value.code == Code.ILLEGAL_DELIVERY_TIME
    conflict = v2(message_type=MessageType.TRANSACTION)
    conflict.system_properties.delivery_timestamp.FromMilliseconds(5_000)
    with pytest.raises(RocketMQError) as err:
        convert.check_type(conflict)
    assert err.value.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
