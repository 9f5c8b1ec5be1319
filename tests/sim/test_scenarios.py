"""Scripted scenarios: the classic Raft cases, each a short story told by the cluster's transcript.

Each test drives the simulated cluster with explicit verbs, checks the safety invariants after every step that
matters, and asserts the key transcript lines in order. On failure ``conftest.py`` attaches every cluster's
transcript to the report, so the story of what went wrong is right there.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from dledger.core.config import RaftConfig
from dledger.core.messages import AppendEntries, InstallSnapshot, Role, TimeoutNow
from dledger.errors import NotLeaderError
from storage.api import HardState
from tests.sim.cluster import Cluster

TRANSCRIPTS = Path(__file__).parent / "transcripts"


def golden(c: Cluster, name: str) -> None:
    """The whole transcript equals ``transcripts/<name>.txt`` (the scenario's readable story, reviewed as a diff).
    After an intended change of behaviour or wording, rewrite with ``REWRITE_TRANSCRIPTS=1`` and review the diff."""
    path = TRANSCRIPTS / f"{name}.txt"
    text = "\n".join(c.transcript) + "\n"
    if os.environ.get("REWRITE_TRANSCRIPTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return
    want = path.read_text()
    if text != want:
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(path), "this run")
        )
        raise AssertionError(f"transcript differs from {path} (REWRITE_TRANSCRIPTS=1 to accept):\n{diff}")


def expect_lines(c: Cluster, *fragments: str) -> None:
    """Each fragment appears in the transcript, in this order."""
    i = 0
    for frag in fragments:
        while i < len(c.transcript) and frag not in c.transcript[i]:
            i += 1
        assert i < len(c.transcript), f"transcript lacks {frag!r} (in order)\n{c.dump(80)}"
        i += 1


def elect(c: Cluster, nid: str) -> None:
    c.campaign(nid)
    c.stabilize()
    assert c.nodes[nid].core.role is Role.LEADER, c.dump(40)


def win_without_appends(c: Cluster, nid: str, max_ticks: int = 1000) -> None:
    """Tick only ``nid`` (so it is the one to campaign, again at higher terms if votes are refused) until it
    leads, delivering votes but holding back every AppendEntries so nothing is replicated meanwhile."""
    core = c.nodes[nid].core
    for _ in range(max_ticks):
        c.tick(nodes=[nid])
        for _ in range(6):  # pre-vote requests, responses, vote requests, responses
            c.deliver_where(lambda m: not isinstance(m, AppendEntries))
        if core.role is Role.LEADER:
            return
    raise AssertionError(f"{nid} did not win within {max_ticks} ticks\n{c.dump(40)}")


def frames_carry(m, index: int) -> bool:
    if type(m) is not AppendEntries or not m.frames:
        return False
    return m.prev_log_index < index <= m.prev_log_index + _count(m.frames)


def _count(frames: bytes) -> int:
    n, off = 0, 0
    while off < len(frames):
        off += int.from_bytes(frames[off + 4 : off + 8], "big")
        n += 1
    return n


def test_figure_8_a_leader_never_commits_an_old_term_entry_by_counting_replicas() -> None:
    """Raft paper figure 8: an entry from an earlier term on a majority is not yet committed; it may still be
    overwritten, and it is."""
    cfg = RaftConfig(segment_size=1 << 20, pre_vote=False, check_quorum=False, max_append_bytes=1024)
    c = Cluster(5, seed=8, config=cfg, segment_size=cfg.segment_size)
    elect(c, "n1")  # term 1, no-op at index 0, committed everywhere
    c.check_invariants()
    # (a) n1 replicates entry 1 (term 1) to n2 only.
    c.partition({"n1", "n2"}, {"n3", "n4", "n5"})
    c.propose("n1", [b"A" * 1000])
    c.stabilize()
    assert c.nodes["n2"].core.last_index == 1 and c.nodes["n1"].core.commit_index == 0
    # (b) n1 crashes; n5 wins term 2 with n3 and n4 and appends its own entry 1 (its no-op), sent to nobody.
    c.crash("n1")
    c.partition({"n3", "n4", "n5"}, {"n2"})
    win_without_appends(c, "n5")
    assert c.nodes["n5"].core.term == 2
    c.drop_where(lambda m: m.src == "n5")
    c.crash("n5")
    # (c) n1 restarts and wins (term 3) (n2, n3, n4); it copies its term-1 entry 1 to n3: now on a majority.
    c.restart("n1")
    c.partition({"n1", "n2", "n3", "n4"}, {"n5"})
    win_without_appends(c, "n1")
    for _ in range(4):
        c.deliver_where(lambda m: not isinstance(m, AppendEntries) or m.dst == "n3")
        c.drop_where(lambda m: isinstance(m, AppendEntries) and m.dst == "n3" and not frames_carry(m, 1))
        c.drop_where(lambda m: isinstance(m, AppendEntries) and m.dst != "n3")
    n1 = c.nodes["n1"].core
    assert n1.role is Role.LEADER and n1.term == 3  # term 2 failed: n3 and n4 had voted for n5
    holders = [
        n for n in ("n1", "n2", "n3") if c.nodes[n].store.last_index >= 1 and c.nodes[n].store.term(1) == 1
    ]
    assert holders == ["n1", "n2", "n3"], c.dump(40)
    assert n1.commit_index == 0, "an entry of an older term must not commit by counting replicas (§5.4.2)"
    c.check_invariants()
    # (d) n1 crashes before its no-op spreads; n5 (last term 2 beats n2's and n3's 1) wins and overwrites entry 1.
    c.drop_where(lambda m: m.src == "n1")
    c.crash("n1")
    c.restart("n5")
    c.partition({"n2", "n3", "n4", "n5"}, {"n1"})
    win_without_appends(c, "n5")  # only n5's timer runs, so n5 is the one to campaign
    c.stabilize()
    c.check_invariants()
    assert all(c.nodes[n].store.term(1) == 2 for n in ("n2", "n3", "n4", "n5"))
    c.heal()
    c.restart("n1")
    c.run_until(lambda: c.nodes["n1"].core.commit_index >= c.nodes["n5"].core.commit_index >= 1)
    assert c.nodes["n1"].store.term(1) == 2, "n1's uncommitted term-1 entry was replaced"
    c.check_invariants()
    expect_lines(
        c,
        "n1 became leader at term 1",
        "n5 became leader at term 2",
        "crash n5",
        "n1 became leader at term 3",
        "crash n1",
        "n5 became leader at term",
    )
    golden(c, "figure_8")


def test_partitioned_stale_leader_steps_down_and_its_writes_never_commit() -> None:
    c = Cluster(3, seed=2)
    elect(c, "n1")
    c.propose("n1", [b"before"])
    c.stabilize()
    c.isolate("n1")
    stale = c.propose("n1", [b"lost write"])  # accepted locally, can never reach a quorum
    c.run_until(lambda: c.leader() in ("n2", "n3") and c.nodes["n1"].core.role is Role.FOLLOWER)
    new = c.leader()
    fresh = c.propose(new, [b"after"])
    c.stabilize()
    c.heal()
    c.run_until(lambda: c.nodes["n1"].core.commit_index >= fresh.first_index)
    c.check_invariants()
    n1 = c.nodes["n1"]
    assert n1.core.leader_id == new
    assert n1.store.term(stale.first_index) != stale.term, "the stale leader's write was overwritten"
    assert n1.store.entry(fresh.first_index).body.tobytes() == b"after"
    expect_lines(c, "n1 became leader at term 1", "isolate n1", f"{new} became leader at term 2", "heal")
    expect_lines(
        c, "isolate n1", "n1 stepped down at term 1: no quorum heard within an election timeout", "heal"
    )
    expect_lines(c, "heal", f"n1 became follower at term 2 (leader {new})")
    golden(c, "partitioned_stale_leader")


def test_candidate_with_a_shorter_log_cannot_win() -> None:
    cfg = RaftConfig(
        segment_size=1 << 20, check_quorum=False
    )  # pre-vote on; no lease so votes are judged on logs
    c = Cluster(3, seed=3, config=cfg, segment_size=cfg.segment_size)
    elect(c, "n1")
    c.cut("n1", "n3")
    p = c.propose("n1", [b"x", b"y"])
    c.stabilize()
    assert c.nodes["n2"].core.commit_index == p.first_index + 1  # committed by n1 + n2; n3 lacks it
    c.crash("n1")
    c.heal()
    c.campaign("n3")
    c.stabilize()
    assert c.nodes["n3"].core.role is not Role.LEADER
    assert c.nodes["n3"].core.term == 1, "a failed pre-vote does not raise anyone's term"
    c.run_until(lambda: c.leader() == "n2")
    c.run_until(lambda: c.nodes["n3"].core.commit_index >= p.first_index + 1)
    c.check_invariants()
    expect_lines(
        c,
        "n3 became pre-candidate at term 1",
        "n2 rejected pre-vote from n3 at term 2",
        "n2 became leader at term 2",
    )


@pytest.mark.parametrize("pre_vote", [True, False])
def test_rejoining_partitioned_node(pre_vote: bool) -> None:
    """With pre-vote a node back from a partition does not disrupt the leader; without it, it does."""
    cfg = RaftConfig(segment_size=1 << 20, pre_vote=pre_vote, check_quorum=pre_vote)
    c = Cluster(3, seed=4, config=cfg, segment_size=cfg.segment_size)
    elect(c, "n1")
    c.isolate("n3")
    c.run(300)  # ten election timeouts and more
    n3 = c.nodes["n3"].core
    if pre_vote:
        assert n3.term == 1, "pre-vote keeps an isolated node's term"
    else:
        assert n3.term > 5
    c.heal()
    p = c.propose(c.leader(), [b"after heal"])
    c.run_until(
        lambda: all(n.core.commit_index >= p.first_index for n in c.nodes.values()) or pre_vote is False
    )
    c.run(100)
    c.check_invariants()
    if pre_vote:
        assert c.leader() == "n1" and c.nodes["n1"].core.term == 1, c.dump(30)
        assert not any("became leader at term 2" in line for line in c.transcript)
    else:
        assert c.nodes[c.leader()].core.term > 5, "the rejoining node's higher term forced a new election"


def test_leadership_transfer_during_writes() -> None:
    c = Cluster(3, seed=5)
    elect(c, "n1")
    c.cut("n1", "n3")
    for i in range(10):
        c.propose("n1", [f"w{i}".encode()])
    c.stabilize()
    c.heal()
    c.nodes["n1"].core.transfer_leadership("n3")  # n3 lags: it is caught up first
    c.process("n1")
    with pytest.raises(NotLeaderError) as err:
        c.nodes["n1"].core.propose([b"during transfer"])
    assert err.value.leader_hint == "n3"
    c.run_until(lambda: c.leader() == "n3")
    p = c.propose("n3", [b"on the new leader"])
    c.run_until(lambda: all(n.core.commit_index >= p.first_index for n in c.nodes.values()))
    c.check_invariants()
    assert c.nodes["n3"].core.term == 2
    expect_lines(
        c,
        "n1 transferring leadership to n3 at term 1",
        "n1 sends TimeoutNow to n3: its log is caught up",
        "n3 received TimeoutNow from n1 at term 1: campaigning",
        "n3 became leader at term 2",
    )
    golden(c, "transfer_during_writes")


def test_transfer_is_abandoned_when_the_target_is_unreachable() -> None:
    c = Cluster(3, seed=6)
    elect(c, "n1")
    c.isolate("n3")
    c.nodes["n1"].core.transfer_leadership("n3")
    c.run(40)
    assert c.leader() == "n1"
    c.propose("n1", [b"accepted again"])
    expect_lines(c, "n1 transferring leadership to n3", "n1 abandoned leadership transfer to n3")


def test_preferred_leader_gets_leadership_back() -> None:
    cfg = RaftConfig(segment_size=1 << 20, preferred_leader="n2")
    c = Cluster(3, seed=7, config=cfg, segment_size=cfg.segment_size)
    elect(c, "n1")
    c.propose("n1", [b"x"])
    c.run_until(lambda: c.leader() == "n2")
    c.run(100)
    assert c.leader() == "n2", "the preferred leader keeps leadership"
    c.check_invariants()
    expect_lines(c, "n1 hands leadership back to preferred leader n2", "n2 became leader at term 2")


def test_follower_far_behind_catches_up_window_by_window() -> None:
    cfg = RaftConfig(segment_size=1 << 16, max_append_bytes=4096, max_inflight=2)
    c = Cluster(3, seed=9, config=cfg, segment_size=cfg.segment_size)
    elect(c, "n1")
    c.crash("n3")
    for i in range(100):
        c.propose("n1", [bytes([i]) * 500])
    c.stabilize()
    c.restart("n3")
    sizes, peak = [], 0
    for _ in range(5000):  # one message at a time, FIFO, so the window is observable
        in_flight = [
            e.msg for e in c.queue if type(e.msg) is AppendEntries and e.msg.dst == "n3" and e.msg.frames
        ]
        peak = max(peak, len(in_flight))
        assert len(in_flight) <= cfg.max_inflight
        if c.queue:
            m = c.queue[0].msg
            if type(m) is AppendEntries and m.frames:
                sizes.append(len(m.frames))
            c.deliver(0)
        elif c.nodes["n3"].core.commit_index == c.nodes["n1"].core.commit_index:
            break
        else:
            c.tick()
    assert peak == cfg.max_inflight, "the leader pipelines up to the window"
    assert c.nodes["n3"].store.last_index == c.nodes["n1"].store.last_index
    assert max(sizes) <= cfg.max_append_bytes
    c.check_invariants()


SMALL_CACHE = RaftConfig(segment_size=1 << 20, max_append_bytes=1024, max_inflight=2)  # 2 KiB leader cache


def test_snapshot_catches_up_a_follower_behind_compaction() -> None:
    c = Cluster(3, seed=10, config=SMALL_CACHE, segment_size=SMALL_CACHE.segment_size)
    elect(c, "n1")
    c.crash("n3")
    for i in range(30):
        c.propose("n1", [f"e{i}".encode() * 50])
    c.stabilize()
    c.compact("n1", 20)
    c.compact("n2", 20)
    c.restart("n3")
    c.run_until(lambda: c.nodes["n3"].core.commit_index == c.nodes["n1"].core.commit_index)
    n3 = c.nodes["n3"]
    assert n3.store.first_index == 21 and n3.applied >= 20
    assert n3.store.entry(30).header.chain_crc == c.nodes["n1"].store.entry(30).header.chain_crc
    c.check_invariants()
    expect_lines(c, "n1 sends snapshot at index 20 to n3", "n3 installed snapshot at index 20 term 1 from n1")


def test_lost_snapshot_is_retried() -> None:
    c = Cluster(3, seed=11, config=SMALL_CACHE, segment_size=SMALL_CACHE.segment_size)
    elect(c, "n1")
    c.crash("n3")
    for i in range(10):
        c.propose("n1", [f"e{i}".encode() * 200])
    c.stabilize()
    c.compact("n1", 8)
    c.compact("n2", 8)
    c.drop_next(lambda m: type(m) is InstallSnapshot)
    c.restart("n3")
    c.run_until(lambda: c.nodes["n3"].core.commit_index == c.nodes["n1"].core.commit_index)
    expect_lines(
        c, "drop InstallSnapshot n1->n3", "n1 snapshot to n3 failed: probing", "n3 installed snapshot"
    )


def test_read_index_confirms_leadership_with_a_quorum() -> None:
    c = Cluster(3, seed=12)
    elect(c, "n1")
    p = c.propose("n1", [b"v"])
    c.stabilize()
    c.nodes["n1"].core.read_index(42)
    c.process("n1")
    assert c.nodes["n1"].read_states == [], "a read index needs a heartbeat round first"
    c.stabilize()
    assert c.nodes["n1"].read_states == [(42, p.first_index)]
    with pytest.raises(NotLeaderError) as err:
        c.nodes["n2"].core.read_index(1)
    assert err.value.leader_hint == "n1"


def test_read_index_waits_for_the_first_commit_of_the_term() -> None:
    c = Cluster(3, seed=16)
    win_without_appends(c, "n1")
    leader = c.nodes["n1"].core
    assert leader.role is Role.LEADER and leader.commit_index < leader.last_index
    leader.read_index(5)
    c.process("n1")
    assert c.nodes["n1"].read_states == []
    c.stabilize()  # the no-op commits, then the heartbeat round confirms
    assert c.nodes["n1"].read_states == [(5, leader.commit_index)]


def test_read_index_on_an_isolated_leader_never_completes() -> None:
    c = Cluster(3, seed=13)
    elect(c, "n1")
    c.isolate("n1")
    c.nodes["n1"].core.read_index(7)
    c.run(100)
    assert c.nodes["n1"].core.role is not Role.LEADER  # stepped down (check-quorum), now campaigning in vain
    assert c.nodes["n1"].read_states == []


def test_crash_between_vote_and_persist_forgets_nothing_promised() -> None:
    """A node that saved its vote and died before its grant left still refuses a second candidate of that term."""
    cfg = RaftConfig(segment_size=1 << 20, pre_vote=False, check_quorum=False)
    c = Cluster(3, seed=14, config=cfg, segment_size=cfg.segment_size)
    c.campaign("n1")  # candidate at term 1
    c.deliver_where(lambda m: m.dst == "n2" and m.src == "n1")  # n2 grants: vote persisted, reply queued
    assert c.nodes["n2"].meta.load_hard_state() == HardState(1, "n1")
    c.drop_where(lambda m: m.src == "n2")  # the grant dies with the node
    c.crash("n2")
    c.restart("n2")
    c.drop_where(lambda m: m.src == "n1")
    c.campaign("n3")  # also a candidate at term 1: it needs n2's vote
    assert c.nodes["n3"].core.term == 1
    c.deliver_where(lambda m: m.src == "n3" and m.dst == "n2")
    (answer,) = [e.msg for e in c.queue if e.msg.src == "n2" and e.msg.dst == "n3"]
    assert answer.term == 1 and not answer.granted, "one vote per term, even across a crash"
    c.stabilize()
    c.run_until(lambda: c.leader() is not None)
    c.check_invariants()


def test_timeout_now_overrides_the_lease() -> None:
    c = Cluster(3, seed=15)
    elect(c, "n1")
    c.nodes["n1"].core.transfer_leadership("n2")
    c.process("n1")
    assert any(type(e.msg) is TimeoutNow for e in c.queue)
    c.stabilize()
    assert c.leader() == "n2"
