"""Membership changes in the simulated cluster: the classic cases of the Raft thesis chapter 4 (and etcd-io/raft's
``confchange_*`` transcripts), each a story checked line by line against ``transcripts/<name>.txt``.

Rules under test: docs/decisions/0017-membership.md.
"""

from __future__ import annotations

import pytest

from dledger.core.membership import ConfChange, ConfChangeKind, Configuration
from dledger.core.messages import AppendEntries, Role
from dledger.errors import InvalidRequestError, UnavailableError
from tests.sim.cluster import Cluster
from tests.sim.test_scenarios import elect, expect_lines, golden

ADD = ConfChangeKind.ADD_LEARNER
PROMOTE = ConfChangeKind.PROMOTE
REMOVE = ConfChangeKind.REMOVE


def settle(c: Cluster, ticks: int = 30) -> None:
    c.run(ticks)
    c.check_invariants()


def committed_everywhere(c: Cluster, index: int, nodes) -> bool:
    return all(c.nodes[n].core.commit_index >= index for n in nodes)


def test_add_a_learner_then_promote_it() -> None:
    c = Cluster(3, seed=11)
    elect(c, "n1")
    c.propose("n1", [b"a", b"b"])
    settle(c)
    c.add_node("n4")
    p = c.change("n1", ConfChange(ADD, "n4"))
    settle(c)
    n4 = c.nodes["n4"].core
    assert n4.configuration == Configuration(("n1", "n2", "n3"), ("n4",))
    assert n4.commit_index >= p.first_index and n4.role is Role.FOLLOWER
    # A learner never counts toward a quorum: with n2 and n3 down, n1 + learner n4 commit nothing.
    c.crash("n2")
    c.crash("n3")
    q = c.propose("n1", [b"needs a voter"])
    c.run(5)
    assert c.nodes["n1"].core.commit_index < q.first_index
    c.restart("n2")
    c.restart("n3")
    settle(c, 60)
    assert c.nodes["n1"].core.commit_index >= q.first_index
    p = c.change("n1", ConfChange(PROMOTE, "n4"))
    settle(c)
    assert all(c.nodes[n].core.configuration.voters == ("n1", "n2", "n3", "n4") for n in c.ids)
    assert committed_everywhere(c, p.first_index, c.ids)
    expect_lines(
        c, "n4 uses configuration voters n1,n2,n3 learners n4", "n4 uses configuration voters n1,n2,n3,n4"
    )
    golden(c, "confchange_add_learner_promote")


def test_a_learner_never_campaigns_and_a_new_node_waits_for_the_log() -> None:
    c = Cluster(3, seed=12)
    elect(c, "n1")
    c.add_node("n4")
    c.tick(400, nodes=["n4"])  # knows no configuration: never campaigns
    assert c.nodes["n4"].core.role is Role.FOLLOWER and not c.queue
    c.change("n1", ConfChange(ADD, "n4"))
    settle(c)
    c.crash("n1")
    c.tick(400, nodes=["n4"])  # a learner: never campaigns either, even with the leader gone
    assert c.nodes["n4"].core.role is Role.FOLLOWER
    assert not any(m.src == "n4" for m in (e.msg for e in c.queue))


def test_one_change_at_a_time_and_not_before_a_commit_in_the_term() -> None:
    c = Cluster(3, seed=13)
    elect(c, "n1")
    c.add_node("n4")
    c.add_node("n5")
    c.cut("n1", "n2")
    c.cut("n1", "n3")
    c.change("n1", ConfChange(ADD, "n4"))  # cannot commit: n1 alone among the voters
    with pytest.raises(UnavailableError, match="not committed yet"):
        c.change("n1", ConfChange(ADD, "n5"))
    c.heal()
    settle(c)
    c.change("n1", ConfChange(ADD, "n5"))  # the first one committed: the next is allowed
    settle(c)
    # A new leader must first commit an entry of its own term (its no-op).
    c.crash("n1")
    for _ in range(1000):  # elect n2 or n3, holding back every AppendEntries (so its no-op cannot commit)
        c.tick()
        for _ in range(6):
            c.deliver_where(lambda m: not isinstance(m, AppendEntries))
        if c.leader() is not None:
            break
    leader = c.leader()
    assert leader in ("n2", "n3")
    with pytest.raises(UnavailableError, match="has not committed an entry of its term"):
        c.change(leader, ConfChange(REMOVE, "n5"))
    settle(c)
    c.change(leader, ConfChange(REMOVE, "n5"))
    settle(c)
    with pytest.raises(InvalidRequestError, match="already a learner"):
        c.nodes[leader].core.propose_conf_change(ConfChange(ADD, "n4"))


