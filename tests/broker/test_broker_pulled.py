"""Pulls at batch granularity: ``Broker.pull_raw`` serves the stored bytes as they are and
``broker_adapter.pulled.decode`` turns them into the same messages a decoded pull gives."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from broker_adapter import pulled
from broker_adapter.core import message
from broker_adapter.core.allocator import QueueOffsetAllocator
from broker_adapter.core.broker import Broker
from broker_adapter.core.model import UnknownQueueError
from broker_adapter.core.statemachine import BrokerStateMachine
from dledger.core.messages import Role
from dledger.errors import DLedgerError, InvalidRequestError
from storage.errors import StorageCorruptError
from storage.filestore import FileLogStore
from tests.broker.test_broker import FakeNode, _entries, made, out, run, topic
from tests.conftest import TEST_INDEX_UNITS

SEGMENT = 1 << 20

__all__ = ["made"]  # the fixture, imported for pytest


def as_pulled(m) -> pulled.PulledMessage:
    """A decoded pull's message as the Broker face and the client turn it into a ``PulledMessage``."""
    return pulled.PulledMessage(
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.physical_offset,
        m.body,
        m.tags or None,
        tuple(m.keys),
        m.msg_id or "",
        dict(m.properties),
        m.born_timestamp,
        m.store_timestamp,
    )


@run
async def test_a_raw_pull_decodes_to_what_a_pull_gives(made):
    broker, _ = made
    await topic(broker)
    await broker.send(
        "T",
        [
            out(0, b"a", tags="TagA", keys=["k1", "k2"], properties={"u": "1\u00e9"}, born_timestamp=7),
            out(1, b"other queue"),
            out(0, b"", msg_id="MID"),
            out(0, bytes(range(256)) * 8, producer_id="p", sequence=3),
        ],
    )
    for offset, n in ((0, 10), (1, 1), (1, 2), (3, 5)):
        want = await broker.pull("T", 0, offset, n)
        got = await broker.pull_raw("T", 0, offset, n)
        assert (got.next_offset, got.max_offset, got.count) == (
            want.next_offset,
            want.max_offset,
            len(want.messages),
        )
        assert pulled.decode(got.data, got.count) == [as_pulled(m) for m in want.messages]
    first = pulled.decode((await broker.pull_raw("T", 0, 0, 1)).data, 1)[0]
    assert (first.tags, first.keys, first.properties["u"]) == ("TagA", ("k1", "k2"), "1\u00e9")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("T", 5, 0, 1), UnknownQueueError),
        (("T", 0, -1, 1), InvalidRequestError),
        (("T", 0, 0, 0), InvalidRequestError),
        (("T", 0, 0, 1025), InvalidRequestError),
        (("T", 0, 9, 1), InvalidRequestError),
    ],
)
@run
async def test_a_raw_pull_refuses_what_a_pull_refuses(made, args, error):
    broker, _ = made
    await topic(broker)
    await broker.send("T", [out(0)])
    with pytest.raises(error):
        await broker.pull(*args)
    with pytest.raises(error):
        await broker.pull_raw(*args)


@run
async def test_an_empty_raw_pull_and_malformed_bytes(made):
    broker, _ = made
    await topic(broker)
    empty = await broker.pull_raw("T", 0, 0, 5)
    assert (empty.data, empty.count, empty.next_offset, empty.max_offset) == (b"", 0, 0, 0)
    assert pulled.decode(b"", 0) == []
    await broker.send("T", [out(0, b"a"), out(0, b"b")])
    raw = await broker.pull_raw("T", 0, 0, 5)
    assert len(pulled.decode(raw.data, 2)) == 2
    for bad, count in ((raw.data, 3), (raw.data[:-1], 2), (raw.data + b"\0" * 10, 2), (b"x" * 200, 1)):
        with pytest.raises(DLedgerError):
            pulled.decode(bad, count)


@pytest.fixture
def on_files(tmp_path):
    """(broker, node) as ``made`` gives them, over a FileLogStore (the store whose reads check each entry), with
    ConsumeQueue files of 3 units (pulls cross them)."""
    holder: list[Broker] = []
    sm = BrokerStateMachine(
        tmp_path / "cq", on_dispatch=lambda t, q, n: holder[0].dispatched(t, q, n), units_per_file=3
    )
    node = FakeNode(sm)
    node.log_store = FileLogStore.open(
        str(tmp_path / "log"), segment_size=SEGMENT, index_units=TEST_INDEX_UNITS
    )
    broker = Broker(node, sm, QueueOffsetAllocator(sm, _entries(node.log_store), lambda: sm.applied_index))
    holder.append(broker)
    broker.role_changed(Role.LEADER, node.term)
    yield broker, node
    sm.close()
    node.log_store.close()


