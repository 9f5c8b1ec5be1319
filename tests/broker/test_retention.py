"""Retention (``broker_adapter.core.retention``): the first kept log index by bytes, by age and by the per-node disk
valve, checked against a linear scan over generated logs (messages and commands interleaved); the point is a
function of the log alone (two nodes with the same log agree); ConsumeQueue files below what the log holds are
deleted; a pull that fell behind the log's start goes on from the first held offset."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_adapter.core import commands, message
from broker_adapter.core.consumequeue import ConsumeQueue
from broker_adapter.core.retention import Retention, RetentionPolicy, first_held, first_kept, store_timestamp
from broker_adapter.core.statemachine import BrokerStateMachine
from statemachine.api import CommittedEntry
from storage import codec
from storage.codec import HEADER_SIZE
from storage.memory import MemoryLogStore
from tests.broker.test_broker import made, out, run, topic  # noqa: F401  (fixture and helpers)

HOUR_MS = 3_600_000


def build(items: list[tuple[str, int]], segment_size: int = 1 << 20) -> MemoryLogStore:
    """A log of ("m", store time ms) messages and ("c", 0) commands, in order."""
    log = MemoryLogStore(segment_size)
    for kind, ts in items:
        if kind == "m":
            body = message.encode(message.Message(topic="t", body=b"x" * 100, store_timestamp=ts))
        else:
            body = commands.encode(commands.CommitOffset("g", "t", 0, 0))
        tail = log.tail()
        pos = codec.place(tail.end_pos, HEADER_SIZE + len(body), log.segment_size)
        log.append(codec.encode(tail.last_index + 1, 1, pos, body, tail.chain_crc))
    return log


def by_scan(log: MemoryLogStore, hi: int, policy: RetentionPolicy, disk=None) -> int:
    """The reference: the same rules, by looking at every entry."""
    lo = log.first_index
    entries = [log.entry(i) for i in range(lo, hi + 1)]
    cut = lo
    end = entries[-1].pos + entries[-1].header.size
    if policy.max_bytes:
        cut = max(cut, next((e.index for e in entries if e.pos >= end - policy.max_bytes), hi + 1))
    if policy.hours:
        times = [(e.index, store_timestamp(e.body)) for e in entries]
        newest = next((ts for _, ts in reversed(times) if ts is not None), None)
        if newest is not None:
            floor = newest - int(policy.hours * HOUR_MS)
            # the first message stored at or after the floor; commands before it go with the older messages
            first_new = next((i for i, ts in times if ts is not None and ts >= floor), None)
            if first_new is not None:
                prev_msg = max((i for i, ts in times if ts is not None and i < first_new), default=None)
                cut = max(cut, lo if prev_msg is None else prev_msg + 1)
    if disk and policy.disk_max_used_percent:
        used, total = disk
        excess = used - int(total * policy.disk_max_used_percent / 100)
        if excess > 0:
            start = entries[0].pos
            cut = max(cut, next((e.index for e in entries if e.pos >= start + excess), hi + 1))
    return min(cut, hi)


def test_by_bytes_keeps_the_newest_bytes():
    log = build([("m", i) for i in range(100)])
    size = log.entry(0).header.size
    point = first_kept(log, 99, RetentionPolicy(max_bytes=10 * size))
    assert point == 90  # exactly the newest 10 entries fit
    assert first_kept(log, 99, RetentionPolicy(max_bytes=10 * size - 1)) == 91
    assert first_kept(log, 99, RetentionPolicy(max_bytes=1)) == 99  # the newest applied entry always stays
    assert first_kept(log, 49, RetentionPolicy(max_bytes=10 * size)) == 40  # only what was applied counts


def test_by_age_against_the_newest_store_time_not_a_clock():
    log = build([("m", i * 60_000) for i in range(120)])  # one a minute for two hours
    assert first_kept(log, 119, RetentionPolicy(hours=1)) == 59  # stored within the hour before the newest
    assert first_kept(log, 119, RetentionPolicy(hours=3)) == 0
    assert first_kept(log, 119, RetentionPolicy()) == 0  # no policy: everything


def test_disk_valve_frees_the_excess():
    log = build([("m", i) for i in range(100)])
    size = log.entry(0).header.size
    disk = (80 * 1000 + 20 * size, 100 * 1000)  # 20 entries' bytes over 80 %
    assert first_kept(log, 99, RetentionPolicy(disk_max_used_percent=80), disk) == 20
    assert first_kept(log, 99, RetentionPolicy(disk_max_used_percent=90), disk) == 0


entries_st = st.lists(
    st.one_of(st.tuples(st.just("m"), st.integers(0, 2_000)), st.tuples(st.just("c"), st.just(0))),
    min_size=1,
    max_size=120,
).map(
    # store times never go back: each message's time is the running maximum (leaders stamp increasing times)
    lambda xs: [(k, sum(t for _, t in xs[: i + 1])) for i, (k, _) in enumerate(xs)]
)


@settings(max_examples=150, deadline=None)
@given(
    entries_st,
    st.integers(0, 40_000),
    st.sampled_from([0, 0.0001, 0.001, 0.01]),
    st.integers(0, 100),
    st.data(),
)
def test_first_kept_agrees_with_a_scan_and_with_another_node(items, max_bytes, hours, percent, data):
    log = build(items)
    hi = data.draw(st.integers(0, log.last_index))
    total = 1_000_000
    disk = (data.draw(st.integers(0, total)), total)
    policy = RetentionPolicy(hours=hours, max_bytes=max_bytes, disk_max_used_percent=percent)
    point = first_kept(log, hi, policy, disk)
    # commands between old messages can hide a message from a probe only if more than 64 follow one another
    assert point == by_scan(log, hi, policy, disk)
    assert first_kept(build(items), hi, policy, disk) == point  # another node with the same log
    compacted = build(items)
    compacted.compact_prefix(point)  # after compacting to the point, the point stays (nothing more to cut)
    assert first_kept(compacted, hi, RetentionPolicy(hours=hours, max_bytes=max_bytes)) >= point


def test_consumequeue_drops_whole_files_below_an_offset(tmp_path):
    cq = ConsumeQueue(tmp_path, "t", 0, units_per_file=10)
    for i in range(35):
        cq.append(1000 + i * 100, 100, 0)
    assert cq.drop_before(25) == 2  # files [0, 10) and [10, 20); [20, 30) holds 25..29
    assert cq.min_offset == 20
    assert cq.read(19, 5) == [] and cq.spans(5, 5) == ([], [])
    assert [u.queue_offset for u in cq.read(20, 3)] == [20, 21, 22]
    assert cq.drop_before(1000) == 1  # never the last file
    cq.close()
    again = ConsumeQueue(tmp_path, "t", 0, units_per_file=10)
    assert (again.min_offset, again.max_offset) == (30, 35)
    assert first_held(again, 35, 1000 + 32 * 100 - HEADER_SIZE) == 32
    assert first_held(again, 35, 0) == 30
    again.close()


def test_cleaning_opens_only_the_queues_with_more_than_one_file(tmp_path):
    """A node with many small queues: retention deletes the big queue's old files and opens no small queue (a
    restart after a snapshot opens queues at first use; 80,000 opened at once held the loop for seconds)."""
    sm = BrokerStateMachine(tmp_path / "cq", units_per_file=10)
    sm.apply([CommittedEntry(0, 1, 0, commands.encode(commands.CreateTopic("small", 50)))])
    sm.apply([CommittedEntry(1, 1, 100, commands.encode(commands.CreateTopic("big", 1)))])
    pos, index = 1000, 2
    for k in range(50):  # one message to each small queue, then 35 to the big one (four files)
        raw = bytearray(message.encode(message.Message(topic="small", body=b"x", queue_id=k)))
        message.patch_placement(raw, 0, pos + HEADER_SIZE)
        sm.apply([CommittedEntry(index, 1, pos, bytes(raw))])
        pos, index = pos + 1000, index + 1
    for q in range(35):
        raw = bytearray(message.encode(message.Message(topic="big", body=b"x", queue_id=0)))
        message.patch_placement(raw, q, pos + HEADER_SIZE)
        sm.apply([CommittedEntry(index, 1, pos, bytes(raw))])
        pos, index = pos + 1000, index + 1
    snapshot = io.BytesIO()
    sm.save_snapshot(snapshot)
    sm.close()

    restarted = BrokerStateMachine(tmp_path / "cq", units_per_file=10)
    restarted.load_snapshot(io.BytesIO(snapshot.getvalue()))
    log = MemoryLogStore(1 << 20)
    log.snapshot_point = lambda: SimpleNamespace(end_pos=pos - 8 * 1000)  # the log holds the last 8 messages
    retention = Retention(
        RetentionPolicy(max_bytes=1 << 30), log, lambda: index, restarted.queues_to_trim, tmp_path
    )
    retention.clean_queues()
    assert retention.stats["consumequeue_files_deleted"] == 2  # [0, 10) and [10, 20); [20, 30) holds 27
    assert list(restarted._queues) == [("big", 0)], "no small queue was opened"
    assert restarted.queue("big", 0).min_offset == 20 and restarted.queue("small", 7).max_offset == 1
    restarted.close()


@run
async def test_a_pull_behind_the_log_start_goes_on_from_the_first_held_offset(made):  # noqa: F811
    broker, node = made
    await topic(broker)
    for i in range(20):
        await broker.send("T", [out(0, b"m%d" % i)])
    log = node.log_store
    held = broker.read("T", 0, 12)
    index = broker.commitlog.locate(held.physical_offset, log.last_index)
    log.compact_prefix(index)  # as retention does once a snapshot covers it
    assert broker.first_held("T", 0) == 12
    p = await broker.pull("T", 0, 0, 5)
    assert [m.queue_offset for m in p.messages] == [12, 13, 14, 15, 16] and p.next_offset == 17
    r = await broker.pull_raw("T", 0, 3, 64)
    assert (r.count, r.next_offset) == (8, 20)


@run
async def test_a_receive_behind_the_log_start_passes_over_the_deleted_in_one_command(made):  # noqa: F811
    broker, node = made
    await topic(broker)
    await broker.send("T", [out(0, b"m%d" % i) for i in range(300)])
    held = broker.read("T", 0, 250)
    node.log_store.compact_prefix(broker.commitlog.locate(held.physical_offset, node.log_store.last_index))
    assert broker.first_held("T", 0) == 250
    before = len(node.proposals)
    got = await broker.pops.receive(
        "G", "T", 0, lambda m: True, 8, 60_000, 0, asyncio.get_running_loop().time() + 1
    )
    assert got is not None
    qid, popped, msgs = got
    assert qid == 0 and [d.offset for d in popped.deliveries] == list(range(250, 258))
    assert msgs[250].body == b"m250"
    assert len(node.proposals) - before == 2  # one Pop passed over 250 offsets, one delivered