def test_promote_waits_for_the_learner_to_catch_up() -> None:
    c = Cluster(3, seed=14)
    elect(c, "n1")
    for _k in range(5):
        c.propose("n1", [b"x" * 200])
    settle(c)
    c.add_node("n4")
    c.cut("n1", "n4")
    c.change("n1", ConfChange(ADD, "n4"))
    settle(c)
    with pytest.raises(UnavailableError, match="has not caught up"):
        c.change("n1", ConfChange(PROMOTE, "n4"))
    c.heal()
    settle(c)
    c.change("n1", ConfChange(PROMOTE, "n4"))
    settle(c)


def test_remove_the_leader_it_steps_down_once_the_change_commits() -> None:
    c = Cluster(3, seed=15)
    elect(c, "n1")
    c.propose("n1", [b"before"])
    settle(c)
    c.cut("n1", "n3")
    p = c.change("n1", ConfChange(REMOVE, "n1"))
    # Appended: in effect on n1 at once, and n1 still leads (it must replicate the change that removes it).
    assert c.nodes["n1"].core.configuration.voters == ("n2", "n3")
    assert c.nodes["n1"].core.role is Role.LEADER
    # Its own copy does not count: the change commits only when n2 and n3 (the new voters) both hold it.
    c.deliver_all()
    assert c.nodes["n1"].core.commit_index < p.first_index and c.nodes["n1"].core.role is Role.LEADER
    c.heal()
    c.run_until(lambda: c.leader() not in (None, "n1"))
    settle(c)
    leader = c.leader()
    assert c.nodes["n1"].core.role is Role.FOLLOWER and leader in ("n2", "n3")
    q = c.propose(leader, [b"after"])
    settle(c)
    assert committed_everywhere(c, q.first_index, ["n2", "n3"])
    c.tick(500, nodes=["n1"])  # removed: never campaigns
    assert c.nodes["n1"].core.role is Role.FOLLOWER
    expect_lines(c, "n1 steps down at term 1: it is no longer a voter", "received TimeoutNow from n1")
    golden(c, "confchange_remove_leader")


def test_replace_a_dead_follower() -> None:
    """The `group replace-node` story: n3's machine is gone; n4 joins empty, catches up from a snapshot (the log
    before it is compacted), is promoted, and n3 is removed. Writes keep committing throughout."""
    c = Cluster(3, seed=16)
    elect(c, "n1")
    for k in range(6):
        c.propose("n1", [f"w{k}".encode() * 50])
    settle(c)
    c.crash("n3")
    c.compact("n1", c.nodes["n1"].applied)
    c.compact("n2", c.nodes["n2"].applied)
    c.add_node("n4")
    c.change("n1", ConfChange(ADD, "n4"))
    settle(c)
    assert any("installed snapshot" in line for line in c.transcript)
    w = c.propose("n1", [b"during"])
    settle(c)
    assert committed_everywhere(c, w.first_index, ["n1", "n2", "n4"])
    c.change("n1", ConfChange(PROMOTE, "n4"))
    settle(c)
    p = c.change("n1", ConfChange(REMOVE, "n3"))
    settle(c)
    assert committed_everywhere(c, p.first_index, ["n1", "n2", "n4"])
    # n4 restarts: its configuration comes back from the snapshot it installed plus its log.
    c.crash("n4")
    c.restart("n4")
    assert c.nodes["n4"].core.configuration == Configuration(("n1", "n2", "n4"))
    # The group now survives losing any one of n1, n2, n4.
    c.crash("n1")
    c.run_until(lambda: c.leader() in ("n2", "n4"))
    q = c.propose(c.leader(), [b"after"])
    settle(c)
    assert committed_everywhere(c, q.first_index, ["n2", "n4"])
    golden(c, "confchange_replace_dead_follower")