@run
async def test_a_corrupt_entry_in_a_pull_is_named(on_files):
    broker, node = on_files
    await topic(broker)
    sent = await broker.send("T", [out(0, bytes([i]) * 100) for i in range(4)])
    assert [m.body for m in (await broker.pull("T", 0, 0, 4)).messages] == [
        bytes([i]) * 100 for i in range(4)
    ]
    where = sent[2].commitlog_offset + 60  # a byte inside the third message's body
    path = Path(node.log_store.directory) / "data" / f"{where - where % SEGMENT:020d}"
    with open(path, "r+b") as f:
        f.seek(where % SEGMENT)
        f.write(b"\xee")
    for pull in (broker.pull_raw, broker.pull):
        with pytest.raises(StorageCorruptError) as e:
            await pull("T", 0, 0, 4)
        assert "body_crc" in str(e.value)
        assert (e.value.path, e.value.index) == (str(path), 3)  # entry 0 created the topic
    assert (await broker.pull_raw("T", 0, 3, 4)).count == 1  # the messages after it are still served
    assert (await broker.pull_raw("T", 0, 0, 2)).count == 2


def test_a_pulled_message_reads_its_properties_when_asked():
    props = {
        "x": "TAGS",
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "MID",
        "u": "v\u00e9",
    }
    raw = message.encode(
        message.Message(
            "T",
            b"body",
            1,
            queue_offset=5,
            physical_offset=900,
            born_timestamp=3,
            store_timestamp=4,
            properties=props,
        )
    )
    (m,) = pulled.decode(raw, 1)
    built = pulled.PulledMessage("T", 1, 5, 900, b"body", "TagA", ["k1", "k2"], "MID", props, 3, 4)
    assert (m.tags, m.keys, m.msg_id, m.properties) == ("TagA", ("k1", "k2"), "MID", props)
    assert (m.topic, m.queue_id, m.queue_offset, m.commitlog_offset, m.body) == ("T", 1, 5, 900, b"body")
    assert (m.born_timestamp, m.store_timestamp) == (3, 4)
    assert m == built and hash(m) == hash(built) and not (m != built)  # noqa: SIM202 - __ne__ is ours
    assert m != pulled.PulledMessage("T", 1, 5, 900, b"body", "TagB", ["k1", "k2"], "MID", props, 3, 4)
    assert repr(m) == repr(built) and "msg_id='MID'" in repr(m)
    assert pickle.loads(pickle.dumps(m)) == m
    with pytest.raises(AttributeError):
        m.topic = "U"  # type: ignore[misc]
    with pytest.raises(TypeError):
        assert m < built
    (bare,) = pulled.decode(message.encode(message.Message("T", b"")), 1)
    assert (bare.tags, bare.keys, bare.msg_id, bare.properties) == (None, (), "", {})


def test_malformed_properties_raise_when_read():
    no_separator = bytearray(message.encode(message.Message("T", b"b", properties={"a": "b"})))
    no_separator[-3] = ord("z")  # "a\x01b\x02" -> "azb\x02"
    not_utf8 = bytearray(message.encode(message.Message("T", b"b", properties={"TAGS": "ab"})))
    not_utf8[-2] = 0xFF
    for raw, names in ((no_separator, ("properties",)), (not_utf8, ("properties", "tags"))):
        (m,) = pulled.decode(bytes(raw), 1)
        assert m.body == b"b"
        for name in names:
            with pytest.raises(DLedgerError, match="properties are malformed"):
                getattr(m, name)


@run
async def test_a_pull_crosses_consume_queue_files(on_files):
    broker, _ = on_files
    await topic(broker)
    bodies = [bytes([i]) * (i + 1) for i in range(11)]
    await broker.send("T", [out(i % 2, b) for i, b in enumerate(bodies)])
    mine = bodies[0::2]
    for offset, n in ((0, 6), (1, 4), (2, 1), (4, 9)):
        raw = await broker.pull_raw("T", 0, offset, n)
        want = mine[offset : offset + n]
        assert (raw.count, raw.next_offset) == (len(want), offset + len(want))
        assert [m.body for m in pulled.decode(raw.data, raw.count)] == want
        assert [m.body for m in (await broker.pull("T", 0, offset, n)).messages] == want
