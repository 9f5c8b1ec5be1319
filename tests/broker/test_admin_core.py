"""The administration commands in the replicated state, without processes (``broker_adapter.core.admin``,
``statemachine``, ``allocator``, ``keyindex``): a topic deleted while sends to it are still in the unapplied
tail and created again starts at offset 0; a replay of the whole log over ConsumeQueue files that already hold
the new topic's units (a restart from no snapshot) ends with the same units; a group's deletion; the key index
skips what it already holds and answers a lookup; run-time settings survive a snapshot."""

from __future__ import annotations

import io

from broker_adapter import admin_service, security_rules
from broker_adapter.core import commands, keyindex
from broker_adapter.core.keyindex import HEADER_SIZE, KEY, MSG_ID, KeyIndex
from broker_adapter.core.statemachine import BrokerStateMachine
from broker_adapter.v1 import admin_pb2
from statemachine.api import CommittedEntry
from storage.codec import MAGIC_NORMAL
from tests.broker import test_broker
from tests.broker.test_broker import out, run, topic

made = test_broker.made  # the in-process leader over a MemoryLogStore (a fixture)


def _log(node) -> list[CommittedEntry]:
    log = node.log_store
    return [
        CommittedEntry(e.index, e.term, e.pos, bytes(e.body))
        for e in log.entries(log.first_index, log.last_index + 1)
        if e.magic == MAGIC_NORMAL
    ]


@run
async def test_deleted_topic_created_again_starts_at_zero_and_replays(made, tmp_path):
    broker, node = made
    await topic(broker, "T", 2)
    await broker.send("T", [out(0, b"a"), out(0, b"b"), out(1, b"c")])
    node.hold = True  # a send placed but not applied when the deletion is placed: the allocator resets too
    await broker.send("T", [out(0, b"d")])
    node.hold = False
    (deleted,) = await broker.submit([commands.DeleteTopic("T")])
    assert isinstance(deleted, commands.DeleteTopic)
    assert "T" not in broker.sm.topics and broker.sm.deleted_topics["T"] > 0
    assert not (tmp_path / "cq" / "T").exists()
    await topic(broker, "T", 1)
    (r,) = await broker.send("T", [out(0, b"new")])
    assert (r.queue_id, r.queue_offset) == (0, 0)
    assert [m.body for m in (await broker.pull("T", 0, 0)).messages] == [b"new"]

    # Every entry again, over the files that hold the new topic's unit (no snapshot): the same end state.
    again = BrokerStateMachine(tmp_path / "cq")
    results = again.apply(_log(node))
    assert not [x for x in results if isinstance(x, Exception) and not isinstance(x, commands.CommandError)]
    assert again.topics == {"T": 1} and again.next_offsets == {("T", 0): 1}
    (unit,) = again.queue("T", 0).read(0, 1)
    assert unit.commitlog_offset == r.commitlog_offset
    again.close()


@run
async def test_group_deleted_and_settings_through_a_snapshot(made):
    broker, _ = made
    await topic(broker, "T", 1)
    await broker.send("T", [out(0, b"a")])
    await broker.commit_offset("g1", "T", 0, 1)
    assert broker.sm.group_names() == {"g1"}
    await broker.admin.delete_group("g1")
    assert broker.sm.group_names() == set() and broker.sm.offsets == {}
    shown = await broker.admin.set_config({"max_delay_ms": "60000"})
    assert shown["max_delay_ms"] == {"value": 60_000, "source": "log"}
    buf = io.BytesIO()
    broker.sm.save_snapshot(buf)
    seen = []
    restored = BrokerStateMachine(broker.sm.root)
    restored.on_config = seen.append
    restored.load_snapshot(io.BytesIO(buf.getvalue()))
    assert restored.config == {"max_delay_ms": 60_000} and seen == [{"max_delay_ms": 60_000}]
    restored.close()