def test_grow_three_to_five_and_back() -> None:
    c = Cluster(3, seed=17)
    elect(c, "n1")
    for nid in ("n4", "n5"):
        c.add_node(nid)
        c.change("n1", ConfChange(ADD, nid))
        settle(c)
        c.change("n1", ConfChange(PROMOTE, nid))
        settle(c)
    assert c.nodes["n1"].core.configuration.voters == ("n1", "n2", "n3", "n4", "n5")
    # Five voters: two may fail.
    c.crash("n2")
    c.crash("n3")
    p = c.propose("n1", [b"five"])
    settle(c)
    assert committed_everywhere(c, p.first_index, ["n1", "n4", "n5"])
    c.restart("n2")
    c.restart("n3")
    settle(c, 60)
    for nid in ("n4", "n5"):
        c.change(c.leader(), ConfChange(REMOVE, nid))
        settle(c)
    leader = c.leader()
    assert c.nodes[leader].core.configuration == Configuration(("n1", "n2", "n3"))
    q = c.propose(leader, [b"three"])
    settle(c)
    assert committed_everywhere(c, q.first_index, ["n1", "n2", "n3"])


def test_a_truncated_config_entry_takes_its_configuration_with_it() -> None:
    """A deposed leader's uncommitted change is overwritten by the new leader: the follower that had appended it
    goes back to the configuration before it (thesis §4.1: a configuration is in effect while in the log)."""
    c = Cluster(3, seed=18)
    elect(c, "n1")
    c.add_node("n4")
    c.cut("n1", "n3")
    c.drop_next(lambda m: isinstance(m, AppendEntries) and m.dst == "n2" and bool(m.frames))
    c.change("n1", ConfChange(ADD, "n4"))
    c.deliver_all()
    c.isolate("n1")
    # n2 lacks the change; only n1 (isolated) has it. n2 or n3 wins term 2 and overwrites it.
    c.run_until(lambda: c.leader() in ("n2", "n3"))
    settle(c)
    c.heal()
    settle(c, 80)
    assert c.nodes["n1"].core.configuration == Configuration(("n1", "n2", "n3"))
    assert c.nodes["n1"].core.role is Role.FOLLOWER
    expect_lines(
        c, "n1 uses configuration voters n1,n2,n3 learners n4", "n1 uses configuration voters n1,n2,n3 ("
    )


def test_a_removed_voter_that_alone_holds_its_removal_still_campaigns() -> None:
    """Thesis §4.2.2: until the entry removing it commits, a removed voter may still be needed. Here n1 is the
    only node holding 'remove n1'; n2 cannot win (n1's log is more up to date), so n1 campaigns, wins with n2's
    vote alone (its own does not count), commits its removal, then steps down and hands over to n2."""
    c = Cluster(3, seed=19)
    elect(c, "n1")
    c.change("n1", ConfChange(REMOVE, "n3"))
    settle(c)
    c.change("n1", ConfChange(REMOVE, "n1"))
    c.drop_where(lambda m: m.src == "n1")  # n2 never hears of it
    c.crash("n1")
    c.restart("n1")
    c.heal()
    c.run_until(lambda: c.leader() == "n2" and c.nodes["n2"].core.configuration.voters == ("n2",))
    settle(c)
    q = c.propose("n2", [b"alone"])
    settle(c)
    assert c.nodes["n2"].core.commit_index >= q.first_index
    expect_lines(
        c,
        "n1 became candidate",
        "n1 became leader",
        "n1 steps down",
        "n2 became leader",
    )
    golden(c, "confchange_removed_voter_still_needed")
