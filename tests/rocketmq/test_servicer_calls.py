"""The servicer's per-call paths as the official clients drive them (docs/rocketmq.md, "Per-call CPU"), through
the real servicer over the in-memory node double of ``tests/broker``:

- concurrent one-entry AckMessage calls (the official SimpleConsumer acks one message per call) go to the log
  as one proposal, not one each (broker-level group commit);
- the one-entry ack path answers as the general one does: OK, "already acknowledged", a foreign or mangled
  receipt handle refused in the overall status and in the entry;
- an ack whose leader lost leadership under it (outcome unknown) is served again on the next leader, also
  when a follower forwarded it;
- a follower holds ``node.serving()`` while a client's call waits on it for the leader (its ready loop then
  syncs off the event loop, docs/decisions/0029);
- a received message, built inside its response, is the message ``convert.incoming`` makes, and its receipt
  handle (packed by ``ReceiptHandle.encoder``) the one ``ReceiptHandle.encode`` makes.
"""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from rocketmq.grpc_protocol import ClientType, Code, service_pb2

from broker_adapter.rocketmq import convert
from broker_adapter.rocketmq.receipt import ReceiptHandle
from broker_adapter.rocketmq.servicer import MessagingServicer
from dledger.errors import OutcomeUnknownError
from tests.broker.test_broker import made, out, run, topic  # noqa: F401  (fixture and helpers)
from tests.rocketmq.test_routes import Context


async def receive(s: MessagingServicer, n: int) -> list[service_pb2.ReceiveMessageResponse]:
    req = service_pb2.ReceiveMessageRequest(batch_size=n)
    req.group.name, req.message_queue.topic.name, req.message_queue.id = "G", "T", 0
    req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromMilliseconds(0)
    return [r async for r in s.ReceiveMessage(req, Context())]


def ack_request(*handles: str, group: str = "G") -> service_pb2.AckMessageRequest:
    req = service_pb2.AckMessageRequest()
    req.group.name, req.topic.name = group, "T"
    for i, h in enumerate(handles):
        req.entries.add(message_id=f"m{i}", receipt_handle=h)
    return req


@run
async def test_concurrent_one_entry_acks_share_one_proposal(made):  # noqa: F811
    broker, node = made
    await topic(broker, queues=1)
    await broker.send("T", [out(0, f"m{i}".encode()) for i in range(32)])
    s = MessagingServicer(broker)
    try:
        got = await receive(s, 32)
        handles = [r.message.system_properties.receipt_handle for r in got if r.HasField("message")]
        assert len(handles) == 32
        node.proposals.clear()
        node.gate = asyncio.Event()  # the first proposal waits in flight; the others gather meanwhile
        calls = [asyncio.ensure_future(s.AckMessage(ack_request(h), Context())) for h in handles]
        for _ in range(5):
            await asyncio.sleep(0)
        node.gate.set()
        answers = await asyncio.gather(*calls)
        assert [a.status.code for a in answers] == [Code.OK] * 32
        assert [a.entries[0].receipt_handle for a in answers] == handles
        # every ack is one log entry, but they went in together: the ones that arrived in the same loop turn,
        # and those that came while a proposal was in flight, in the next one
        assert sum(n for _, n in node.proposals) == 32, node.proposals
        assert len(node.proposals) <= 2, node.proposals
        assert not broker.sm.pops.get(("G", "T", 0)).inflight
    finally:
        await s.close()


@run
async def test_a_one_entry_ack_answers_as_a_batch_entry_would(made):  # noqa: F811
    broker, _ = made
    await topic(broker, queues=1)
    await broker.send("T", [out(0, b"a"), out(0, b"b")])
    s = MessagingServicer(broker)
    try:
        h1, h2 = [
            r.message.system_properties.receipt_handle for r in await receive(s, 2) if r.HasField("message")
        ]
        first = await s.AckMessage(ack_request(h1), Context())
        assert first.status.code == Code.OK and first.entries[0].status.code == Code.OK
        assert (first.entries[0].message_id, first.entries[0].receipt_handle) == ("m0", h1)
        again = await s.AckMessage(ack_request(h1), Context())
        assert again.status.code == Code.OK and again.status.message == "already acknowledged"
        assert again.entries[0].status == again.status
        for bad in (h2[:-3] + "AAA", "v1nothing", "x"):
            r = await s.AckMessage(ack_request(bad), Context())
            assert r.status.code == Code.INVALID_RECEIPT_HANDLE, r
            assert r.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE
        other = ReceiptHandle.decode(h2)
        foreign = ReceiptHandle(
            "H", "T", other.queue_id, other.offset, other.epoch, other.deadline_ms
        ).encode()
        r = await s.AckMessage(ack_request(foreign), Context())
        assert r.status.code == Code.INVALID_RECEIPT_HANDLE and "group 'H'" in r.status.message
        # two entries, one good and one already acknowledged: the general path, both OK
        both = await s.AckMessage(ack_request(h2, h1), Context())
        assert [e.status.code for e in both.entries] == [Code.OK, Code.OK]
        assert not broker.sm.pops.get(("G", "T", 0)).inflight
    finally:
        await s.close()


