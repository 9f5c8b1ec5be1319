"""The body digest of a received message, checked as every official RocketMQ 5 client checks it (issue 25).

Each client recomputes the digest and flags a mismatch as corrupted (the Node.js PushConsumer then discards the
message). The Python and Node.js clients are run for real on what ``convert.incoming`` makes; the Java, Go and
C# checks are written out below as their sources compute them (rocketmq-clients: Java ``Utilities.md5CheckSum``,
Go ``message.go``, C# ``Utilities.ComputeMd5Hash``). Their CRC32 checks disagree with one another, which is why
the broker sends MD5, as RocketMQ's proxy does (docs/rocketmq.md, Body digest).
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import DigestType
from rocketmq.v5.model.message import Message as PythonClientMessage

from broker_adapter.core import message
from broker_adapter.rocketmq import convert
from tests.rocketmq import node_client

# A body whose CRC32 has a leading zero hex digit (0x09001834): Java, Go and C# print it with 7 digits.
LEADING_ZERO_CRC = b"message-51"


def _hex_digits(data: bytes) -> str:
    """Java's ``encodeHex(data, DIGITS_UPPER)``, Go's ``strings.ToUpper(hex.EncodeToString)``, C#'s
    ``Convert.ToHexString``: two upper-case digits per byte."""
    digits = "0123456789ABCDEF"
    return "".join(digits[(b & 0xF0) >> 4] + digits[b & 0x0F] for b in data)


def md5_as_java_go_csharp(body: bytes) -> str:
    return _hex_digits(hashlib.md5(body).digest())


def crc32_as_java_go_csharp(body: bytes) -> str:
    return format(zlib.crc32(body), "X")  # Long.toHexString(...).toUpperCase(): no padding


def crc32_as_nodejs(body: bytes) -> str:
    return str(zlib.crc32(body))  # `${crc32(bytes)}`: a decimal string


def stored(body: bytes, group: str | None = None, props: dict[str, str] | None = None) -> message.Message:
    properties = {message.PROPERTY_UNIQ_KEY: "01AABBCCDDEEFF00010000000100000001", **(props or {})}
    if group:
        properties[message.PROPERTY_MESSAGE_GROUP] = group
    return message.Message(topic="orders", body=body, queue_id=0, queue_offset=3, properties=properties)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=4096))
@example(LEADING_ZERO_CRC)
def test_digest_is_what_java_go_and_csharp_expect(body):
    digest = convert.incoming(stored(body)).system_properties.body_digest
    assert digest.type == DigestType.MD5
    assert digest.checksum == md5_as_java_go_csharp(body)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=4096))
@example(LEADING_ZERO_CRC)
def test_the_python_client_takes_every_body_as_intact(body):
    m = PythonClientMessage().fromProtobuf(convert.incoming(stored(body)))
    assert not m.corrupted
    assert m.body == body


def test_no_crc32_text_satisfies_every_client():
    """Why MD5: for a CRC32 with a leading zero digit the clients want three different strings."""
    body = LEADING_ZERO_CRC
    assert zlib.crc32(body) < 0x10000000
    wanted = {crc32_as_java_go_csharp(body), crc32_as_nodejs(body), format(zlib.crc32(body), "08X")}
    assert len(wanted) == 3


@pytest.mark.skipif(node_client.node() is None, reason="node (Node.js) is not installed on this machine")
def test_the_nodejs_client_takes_every_body_as_intact_and_sees_the_group(tmp_path):
    bodies = [
        LEADING_ZERO_CRC,
        b"x",
        "rocketmq-client-nodejs world \U0001f604".encode(),
        bytes(range(256)) * 16,
    ]
    bodies += [f"body-{i}".encode() for i in range(64)]
    msgs = [stored(b, group="orders-1" if i % 2 else None, props={"k": "v"}) for i, b in enumerate(bodies)]
    received = [convert.incoming(m) for m in msgs]
    tampered = convert.incoming(stored(b"tampered"))  # the check is live: a wrong digest is flagged
    tampered.system_properties.body_digest.checksum = md5_as_java_go_csharp(b"other")
    lines = "".join(base64.b64encode(m.SerializeToString()).decode() + "\n" for m in [*received, tampered])
    r = subprocess.run(
        [node_client.node() or "node", str(node_client.SCRIPT.with_name("message_view.js"))],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NODE_PATH": str(node_client.install()), "HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    *views, flagged = json.loads(r.stdout.strip().splitlines()[-1])
    assert flagged["corrupted"] is True
    assert [v["corrupted"] for v in views] == [False] * len(bodies)
    for i, v in enumerate(views):
        group = "orders-1" if i % 2 else ""
        assert v["messageGroup"] == group
        expected = {"k": "v", message.PROPERTY_MESSAGE_GROUP: group} if group else {"k": "v"}
        assert v["properties"] == expected
