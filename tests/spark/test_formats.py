"""``broker_adapter.core.formats`` (what the audit reads the broker's data with) agrees with the broker's writers:
``message``, ``commands`` and ``consumequeue``. The audit imports formats alone, so a change of layout on one
side and not the other must fail here."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.core import commands, consumequeue, formats, message

_TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20)


def test_constants_agree_with_the_writers():
    assert formats.MAGIC_CODE == message.MAGIC_CODE
    assert formats.FIXED_SIZE == message.FIXED_SIZE
    assert formats.OVERHEAD == message.OVERHEAD
    assert (formats.NAME_VALUE_SEPARATOR, formats.PROPERTY_SEPARATOR) == (
        message.NAME_VALUE_SEPARATOR,
        message.PROPERTY_SEPARATOR,
    )
    for name in ("PROPERTY_TAGS", "PROPERTY_UNIQ_KEY", "PROPERTY_PRODUCER_ID", "PROPERTY_SEQUENCE"):
        assert getattr(formats, name) == getattr(message, name), name
    assert formats.COMMAND_MAGIC == commands.COMMAND_MAGIC
    assert formats.CQ_UNIT.format == consumequeue.UNIT.format
    assert formats.UNIT_SIZE == consumequeue.UNIT_SIZE == 20


@given(
    topic=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(
        lambda t: len(t.encode()) <= message.MAX_TOPIC_BYTES
    ),
    body=st.binary(max_size=64),
    queue_id=st.integers(0, 1000),
    queue_offset=st.integers(0, 2**40),
    physical_offset=st.integers(0, 2**40),
    tags=st.none() | _TEXT.filter(bool),
    props=st.dictionaries(_TEXT.filter(bool), _TEXT, max_size=3),
)
def test_routing_fields_agree_with_the_encoder(
    topic, body, queue_id, queue_offset, physical_offset, tags, props
):
    if tags is not None:
        props = {**props, message.PROPERTY_TAGS: tags}
    raw = message.encode(
        message.Message(
            topic,
            body,
            queue_id=queue_id,
            queue_offset=queue_offset,
            physical_offset=physical_offset,
            properties=props,
        )
    )
    m = formats.message_fields(raw)
    d = message.decode(raw)
    assert (m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.size) == (
        d.topic,
        d.queue_id,
        d.queue_offset,
        d.physical_offset,
        len(raw),
    )
    assert m.tags_code == message.tags_code(d.properties.get(message.PROPERTY_TAGS))
    assert formats.decode_properties(message.encode_properties(props)) == message.decode_properties(
        message.encode_properties(props)
    )


def test_msg_id_is_the_unique_key_or_the_producer_sequence():
    keyed = message.encode(message.Message("t", b"x", properties={message.PROPERTY_UNIQ_KEY: "u1"}))
    assert formats.message_fields(keyed).msg_id == "u1"
    seq = message.encode(
        message.Message(
            "t", b"x", properties={message.PROPERTY_PRODUCER_ID: "p", message.PROPERTY_SEQUENCE: "7"}
        )
    )
    assert formats.message_fields(seq).msg_id == "p:7"


def test_a_damaged_message_names_the_field():
    raw = message.encode(message.Message("t", b"body"))
    with pytest.raises(formats.MessageFormatError, match="TOTALSIZE"):
        formats.message_fields(raw + b"x")
    with pytest.raises(formats.MessageFormatError, match="shorter"):
        formats.message_fields(raw[:10])