@run
async def test_a_received_message_is_what_incoming_makes(made):  # noqa: F811
    broker, _ = made
    await topic(broker, queues=1)
    await broker.send(
        "T",
        [out(0, b"x" * 1000, tags="t1", keys=["k1", "k2"], properties={"p": "v"}), out(0, b"y", tags="t2")],
    )
    s = MessagingServicer(broker)
    try:
        got = [r.message for r in await receive(s, 2) if r.HasField("message")]
        assert [m.body for m in got] == [b"x" * 1000, b"y"]
        for m in got:
            sp = m.system_properties
            h = ReceiptHandle.decode(sp.receipt_handle)
            assert (h.group, h.topic, h.queue_id, h.offset) == ("G", "T", 0, sp.queue_offset)
            stored = broker.read("T", 0, sp.queue_offset)
            want = convert.incoming(
                stored, receipt_handle=h.encode(), attempt=sp.delivery_attempt, invisible_ms=30_000
            )
            assert m == want
    finally:
        await s.close()


@given(
    group=st.text(min_size=1, max_size=60),
    topic_=st.text(min_size=1, max_size=60),
    queue_id=st.integers(0, 2**31 - 1),
    deadline=st.integers(0, 2**62),
    deliveries=st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), min_size=1, max_size=5),
)
def test_a_pops_handle_encoder_makes_the_handles_encode_makes(group, topic_, queue_id, deadline, deliveries):
    if len(group.encode()) > 255 or len(topic_.encode()) > 255:
        return
    encode = ReceiptHandle(group, topic_, queue_id, 0, 0, deadline).encoder()
    for offset, epoch in deliveries:
        h = ReceiptHandle(group, topic_, queue_id, offset, epoch, deadline)
        assert encode(offset, epoch) == h.encode()
        assert ReceiptHandle.decode(encode(offset, epoch)) == h


@run
async def test_an_ack_whose_leader_lost_leadership_is_served_again(made):  # noqa: F811
    """Leadership lost under an ack, its outcome unknown: the leader serves it again once a leader is known,
    whether the first attempt was committed (then "already acknowledged") or not (then it acknowledges)."""
    broker, node = made
    await topic(broker, queues=1)
    await broker.send("T", [out(0, b"a"), out(0, b"b")])
    s = MessagingServicer(broker)
    real_submit = node.submit
    try:
        h1, h2 = [
            r.message.system_properties.receipt_handle for r in await receive(s, 2) if r.HasField("message")
        ]
        for handle, committed in ((h1, True), (h2, False)):
            failed = []

            async def submit(bodies, prepare=None, committed=committed, failed=failed):
                if not failed:
                    failed.append(1)
                    if committed:
                        await real_submit(bodies, prepare)  # it commits, but the leader cannot tell
                    raise OutcomeUnknownError("lost leadership: the outcome of the append is unknown")
                return await real_submit(bodies, prepare)

            node.submit = submit
            r = await s.AckMessage(ack_request(handle), Context())
            assert failed and r.status.code == Code.OK, r
            assert (r.status.message == "already acknowledged") == committed
        assert not broker.sm.pops.get(("G", "T", 0)).inflight  # both acknowledged: nothing comes back
        # A call that is not retried answers the error (a send's outcome stays unknown to its client).
        node.submit = real_submit

        async def append(bodies, prepare=None):
            raise OutcomeUnknownError("lost leadership: the outcome of the append is unknown")

        node.append = append
        req = service_pb2.SendMessageRequest()
        m = req.messages.add(body=b"x")
        m.topic.name = "T"
        m.system_properties.message_id = "01ABC"
        m.system_properties.message_type = 1
        m.system_properties.body_encoding = 1
        sent = await s.SendMessage(req, Context())
        assert sent.status.code == Code.PROXY_TIMEOUT, sent
    finally:
        node.submit = real_submit
        await s.close()