def test_key_index_skips_what_it_holds_rolls_over_and_survives_a_kill(tmp_path):
    idx = KeyIndex(tmp_path, slots=16, capacity=4)
    idx.add(100, "ID1", ["k1", "k2"])
    idx.add(200, "ID2", ["k1"])  # a message's entries share a file: the second starts here (4 entries a file)
    idx.add(150, "ID9", ["k9"])  # at or below the last position: already indexed (a replay)
    idx.commit()
    assert idx.lookup(KEY, "k1", 10) == [200, 100]
    assert idx.lookup(MSG_ID, "ID2", 10) == [200]
    assert idx.lookup(KEY, "k9", 10) == []
    assert idx.lookup(KEY, "k1", 1) == [200]
    idx.add(300, "ID3", ["k1"])  # not committed: a killed process leaves it past the header's count
    for f in idx._files:  # what a SIGKILL leaves: the maps' bytes, headers as last written, not clean
        f.mm.flush()
    again = KeyIndex(tmp_path, slots=16, capacity=4)
    assert again.last_pos == 200 and again.rows() == 5
    assert again.lookup(KEY, "k1", 10) == [200, 100], "the slot moved by the dropped entry was rebuilt"
    again.add(300, "ID3", ["k1"])
    assert again.lookup(KEY, "k1", 10) == [300, 200, 100]
    assert again.prune_below(100) == 0, "the first file holds a message at 100"
    assert again.prune_below(250) == 3  # the first file: ID1, k1, k2
    assert again.lookup(KEY, "k1", 10) == [300, 200]
    again.close()
    assert KeyIndex(tmp_path, slots=16, capacity=4).lookup(MSG_ID, "ID3", 5) == [300]


def test_after_a_kill_only_the_newest_key_index_file_is_rebuilt_and_the_rebuild_matches(
    tmp_path, monkeypatch
):
    idx = KeyIndex(tmp_path, slots=64, capacity=300)
    for i in range(500):  # 1,000 entries: three full files and a fourth
        idx.add(48 + 10 * i, f"ID{i}", [f"k{i % 7}"])
        if i % 50 == 49:
            idx.commit()
    for f in idx._files:  # a SIGKILL: no close
        f.mm.flush()
    slots = [bytes(f.mm[HEADER_SIZE : f.base]) for f in idx._files]
    rebuilt: list[str] = []
    real = keyindex._File._rebuild_slots
    monkeypatch.setattr(keyindex._File, "_rebuild_slots", lambda f: rebuilt.append(f.path.name) or real(f))
    again = KeyIndex(tmp_path, slots=64, capacity=300)
    assert rebuilt == ["00000003.idx"], "a full file was marked clean when the next one started"
    assert [bytes(f.mm[HEADER_SIZE : f.base]) for f in again._files] == slots, "rebuilt as they were written"
    assert again.lookup(MSG_ID, "ID3", 5) == [78] and again.lookup(MSG_ID, "ID499", 5) == [48 + 4990]
    assert again.lookup(KEY, "k3", 200)[-1] == 78 and len(again.lookup(KEY, "k3", 200)) == 71
    for f in again._files:
        f.mm.flush()
    rebuilt.clear()
    KeyIndex(tmp_path, slots=64, capacity=300).close()  # killed again: still only the newest
    assert rebuilt == ["00000003.idx"]


def test_on_a_secure_group_reads_need_a_user_and_changes_need_admin():
    assert security_rules.ADMIN in security_rules.rules()
    assert security_rules.ADMIN.service == admin_service.SERVICE
    methods = security_rules.ADMIN.methods
    for read in ("TopicStatus", "ListGroups", "DescribeGroup", "GetConfig"):
        assert methods[read](None) == [("user",)]
    for change in ("DeleteTopic", "DeleteGroup", "ResetOffsets", "SetConfig"):
        assert change not in methods, f"{change} must need admin (a method not listed does)"
    query = methods["QueryMessages"]
    assert query(admin_pb2.QueryMessagesRequest(by="key", value="k", topic="t")) == [("subscribe", "t", None)]
    assert query(admin_pb2.QueryMessagesRequest(by="key", value="k")) == [("admin",)]
