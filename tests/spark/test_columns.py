"""The batch read's column-wise decoding (``spark/datasource/columns.py``) against the per-message path it
replaces (``broker_adapter.pulled.decode`` then ``queues.to_batch``): the same rows for every pull, the same
error for bytes that are not one, and the fast path really taken for every well-formed pull (a path that
always declined would pass the comparisons and be slow)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter.core import formats, message
from broker_adapter.pulled import decode
from dledger.errors import DLedgerError
from spark.datasource.columns import to_columns
from spark.datasource.queues import SCHEMA, raw_batch, to_batch

TOPIC = "orders"
_TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)
_NAMES = st.sampled_from(
    [
        formats.PROPERTY_TAGS,
        formats.PROPERTY_KEYS,
        formats.PROPERTY_UNIQ_KEY,
        formats.PROPERTY_PRODUCER_ID,
        formats.PROPERTY_SEQUENCE,
        "a",
        "b",
        "é",
    ]
) | _TEXT.filter(bool)


def stored(body: bytes, props: bytes, *, topic: str = TOPIC, queue_offset: int = 0, stamp: int = 0) -> bytes:
    """A message as the CommitLog stores it, with ``props`` as its properties bytes, whatever they hold."""
    head = message.encode_fields(
        topic,
        body,
        {},
        queue_id=3,
        queue_offset=queue_offset,
        physical_offset=1000 + 500 * queue_offset,
        born_timestamp=stamp - 7,
        store_timestamp=stamp,
    )[:-2]
    whole = head + len(props).to_bytes(2, "big") + props
    return len(whole).to_bytes(4, "big") + whole[4:]


def text(items: list[tuple[str, str]], trailing: bool = True) -> bytes:
    joined = formats.PROPERTY_SEPARATOR.join(f"{k}{formats.NAME_VALUE_SEPARATOR}{v}" for k, v in items)
    return (joined + (formats.PROPERTY_SEPARATOR if trailing and items else "")).encode()


def reference(data: bytes, count: int) -> pa.RecordBatch:
    return to_batch("g0", decode(data, count))


def columnar(data: bytes, count: int) -> pa.RecordBatch:
    cols = to_columns("g0", TOPIC, data, count)
    assert cols is not None, "the column-wise path declined a well-formed pull"
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)


def assert_same(data: bytes, count: int) -> None:
    want = reference(data, count)
    got = columnar(data, count)
    for name in SCHEMA.names:
        assert got.column(name).equals(want.column(name)), (name, got.column(name), want.column(name))
    assert raw_batch("g0", TOPIC, data, count).equals(want)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=40),
            st.lists(st.tuples(_NAMES, _TEXT), max_size=5, unique_by=lambda kv: kv[0]),
            st.booleans(),
            st.integers(0, 2**41),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_every_column_matches_the_per_message_path(msgs):
    data = b"".join(
        stored(body, text(items, trailing), queue_offset=i, stamp=stamp)
        for i, (body, items, trailing, stamp) in enumerate(msgs)
    )
    assert_same(data, len(msgs))


def test_the_columns_of_messages_a_producer_stamps():
    data = b"".join(
        message.encode_send(
            TOPIC,
            f"body {i}".encode(),
            3,
            f"ID{i}",
            tags="t" if i % 2 else "",
            keys=[f"k{i}", "x y"][: i % 3],
            producer_id="p",
            sequence=i,
            properties={"user": str(i)} if i % 4 else None,
            born_timestamp=1_700_000_000_000 + i,
        )[0]
        for i in range(40)
    )
    assert_same(data, 40)
    got = columnar(data, 40).to_pylist()
    assert got[5]["keys"] == ["k5", "x", "y"] and got[5]["tags"] == "t" and got[5]["msg_id"] == "ID5"
    assert got[6]["keys"] == [] and got[6]["tags"] is None and got[6]["properties"] == [("user", "6")]
    assert got[0]["properties"] == [] and got[0]["body"] == b"body 0"


@pytest.mark.parametrize(
    "props",
    [
        b"a\x011\x02a\x012\x02",  # a name twice: the per-message path keeps the last value at the first place
        b"KEYS\x01x\x02KEYS\x01y z\x02",
        b"a\x011\x02\x02\x02b\x012",  # empty items and no trailing separator: skipped
        b"",
        "clé\x01valeur ü 日本\x02".encode(),
    ],
)
def test_unusual_properties_give_the_per_message_rows(props):
    data = stored(b"x", b"u\x01v\x02") + stored(b"y", props, queue_offset=1)
    assert raw_batch("g0", TOPIC, data, 2).equals(reference(data, 2))


@pytest.mark.parametrize(
    "props", [b"a\x011\x02novalue\x02", b"a\x01\xff\xfe\x02"], ids=["no separator", "not UTF-8"]
)
def test_malformed_properties_fail_as_the_per_message_path_does(props):
    data = stored(b"x", b"u\x01v\x02") + stored(b"y", props, queue_offset=1)
    assert to_columns("g0", TOPIC, data, 2) is None
    with pytest.raises(DLedgerError, match="properties are malformed"):
        raw_batch("g0", TOPIC, data, 2)


def test_malformed_pulls_fail_naming_the_fault():
    one = stored(b"body", b"a\x011\x02")
    bad_magic = one[:4] + (0x1234).to_bytes(4, "big") + one[8:]
    cases = {
        "truncated": (one + one[:50], 2),
        "a count it does not hold": (one + one, 3),
        "bad magic": (bad_magic, 1),
        "a body past its message": (one[:84] + (10_000).to_bytes(4, "big") + one[88:], 1),
    }
    for name, (data, count) in cases.items():
        assert to_columns("g0", TOPIC, data, count) is None, name
        with pytest.raises(DLedgerError, match=r"malformed|announces"):
            raw_batch("g0", TOPIC, data, count)


def test_another_topic_takes_the_per_message_path():
    data = stored(b"x", b"") + stored(b"y", b"", topic="other", queue_offset=1)
    assert to_columns("g0", TOPIC, data, 2) is None
    rows = raw_batch("g0", TOPIC, data, 2)
    assert rows.column("topic").to_pylist() == [TOPIC, "other"]


def test_an_empty_pull_is_an_empty_batch():
    assert raw_batch("g0", TOPIC, b"", 0).num_rows == 0
