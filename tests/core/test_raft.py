"""RaftCore unit tests, each named after the rule of the Raft paper/thesis it checks (after etcd-io/raft's
raft_paper_test.go). Cores are driven by hand: messages are built and stepped explicitly."""

from __future__ import annotations

import random

import pytest

from dledger.core.config import RaftConfig
from dledger.core.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    RequestVote,
    RequestVoteResponse,
    Role,
    TimeoutNow,
)
from dledger.core.raft import InvalidTransitionError, RaftCore
from dledger.errors import InvalidRequestError, NotLeaderError
from storage import codec
from storage.api import HardState
from storage.memory import MemoryLogStore

IDS = ["n1", "n2", "n3"]
BASIC = RaftConfig(pre_vote=False, check_quorum=False)
FRESH = HardState()
FRESH = HardState()


def make(nid="n1", config=BASIC, store=None, hs=FRESH, seed=1, voters=IDS) -> RaftCore:
    return RaftCore(
        nid, voters, store or MemoryLogStore(), hs, config, random.Random(seed), log_event=lambda s: None
    )


def drain(core: RaftCore, store: MemoryLogStore | None = None):
    """Handle every Ready like a runtime would; return the messages."""
    out = []
    while core.has_ready():
        rd = core.ready()
        if store is not None:
            if rd.truncate_from is not None:
                store.truncate_suffix(rd.truncate_from)
            if rd.frames:
                store.append(rd.frames)
        out.extend(rd.messages)
        core.advance(rd)
    return out


def elect(core: RaftCore, store=None) -> list:
    """Make ``core`` leader of a 3-node group by hand (votes from everyone); returns its first messages."""
    while core.role not in (Role.CANDIDATE, Role.PRE_CANDIDATE):
        core.tick()
    if core.role is Role.PRE_CANDIDATE:
        for p in IDS[1:]:
            core.step(RequestVoteResponse(core.term + 1, p, core.id, True, pre_vote=True))
    for p in IDS[1:]:
        if core.role is Role.CANDIDATE:
            core.step(RequestVoteResponse(core.term, p, core.id, True))
    assert core.role is Role.LEADER
    return drain(core, store)


# -- §5.2 leader election ------------------------------------------------------------------------------------------


def test_election_timeout_is_drawn_from_the_configured_range_afresh_each_time() -> None:
    lo, hi = BASIC.election_ticks
    seen = set()
    for seed in range(60):
        core = make(seed=seed)
        ticks = 0
        while core.role is Role.FOLLOWER:
            core.tick()
            ticks += 1
        assert lo <= ticks <= hi
        seen.add(ticks)
    assert len(seen) > (hi - lo) // 2, "timeouts are spread over the range"


def test_follower_starts_election_with_a_vote_for_itself_persisted_before_requests() -> None:
    core = make()
    while core.role is Role.FOLLOWER:
        core.tick()
    assert core.role is Role.CANDIDATE and core.term == 1
    rd = core.ready()
    assert rd.hard_state == HardState(1, "n1"), "the self-vote is in the same Ready as the requests"
    reqs = [m for m in rd.messages if isinstance(m, RequestVote)]
    assert {m.dst for m in reqs} == {"n2", "n3"} and all(m.term == 1 and m.last_log_index == -1 for m in reqs)


def test_pre_vote_does_not_change_term_or_vote() -> None:
    core = make(config=RaftConfig())
    while core.role is Role.FOLLOWER:
        core.tick()
    assert core.role is Role.PRE_CANDIDATE and core.term == 0
    rd = core.ready()
    assert rd.hard_state is None
    assert all(isinstance(m, RequestVote) and m.pre_vote and m.term == 1 for m in rd.messages)


def test_one_vote_per_term_and_the_grant_waits_for_the_persisted_vote() -> None:
    core = make("n2")
    core.step(RequestVote(1, "n1", "n2", -1, 0))
    rd = core.ready()
    assert rd.hard_state == HardState(1, "n1")
    assert rd.messages == (RequestVoteResponse(1, "n2", "n1", True),)
    core.advance(rd)
    core.step(RequestVote(1, "n3", "n2", -1, 0))
    assert drain(core) == [RequestVoteResponse(1, "n2", "n3", False)]
    core.step(RequestVote(1, "n1", "n2", -1, 0))  # a retry from the same candidate is granted again
    assert drain(core) == [RequestVoteResponse(1, "n2", "n1", True)]


