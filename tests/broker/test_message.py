"""The RocketMQ message codec: round trips, in-place offset patching, and clear errors on bad bytes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.core import message as m

_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20
)


def test_java_string_hash_matches_java():
    # Values from java.lang.String.hashCode.
    assert m.java_string_hash("") == 0
    assert m.java_string_hash("abc") == 96354
    assert m.java_string_hash("TagA") == 2598919
    assert m.java_string_hash("polygenelubricants") == -(1 << 31)  # the classic Integer.MIN_VALUE case


def test_fixed_overhead_is_91_bytes():
    assert m.OVERHEAD == 91
    assert len(m.encode(m.Message(topic="t", body=b""))) == 92


@given(
    topic=st.text(alphabet="abcXYZ-_%|0123456789", min_size=1, max_size=127),
    body=st.binary(max_size=2048),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**62),
    physical_offset=st.integers(0, 2**62),
    props=st.dictionaries(_text.filter(bool), _text, max_size=5),
)
def test_round_trip(topic, body, queue_id, queue_offset, physical_offset, props):
    msg = m.Message(
        topic=topic,
        body=body,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        born_host=("10.1.2.3", 5555),
        properties=props,
    )
    raw = m.encode(msg)
    assert len(raw) == m.encoded_size(topic, len(body), props)
    assert m.decode(raw) == msg


def test_patch_placement_in_place():
    raw = bytearray(m.encode(m.Message(topic="orders", body=b"x" * 10, properties={m.PROPERTY_TAGS: "a"})))
    m.patch_placement(raw, 7, 123456)
    got = m.decode(raw)
    assert (got.queue_offset, got.physical_offset, got.tags, got.store_timestamp) == (7, 123456, "a", 0)
    m.patch_placement(raw, 8, 123457, 1_700_000_000_123)
    got = m.decode(raw)
    assert (got.queue_offset, got.physical_offset, got.store_timestamp) == (8, 123457, 1_700_000_000_123)
    assert m.peek_store_timestamp(raw) == 1_700_000_000_123


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda b: b.__setitem__(slice(4, 8), b"\0\0\0\0"), "MAGICCODE"),
        (lambda b: b.__setitem__(slice(0, 4), (len(b) + 1).to_bytes(4, "big")), "TOTALSIZE"),
        (lambda b: b.__setitem__(90, b[90] ^ 0xFF), "BODYCRC"),
    ],
)
def test_corruption_is_named(mutate, fragment):
    raw = bytearray(m.encode(m.Message(topic="t", body=b"hello world")))
    mutate(raw)
    with pytest.raises(m.MessageFormatError, match=fragment):
        m.decode(raw)


def test_bad_topic_and_property_rejected():
    with pytest.raises(m.MessageFormatError, match="topic"):
        m.encode(m.Message(topic="", body=b""))
    with pytest.raises(m.MessageFormatError, match="topic"):
        m.encode(m.Message(topic="x" * 128, body=b""))
    with pytest.raises(m.MessageFormatError, match="separator"):
        m.encode(m.Message(topic="t", body=b"", properties={"a\x01": "b"}))


def test_a_broker_copy_is_identified_by_its_origin():
    """The audit's identity of a copy the broker made (docs/rocketmq.md, Delivery): the client's key plus the
    origin it ends, so an original and its copy are not one message stored twice."""
    from broker_adapter.core import formats

    original = m.encode(m.Message(topic="%SYS%TIMER", body=b"x", properties={m.PROPERTY_UNIQ_KEY: "u1"}))
    copy = m.encode(
        m.Message(
            topic="t",
            body=b"x",
            properties={m.PROPERTY_UNIQ_KEY: "u1", m.PROPERTY_ORIGIN: "timer/3"},
        )
    )
    assert formats.message_fields(original).msg_id == "u1"
    assert formats.message_fields(copy).msg_id == "u1@timer/3"
    assert m.decode(copy).msg_id == "u1"  # consumers see the client's id


_names = st.sampled_from(
    [m.PROPERTY_TAGS, m.PROPERTY_ORIGIN, "PRODUCER_ID", "PRODUCER_SEQ", "XPRODUCER_ID", "TAGSX", "UNIQ_KEY"]
)


# any message: the properties a route reads among others, with values a sequence parser must not take
_MESSAGES = dict(
    topic=st.text(alphabet="abcXYZ-_%", min_size=1, max_size=20),
    body=st.binary(max_size=64),
    queue_id=st.integers(0, 64),
    props=st.dictionaries(
        st.one_of(_names, _text.filter(bool)),
        st.one_of(_text, st.sampled_from(["7", "²", "", "12a"])),
        max_size=6,
    ),
)


@given(**_MESSAGES)
def test_route_of_is_what_peek_route_reads(topic, body, queue_id, props):
    # The send path hands the allocator the route it knows instead of parsing the message it just encoded:
    # the two must agree on every field the allocator and the dispatcher use, for any properties.
    raw = m.encode_fields(topic, body, props, queue_id=queue_id)
    peeked = m.peek_route(raw)
    assert m.route_of(topic, queue_id, len(raw), props) == peeked
    assert peeked.producer == m.peek_producer(raw)
    assert peeked.origin == m.peek_property(raw, m.PROPERTY_ORIGIN)
    assert peeked.tags == m.decode(raw).tags


@given(**_MESSAGES)
def test_check_stored_reads_what_peek_route_reads(topic, body, queue_id, props):
    # The leader checks a session's message and keeps the route it read; the dispatcher reads the stored bytes
    # with peek_route: both must agree on every field, for any properties.
    raw = m.encode_fields(topic, body, props, queue_id=queue_id)
    assert m.check_stored(raw) == m.peek_route(raw)


def test_encode_fields_is_encode():
    msg = m.Message(
        topic="t", body=b"abc", queue_id=3, born_timestamp=5, store_timestamp=6, properties={"a": "b"}
    )
    assert m.encode_fields(
        "t", b"abc", {"a": "b"}, queue_id=3, born_timestamp=5, store_timestamp=6
    ) == m.encode(msg)
