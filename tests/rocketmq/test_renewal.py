"""Server-side renewal of invisible time for the PushConsumer's ``auto_renew`` receives (``renewal``): the leader
changes the invisible time of a message its client still processes shortly before it runs out, the handle the
client holds then acknowledges the renewed delivery, and a client that went silent is not renewed. Driven through
the real servicer over the in-memory node double of ``tests/broker`` (the renewal's clock moved by the test), and
with the official PushConsumer on a real group: through a leader kill (the new leader takes the renewal over),
and (``-m slow``, 80 s) with the default 60 s invisible time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rocketmq import FilterExpression, PushConsumer, SimpleConsumer
from rocketmq.grpc_protocol import Code, service_pb2
from rocketmq.v5.consumer.push.message_listener import ConsumeResult, MessageListener

from broker_adapter.client import Producer as OurProducer
from broker_adapter.core import commands
from broker_adapter.core.clock import now_ms
from broker_adapter.core.invisibility import PopStates, Renewal
from broker_adapter.rocketmq import renewal
from broker_adapter.rocketmq.servicer import MessagingServicer
from dledger import group as grp
from tests.broker.test_broker import made, out, run, topic  # noqa: F401  (fixture and helpers)
from tests.rocketmq.conftest import client_config, create_topic, running
from tests.rocketmq.test_routes import Context


async def receive(s: MessagingServicer, auto_renew: bool) -> str:
    req = service_pb2.ReceiveMessageRequest(batch_size=1, auto_renew=auto_renew)
    req.group.name, req.message_queue.topic.name, req.message_queue.id = "G", "T", 0
    req.long_polling_timeout.FromMilliseconds(0)
    got = [r async for r in s.ReceiveMessage(req, Context())]
    (m,) = [r.message for r in got if r.HasField("message")]
    return m.system_properties.receipt_handle


async def ack(s: MessagingServicer, handle: str) -> service_pb2.AckMessageResponse:
    req = service_pb2.AckMessageRequest()
    req.group.name, req.topic.name = "G", "T"
    req.entries.add(message_id="m", receipt_handle=handle)
    return await s.AckMessage(req, Context())


@run
async def test_an_auto_renewed_message_stays_invisible_and_its_first_handle_acks_it(made):  # noqa: F811
    broker, _ = made
    await topic(broker, queues=1)
    await broker.send("T", [out(0, b"slow")])
    s = MessagingServicer(broker)
    try:
        handle = await receive(s, auto_renew=True)
        ((key, r),) = s.renewals.tracked.items()
        clock = [now_ms()]
        s.renewals._clock = lambda: clock[0]
        clock[0] = r.deadline_ms - renewal.LEAD_MS // 2  # the listener still runs, close to the deadline
        s.renewals.touch("c1")
        assert await s.renewals.renew_due() == 1
        inflight = broker.sm.pops.get(("G", "T", 0)).inflight[key[3]]
        assert inflight.epoch == r.epoch != r.handed_epoch  # a new delivery epoch ...
        resp = await ack(s, handle)  # ... which the handle the client holds acknowledges
        assert resp.status.code == Code.OK, resp.status.message
        assert not s.renewals.tracked and not broker.sm.pops.get(("G", "T", 0)).inflight
    finally:
        await s.close()


@run
async def test_a_silent_client_or_a_plain_receive_is_not_renewed(made):  # noqa: F811
    broker, _ = made
    await topic(broker, queues=1)
    await broker.send("T", [out(0, b"a"), out(0, b"b")])
    s = MessagingServicer(broker)
    try:
        await receive(s, auto_renew=False)
        assert not s.renewals.tracked  # a SimpleConsumer's receive: its invisible time is its own
        await receive(s, auto_renew=True)
        ((_, r),) = s.renewals.tracked.items()
        s.renewals._clock = lambda: r.deadline_ms - 1_000 + renewal.CLIENT_TTL_MS * 0  # due ...
        s.renewals.seen["c1"] = (
            r.deadline_ms - 1_000 - renewal.CLIENT_TTL_MS - 1
        )  # ... but the client is gone
        assert await s.renewals.renew_due() == 0
        assert not s.renewals.tracked
    finally:
        await s.close()


@run
async def test_a_new_leader_takes_over_the_renewal_and_the_first_handle_still_acks(made):  # noqa: F811
    """The renewal is replicated: the pop names its client, the pop state keeps it (through renewals and
    snapshots), and another servicer (a new leader's, with an empty table) adopts it from the state alone."""
    broker, _ = made
    await topic(broker, queues=1)
    await broker.send("T", [out(0, b"slow")])
    old = MessagingServicer(broker)
    new = MessagingServicer(broker)
    try:
        handle = await receive(old, auto_renew=True)
        ((key, first),) = old.renewals.tracked.items()
        f = broker.sm.pops.get(("G", "T", 0)).inflight[key[3]]
        assert f.renew == Renewal("c1", first.handed_epoch, f.renew.since_ms)
        clock = [now_ms()]
        old.renewals._clock = lambda: clock[0]
        clock[0] = first.deadline_ms - old.renewals.lead_ms // 2
        old.renewals.touch("c1")
        assert (
            await old.renewals.renew_due() == 1
        )  # renewed once by the old leader: a new epoch, same renewal
        f = broker.sm.pops.get(("G", "T", 0)).inflight[key[3]]
        assert f.epoch != first.handed_epoch and f.renew is not None and f.renew.handed == first.handed_epoch
        restored = PopStates.from_json(broker.sm.pops.to_json())  # what a snapshot keeps
        assert restored.get(("G", "T", 0)).inflight[key[3]] == f

        await old.close()  # the old leader is gone; the new one knows nothing in memory ...
        assert new.renewals.adopt() == 1  # ... and takes the delivery over from the replicated state
        (r,) = new.renewals.tracked.values()
        assert (r.handed_epoch, r.epoch, r.client) == (first.handed_epoch, f.epoch, "c1")
        new.renewals._clock = lambda: clock[0]
        clock[0] = r.deadline_ms - new.renewals.lead_ms // 2  # the client called the new leader meanwhile
        new.renewals.touch("c1")
        assert await new.renewals.renew_due() == 1
        resp = await ack(new, handle)  # the handle the client got from the old leader acknowledges it
        assert resp.status.code == Code.OK, resp.status.message
        assert not broker.sm.pops.get(("G", "T", 0)).inflight
    finally:
        await old.close()
        await new.close()


def test_the_renewal_in_commands_and_state_is_optional_and_ends_with_a_clients_own_change():
    pop = commands.Pop("G", "T", 0, 1_000, 6_000, (0, 1), renew="c1")
    assert commands.decode(commands.encode(pop)) == pop
    plain = commands.Pop("G", "T", 0, 1_000, 6_000, (0, 1))
    assert b"renew" not in commands.encode(plain)  # a command from before renewals reads the same
    assert commands.decode(commands.encode(plain)).renew == ""
    st = PopStates()
    (d0, _) = st.pop(pop, 0, 2).deliveries
    renewed = st.change_invisible(
        commands.ChangeInvisible("G", "T", 0, 0, d0.epoch, 2_000, 6_000, renew=True)
    )
    assert st.get(("G", "T", 0)).inflight[0].renew == Renewal("c1", d0.epoch, 1_000)
    change = commands.ChangeInvisible("G", "T", 0, 0, renewed.epoch, 3_000, 9_000)
    assert commands.decode(commands.encode(change)) == change
    st.change_invisible(change)  # the client decides now: no longer renewed, nor adopted by a new leader
    assert st.get(("G", "T", 0)).inflight[0].renew is None and st.get(("G", "T", 0)).inflight[1].renew
    rows = st.to_json()
    assert PopStates.from_json(rows).queues == st.queues
    old_reader_row = rows[0][6][1][:5]  # a row as a reader from before renewals keeps it: the message group
    assert old_reader_row[4] == ""


class _Slow(MessageListener):
    """A listener that takes longer than one invisible-time slice on its first message."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.calls: list[bytes] = []
        self.finished = threading.Event()

    def consume(self, message) -> ConsumeResult:
        with self.lock:
            self.calls.append(bytes(message.body))
        time.sleep(self.hold_s)
        self.finished.set()
        return ConsumeResult.SUCCESS


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_official_push_consumer_listener_outlasting_the_invisible_time_gets_its_message_once(broker_group):
    """A real group and the official PushConsumer: its listener holds the message 15 s longer than one slice
    (60 s); the leader renews it, so it is not delivered again meanwhile, and the listener's ack sticks."""
    g = broker_group
    create_topic(g, "rmq-renew", 1)
    with OurProducer(g.addresses) as p:
        p.send("rmq-renew", b"slow-one")
    listener = _Slow(renewal.SLICE_MS / 1000 + 15)
    consumer = PushConsumer(client_config(g), "rmq-renew-g", listener, {"rmq-renew": FilterExpression()})
    with running(consumer):
        assert listener.finished.wait(renewal.SLICE_MS / 1000 + 60), "the listener never finished"
        time.sleep(3)  # room for a wrong redelivery to show up, and for the ack
    assert listener.calls == [b"slow-one"], f"delivered {len(listener.calls)} times"
    with running(
        SimpleConsumer(client_config(g), "rmq-renew-g", {"rmq-renew": FilterExpression()}, await_duration=1)
    ) as c:
        assert c.receive(8, 20) == [], "the acknowledged message came back"


SHORT_SLICE_MS = 6_000  # [broker] auto_renew_invisible_ms of the failover test's group: renewals every 5 s


@pytest.fixture
def short_slice_group(tmp_path):
    """A broker group whose auto-renewed receives are invisible for ``SHORT_SLICE_MS`` (the default is 60 s)."""
    g = grp.create(tmp_path / "g", 3, None, state_machine="broker")
    for n in g.nodes:
        with open(n.config, "a") as f:
            f.write(f"\n[broker]\nauto_renew_invisible_ms = {SHORT_SLICE_MS}\n")
        grp.start_node(n)
    try:
        grp.wait_for_all(g, 30)
        yield g
    finally:
        grp.stop_group(g)


@pytest.mark.integration
@pytest.mark.long  # a whole leader-kill run (about 30 s): make test-long, run by CI
@pytest.mark.timeout(300)
def test_a_leader_kill_while_the_push_consumers_listener_runs_does_not_redeliver_its_message(
    short_slice_group,
):
    """The official PushConsumer's listener holds a message for more than three invisible times; the leader is
    killed while it runs. The new leader takes the renewal over, so the message is delivered once and the
    listener's ack (with the handle the old leader gave) sticks. Without the takeover it comes back within one
    invisible time of the kill, to the same consumer's other thread."""
    g = short_slice_group
    create_topic(g, "renew-failover", 1)
    with OurProducer(g.addresses) as p:
        p.send("renew-failover", b"slow-one")
    listener = _Slow(3.5 * SHORT_SLICE_MS / 1000)
    consumer = PushConsumer(
        client_config(g), "renew-failover-g", listener, {"renew-failover": FilterExpression()}
    )
    with running(consumer):
        deadline = time.monotonic() + 60
        while not listener.calls:
            assert time.monotonic() < deadline, "the message was never delivered"
            time.sleep(0.05)
        killed = grp.wait_for_leader(g)
        grp.kill_node(g.node(killed.id))
        new_leader = grp.wait_for_leader(g, 30, exclude=killed.id)
        assert listener.finished.wait(listener.hold_s + 60), "the listener never finished"
        time.sleep(SHORT_SLICE_MS / 1000 + 2)  # room for a wrong redelivery to show up, and for the ack
    assert listener.calls == [b"slow-one"], f"delivered {len(listener.calls)} times"
    log = (Path(g.node(new_leader.id).data_dir) / "node.log").read_text()
    assert "took over the renewal of 1 auto-renewed deliveries" in log
    with running(
        SimpleConsumer(
            client_config(g), "renew-failover-g", {"renew-failover": FilterExpression()}, await_duration=1
        )
    ) as c:
        assert c.receive(8, 20) == [], "the acknowledged message came back"