def test_vote_survives_restart() -> None:
    store = MemoryLogStore()
    core = make("n2", hs=HardState(3, "n1"), store=store)
    core.step(RequestVote(3, "n3", "n2", 10, 3))
    assert drain(core) == [RequestVoteResponse(3, "n2", "n3", False)]


@pytest.mark.parametrize(
    ("last_index", "last_term", "granted"),
    [(0, 1, True), (5, 1, True), (-1, 0, False), (0, 0, False), (3, 2, True)],
)
def test_vote_requires_a_log_at_least_as_up_to_date(last_index, last_term, granted) -> None:
    store = MemoryLogStore()
    store.append(codec.encode(0, 1, 0, b"x", 0))  # our log: index 0, term 1
    core = make("n2", store=store, hs=HardState(1, None))
    core.step(RequestVote(2, "n1", "n2", last_index, last_term))
    msgs = drain(core)
    assert msgs == [RequestVoteResponse(2, "n2", "n1", granted)]


def test_candidate_wins_with_a_majority_and_appends_a_noop() -> None:
    core = make()
    elect(core)
    assert core.leader_id == "n1"
    assert core.last_index == 0
    frames = core.raft_log.frames_from(0, 1 << 20)[0]
    h = codec.decode_header(frames)
    assert h.magic == codec.MAGIC_NOOP and h.body_length == 0 and h.term == core.term


def test_candidate_loses_with_a_majority_of_rejections() -> None:
    core = make()
    while core.role is Role.FOLLOWER:
        core.tick()
    core.step(RequestVoteResponse(1, "n2", "n1", False))
    core.step(RequestVoteResponse(1, "n3", "n1", False))
    assert core.role is Role.FOLLOWER and core.term == 1


def test_candidate_steps_down_for_a_leader_of_its_term() -> None:
    core = make()
    while core.role is Role.FOLLOWER:
        core.tick()
    core.step(Heartbeat(1, "n2", "n1", -1))
    assert core.role is Role.FOLLOWER and core.leader_id == "n2"


def test_illegal_transition_raises() -> None:
    core = make()
    with pytest.raises(InvalidTransitionError, match="follower -> leader"):
        core._become_leader()


def test_a_newer_term_makes_anyone_a_follower() -> None:
    core = make()
    elect(core)
    core.step(AppendEntriesResponse(7, "n2", "n1", False))
    assert core.role is Role.FOLLOWER and core.term == 7 and core.leader_id is None


def test_stale_term_messages_are_answered_so_old_leaders_learn() -> None:
    core = make("n2", hs=HardState(5, None))
    core.step(AppendEntries(3, "n1", "n2", -1, 0, -1))
    assert drain(core) == [AppendEntriesResponse(5, "n2", "n1", False)]
    core.step(RequestVote(4, "n3", "n2", 100, 4))
    assert drain(core) == [], "stale votes are ignored"


# -- §5.3 log replication -------------------------------------------------------------------------------------------


def test_leader_sends_heartbeats_every_heartbeat_interval() -> None:
    core = make()
    elect(core)
    for _ in range(BASIC.heartbeat_ticks - 1):
        core.tick()
    assert not any(isinstance(m, Heartbeat) for m in drain(core))
    core.tick()
    beats = [m for m in drain(core) if isinstance(m, Heartbeat)]
    assert {m.dst for m in beats} == {"n2", "n3"}


def test_propose_on_a_follower_names_the_leader() -> None:
    core = make("n2")
    core.step(Heartbeat(1, "n1", "n2", -1))
    with pytest.raises(NotLeaderError) as err:
        core.propose([b"x"])
    assert err.value.leader_hint == "n1"


def test_propose_assigns_index_term_pos_and_chain_like_the_codec() -> None:
    store = MemoryLogStore(segment_size=4096)
    core = make(store=store, config=RaftConfig(pre_vote=False, segment_size=4096))
    elect(core, store)
    p = core.propose([b"a" * 2000, b"b" * 2000])  # the second does not fit the first 4 KiB segment
    assert p.first_index == 1 and p.term == 1
    assert p.positions == (48, 4096)
    drain(core, store)  # the store validates body CRC, chain and positions on append
    assert store.entry(2).header.pos == 4096