@run
async def test_a_follower_forwards_an_ack_again_when_the_leader_lost_leadership_under_it(made):  # noqa: F811
    """On a follower, a leader's answer that it lost leadership under an ack (HA_NOT_AVAILABLE or PROXY_TIMEOUT)
    sends the ack to the next leader; any other call's answer is relayed as it is."""
    broker, node = made
    s = MessagingServicer(broker)
    node.leader_id = "n1"  # this node follows
    node.config.security = None  # a plain group: forwarded with the client id only
    answers = {
        "AckMessage": [
            service_pb2.AckMessageResponse(status={"code": Code.PROXY_TIMEOUT, "message": "lost it"}),
            service_pb2.AckMessageResponse(status={"code": Code.OK, "message": "OK"}),
        ],
        "SendMessage": [
            service_pb2.SendMessageResponse(status={"code": Code.HA_NOT_AVAILABLE, "message": "lost it"}),
        ],
    }
    calls: list[str] = []

    def call(leader: str, method: str):
        async def send(request, timeout, metadata):
            calls.append(method)
            return answers[method].pop(0).SerializeToString()

        return send

    s._forward._call = call
    try:
        got = await s.AckMessage(ack_request("v1whatever"), Context())
        assert service_pb2.AckMessageResponse.FromString(got).status.code == Code.OK
        assert calls == ["AckMessage", "AckMessage"]
        req = service_pb2.SendMessageRequest()
        req.messages.add(body=b"x").topic.name = "T"
        got = await s.SendMessage(req, Context())
        assert service_pb2.SendMessageResponse.FromString(got).status.code == Code.HA_NOT_AVAILABLE
        assert calls == ["AckMessage", "AckMessage", "SendMessage"]
    finally:
        node.leader_id = node.id
        await s.close()


@run
async def test_a_follower_serves_while_a_forwarded_call_waits_on_the_leader(made):  # noqa: F811
    broker, node = made
    s = MessagingServicer(broker)
    node.leader_id = "n1"  # this node follows
    node.config.security = None
    answered = asyncio.Event()
    seen: list[int] = []

    def call(leader: str, method: str):
        async def send(request, timeout, metadata):
            seen.append(node.calls_waiting)
            await answered.wait()
            return service_pb2.AckMessageResponse(
                status={"code": Code.OK, "message": "OK"}
            ).SerializeToString()

        return send

    s._forward._call = call
    try:
        pending = asyncio.ensure_future(s.AckMessage(ack_request("v1whatever"), Context()))
        while not seen:
            await asyncio.sleep(0.001)
        assert seen == [1] and node.calls_waiting == 1
        answered.set()
        got = await pending
        assert service_pb2.AckMessageResponse.FromString(got).status.code == Code.OK
        assert node.calls_waiting == 0
        node.leader_id = node.id  # on the leader nothing is held
        await topic(broker, queues=1)
        await s.AckMessage(ack_request("v1whatever"), Context())
        assert seen == [1] and node.calls_waiting == 0
    finally:
        node.leader_id = node.id
        await s.close()


@run
async def test_lite_consumers_are_refused_at_their_settings(made):  # noqa: F811
    """A LitePushConsumer / LiteSimpleConsumer learns at its settings exchange that lite topics are not
    supported (docs/rocketmq.md, Not supported); a simple consumer on the same stream is answered."""
    broker, _ = made
    await topic(broker, queues=1)
    s = MessagingServicer(broker)

    def settings(client_type: int) -> service_pb2.TelemetryCommand:
        cmd = service_pb2.TelemetryCommand()
        cmd.settings.client_type = client_type
        cmd.settings.subscription.group.name = "G"
        cmd.settings.subscription.subscriptions.add().topic.name = "T"
        return cmd

    async def commands():
        for t in (ClientType.LITE_PUSH_CONSUMER, ClientType.LITE_SIMPLE_CONSUMER, ClientType.SIMPLE_CONSUMER):
            yield settings(t)

    try:
        answers = [a async for a in s.Telemetry(commands(), Context())]
        assert [a.status.code for a in answers] == [Code.UNSUPPORTED, Code.UNSUPPORTED, Code.OK]
        assert all("lite topics" in a.status.message for a in answers[:2])
        assert answers[2].settings.subscription.group.name == "G"
    finally:
        await s.close()