def test_propose_rejects_an_entry_larger_than_a_segment_without_side_effects() -> None:
    core = make(config=RaftConfig(pre_vote=False, segment_size=4096))
    elect(core)
    last = core.last_index
    with pytest.raises(InvalidRequestError):
        core.propose([b"ok", b"x" * 5000])
    assert core.last_index == last


def test_follower_appends_and_acknowledges_after_persisting() -> None:
    leader_store = MemoryLogStore()
    leader = make(store=leader_store)
    msgs = elect(leader, leader_store)
    leader.propose([b"a", b"b"])  # n2 is probed first (one append in flight), so these wait for its answer
    msgs = [m for m in msgs + drain(leader, leader_store) if isinstance(m, AppendEntries) and m.dst == "n2"]
    assert len(msgs) == 1 and msgs[0].prev_log_index == -1
    f_store = MemoryLogStore()
    follower = make("n2", store=f_store)
    for m in msgs:
        follower.step(m)
    rd = follower.ready()
    assert rd.frames, "entries to persist and the acknowledgement travel in the same Ready"
    assert any(isinstance(m, AppendEntriesResponse) and m.success for m in rd.messages)


def test_rejection_carries_a_term_hint_for_fast_backtracking() -> None:
    # Follower log: terms [1, 1, 2, 2, 2]; leader asks about index 4 with term 3.
    store = MemoryLogStore()
    chain, pos = 0, 0
    for i, t in enumerate([1, 1, 2, 2, 2]):
        f = codec.encode(i, t, pos, b"x", chain)
        chain = codec.decode_header(f).chain_crc
        pos += len(f)
        store.append(f)
    core = make("n2", store=store, hs=HardState(3, None))
    core.step(AppendEntries(3, "n1", "n2", 4, 3, -1))
    (resp,) = drain(core)
    assert (resp.success, resp.conflict_term, resp.conflict_index) == (False, 2, 2)
    core.step(AppendEntries(3, "n1", "n2", 9, 3, -1))
    (resp,) = drain(core)
    assert (resp.conflict_term, resp.conflict_index) == (-1, 5)


def test_follower_truncates_a_conflicting_suffix_then_appends() -> None:
    store = MemoryLogStore()
    f0 = codec.encode(0, 1, 0, b"a", 0)
    f1 = codec.encode(1, 1, len(f0), b"old", codec.decode_header(f0).chain_crc)
    store.append(f0 + f1)
    core = make("n2", store=store, hs=HardState(2, None))
    new1 = codec.encode(1, 2, len(f0), b"new", codec.decode_header(f0).chain_crc)
    core.step(AppendEntries(2, "n1", "n2", 0, 1, 1, new1))
    rd = core.ready()
    assert rd.truncate_from == 1 and rd.frames == new1 and rd.commit_index == 1
    store.truncate_suffix(rd.truncate_from)
    store.append(rd.frames)
    core.advance(rd)
    assert store.entry(1).body.tobytes() == b"new"


def test_leader_commits_only_entries_of_its_term_by_counting() -> None:
    store = MemoryLogStore()
    store.append(codec.encode(0, 1, 0, b"old", 0))
    core = make(store=store, hs=HardState(1, None))
    elect(core, store)  # term 2, no-op at index 1
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=0))
    assert core.commit_index == -1, "index 0 is from term 1: a replica count does not commit it"
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=1))
    assert core.commit_index == 1


def test_chain_mismatch_at_a_matching_term_is_reported_as_divergence() -> None:
    store = MemoryLogStore()
    store.append(codec.encode(0, 1, 0, b"a", 0))
    core = make("n2", store=store, hs=HardState(1, None))
    with pytest.raises(Exception, match="chain_crc"):
        core.step(AppendEntries(1, "n1", "n2", 0, 1, -1, b"", prev_chain_crc=12345))


# -- thesis §6.2 check-quorum, §3.10 transfer ----------------------------------------------------------------------


def test_check_quorum_leader_steps_down_without_responses() -> None:
    core = make(config=RaftConfig())
    elect(core)
    for _ in range(RaftConfig().election_ticks[0]):
        core.tick()
    assert core.role is Role.FOLLOWER and core.term == 1


def test_check_quorum_leader_stays_with_responses() -> None:
    core = make(config=RaftConfig())
    elect(core)
    for _ in range(3 * RaftConfig().election_ticks[0]):
        core.tick()
        core.step(HeartbeatResponse(core.term, "n2", "n1"))
    assert core.role is Role.LEADER


def test_lease_makes_followers_ignore_votes_but_not_transfers() -> None:
    core = make("n2", config=RaftConfig())
    core.step(Heartbeat(1, "n1", "n2", -1))
    drain(core)
    core.step(RequestVote(2, "n3", "n2", 5, 1))
    assert drain(core) == [] and core.term == 1
    core.step(RequestVote(2, "n3", "n2", 5, 1, transfer=True))
    assert drain(core) == [RequestVoteResponse(2, "n2", "n3", True)]


def test_timeout_now_starts_an_election_at_once() -> None:
    core = make("n2", config=RaftConfig())
    core.step(TimeoutNow(0, "n1", "n2"))
    assert core.role is Role.CANDIDATE and core.term == 1
    reqs = [m for m in drain(core) if isinstance(m, RequestVote)]
    assert reqs and all(m.transfer and not m.pre_vote for m in reqs)


def test_transfer_errors() -> None:
    core = make("n2")
    with pytest.raises(NotLeaderError):
        core.transfer_leadership("n1")
    leader = make()
    elect(leader)
    with pytest.raises(InvalidRequestError):
        leader.transfer_leadership("n9")


# -- the Ready contract ---------------------------------------------------------------------------------------------


def test_ready_must_be_advanced_before_the_next() -> None:
    core = make()
    elect(core)
    core.propose([b"x"])
    rd = core.ready()
    assert not core.has_ready()
    with pytest.raises(RuntimeError):
        core.ready()
    with pytest.raises(RuntimeError):
        core.advance(type(rd)())
    core.advance(rd)


def test_status_reports_progress_on_the_leader() -> None:
    core = make()
    elect(core)
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=0))
    st = core.status()
    assert st.role is Role.LEADER and st.leader == "n1" and st.commit_index == 0
    assert st.match == {"n1": 0, "n2": 0, "n3": -1}


def test_constructor_validates_membership_and_applied() -> None:
    with pytest.raises(InvalidRequestError, match="duplicates"):
        make(voters=["n1", "n2", "n1"])
    outsider = make("n9")  # a node joining the group: it waits for the leader's log and never campaigns
    for _ in range(200):
        outsider.tick()
    assert outsider.role is Role.FOLLOWER and drain(outsider) == []
    with pytest.raises(InvalidRequestError):
        RaftCore("n1", IDS, MemoryLogStore(), HardState(), BASIC, random.Random(), applied=5)


def test_single_node_group_commits_alone() -> None:
    core = make(voters=["n1"], config=RaftConfig())
    for _ in range(40):
        core.tick()
    assert core.role is Role.LEADER
    p = core.propose([b"solo"])
    assert core.commit_index == p.first_index
    core.read_index(3)
    assert core.ready().read_states == ((3, p.first_index),)


def test_propose_prepare_sees_each_place_and_may_fill_the_body():
    """The broker writes PHYSICALOFFSET (pos + 48) into a message once the leader has placed its entry."""
    store = MemoryLogStore()
    core = make(store=store)
    elect(core, store)
    seen = []

    def prepare(index, pos, body):
        seen.append((index, pos))
        return pos.to_bytes(8, "big") + body[8:]

    proposed = core.propose([bytes(16), bytes(16)], prepare=prepare)
    assert [i for i, _ in seen] == [proposed.first_index, proposed.first_index + 1]
    assert tuple(p for _, p in seen) == proposed.positions
    drain(core, store)
    filled = store.entries(proposed.first_index, proposed.first_index + 2)
    assert [int.from_bytes(e.body[:8], "big") for e in filled] == list(proposed.positions)
    with pytest.raises(InvalidRequestError, match="changed the body"):
        core.propose([b"abc"], prepare=lambda i, p, b: b + b"x")
    assert store.last_index == proposed.first_index + 1 and core.status().last_index == store.last_index


def test_messages_from_nodes_outside_our_configuration_are_handled() -> None:
    """Thesis §4.1: a node that has not yet appended the entry adding n4 must still follow n4 when it leads
    (the transport, not the core, refuses ids that are not in the group at all: dledger/runtime/peers.py)."""
    core = make("n2")
    core.step(AppendEntries(9, "n4", "n2", -1, 0, -1))
    assert core.term == 9 and core.leader_id == "n4"
    out = drain(core)
    assert [type(m).__name__ for m in out] == ["AppendEntriesResponse"] and out[0].dst == "n4"
