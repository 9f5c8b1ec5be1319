"""Membership rules at the unit level (docs/decisions/0017-membership.md); the stories are in
tests/sim/test_membership.py, the random schedules in tests/property/test_raft_safety.py."""

from __future__ import annotations

import itertools
import random

import pytest

from dledger.core.membership import (
    ConfChange,
    ConfChangeKind,
    ConfCheckpoint,
    Configuration,
    ConfigurationError,
    majorities_overlap,
)
from dledger.core.messages import HeartbeatResponse, Role
from dledger.core.raft import RaftCore
from dledger.errors import InvalidRequestError
from storage import codec
from storage.api import HardState
from storage.memory import MemoryLogStore
from tests.core.test_raft import BASIC, drain, elect

C3 = Configuration(("n1", "n2", "n3"))


def test_changes_apply_one_member_at_a_time_with_reasons() -> None:
    c = C3.apply(ConfChange(ConfChangeKind.ADD_LEARNER, "n4"))
    assert c == Configuration(("n1", "n2", "n3"), ("n4",))
    assert c.apply(ConfChange(ConfChangeKind.PROMOTE, "n4")) == Configuration(("n1", "n2", "n3", "n4"))
    assert c.apply(ConfChange(ConfChangeKind.REMOVE, "n4")) == C3
    assert C3.apply(ConfChange(ConfChangeKind.REMOVE, "n1")) == Configuration(("n2", "n3"))
    for change, why in [
        (ConfChange(ConfChangeKind.ADD_LEARNER, "n1"), "already a voter"),
        (ConfChange(ConfChangeKind.ADD_VOTER, "n4"), "promote it instead"),
        (ConfChange(ConfChangeKind.PROMOTE, "n1"), "already a voter"),
        (ConfChange(ConfChangeKind.PROMOTE, "n9"), "not a member"),
        (ConfChange(ConfChangeKind.REMOVE, "n9"), "not a member"),
    ]:
        with pytest.raises(InvalidRequestError, match=why):
            c.apply(change)
    with pytest.raises(InvalidRequestError, match="last voter"):
        Configuration(("n1",)).apply(ConfChange(ConfChangeKind.REMOVE, "n1"))
    with pytest.raises(InvalidRequestError, match="twice"):
        Configuration(("n1",), ("n1",))


def test_config_entry_body_round_trips_and_bad_bodies_are_named() -> None:
    c = Configuration(("n1", "n2"), ("n3",))
    assert Configuration.decode(c.encode()) == c
    # Addresses travel with the members: added with them, kept on promotion, dropped on removal.
    a = Configuration.of(["n1"], addresses={"n1": "h:1", "x": "h:9"})
    assert a.addresses == (("n1", "h:1"),)
    b = a.apply(ConfChange(ConfChangeKind.ADD_LEARNER, "n2", "h:2"))
    assert Configuration.decode(b.encode()) == b and b.address("n2") == "h:2"
    assert b.apply(ConfChange(ConfChangeKind.PROMOTE, "n2")).address("n2") == "h:2"
    assert b.apply(ConfChange(ConfChangeKind.REMOVE, "n2")).address("n2") is None
    with pytest.raises(InvalidRequestError, match="member n1 listens there"):
        a.apply(ConfChange(ConfChangeKind.ADD_LEARNER, "n2", "h:1"))
    for bad in (
        b"",
        b"{}",
        b"[1]",
        b'{"format":2,"voters":[],"learners":[]}',
        b'{"format":1,"voters":"x","learners":[]}',
    ):
        with pytest.raises(ConfigurationError):
            Configuration.decode(bad)


def test_single_server_changes_keep_majorities_overlapping_and_two_at_once_do_not() -> None:
    """The reason for one change at a time (thesis §4.1), checked exhaustively over small groups."""
    nodes = ["a", "b", "c", "d", "e", "f"]
    for n in range(1, 6):
        for voters in itertools.combinations(nodes, n):
            old = Configuration(voters)
            for x in nodes:
                kind = ConfChangeKind.REMOVE if x in voters else ConfChangeKind.ADD_VOTER
                if kind is ConfChangeKind.REMOVE and n == 1:
                    continue
                assert majorities_overlap(old, old.apply(ConfChange(kind, x)))
    # Adding two voters at once to {a, b, c}: {a, b} and {c, d, e} are majorities of the old and the new, disjoint.
    assert not majorities_overlap(Configuration(("a", "b", "c")), Configuration(("a", "b", "c", "d", "e")))


def test_learners_neither_count_for_commit_nor_for_read_index() -> None:
    store = MemoryLogStore()
    core = RaftCore(
        "n1",
        ["n1", "n2", "n3"],
        store,
        HardState(),
        BASIC,
        random.Random(1),
        log_event=lambda s: None,
        conf=Configuration(("n1", "n2", "n3"), ("n4",)),
    )
    out = elect(core, store)
    assert {m.dst for m in out} == {"n2", "n3", "n4"}  # the learner gets the log
    from dledger.core.messages import AppendEntriesResponse

    core.step(AppendEntriesResponse(core.term, "n4", "n1", True, match_index=core.last_index))
    assert core.commit_index < core.last_index, "a learner's copy does not commit"
    core.step(AppendEntriesResponse(core.term, "n2", "n1", True, match_index=core.last_index))
    assert core.commit_index == core.last_index
    drain(core, store)
    core.read_index(7)
    drain(core, store)
    core.step(HeartbeatResponse(core.term, "n4", "n1", context=1))
    assert drain(core, store) == [] and not core.has_ready(), "a learner's ack confirms no read"
    core.step(HeartbeatResponse(core.term, "n3", "n1", context=1))
    rd = core.ready()
    assert rd.read_states == ((7, core.commit_index),)


def test_configuration_is_recomputed_from_the_log_at_start() -> None:
    store = MemoryLogStore()
    core = RaftCore("n1", ["n1"], store, HardState(), BASIC, random.Random(1), log_event=lambda s: None)
    while core.role is not Role.LEADER:
        core.tick()
    drain(core, store)
    core.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, "n2"))
    drain(core, store)
    core.propose([b"x"])
    drain(core, store)
    again = RaftCore(
        "n1", ["n1"], store, HardState(core.term, "n1"), BASIC, random.Random(1), log_event=lambda s: None
    )
    assert again.configuration == Configuration(("n1",), ("n2",))
    assert again.status().learners == ("n2",) and again.status().conf_index == 1


class _ReadsCounted(MemoryLogStore):
    """A store that records the lowest index any read asked for."""

    lowest: int | None = None

    def _saw(self, lo: int) -> None:
        self.lowest = lo if self.lowest is None else min(self.lowest, lo)

    def raw(self, lo: int, hi: int, max_bytes: int | None = None) -> bytes:
        self._saw(lo)
        return super().raw(lo, hi, max_bytes)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[codec.Entry]:
        self._saw(lo)
        return super().entries(lo, hi, max_bytes)

    def term(self, index: int) -> int:
        self._saw(index)
        return super().term(index)


def _log_with_two_changes() -> tuple[RaftCore, _ReadsCounted]:
    """A one-node leader's log: a learner added at index 1, 40 entries, a second learner at 42, 40 entries."""
    store = _ReadsCounted()
    core = RaftCore("n1", ["n1"], store, HardState(), BASIC, random.Random(1), log_event=lambda s: None)
    while core.role is not Role.LEADER:
        core.tick()
    drain(core, store)
    for learner in ("n2", "n3"):
        core.propose_conf_change(ConfChange(ConfChangeKind.ADD_LEARNER, learner))
        drain(core, store)
        for _ in range(40):
            core.propose([b"x"])
        drain(core, store)
    return core, store


def test_a_restart_reads_config_entries_only_after_the_checkpoint_and_finds_the_same() -> None:
    core, store = _log_with_two_changes()
    assert core.status().conf_index == 42 and store.last_index == 82
    full = RaftCore("n1", ["n1"], store, HardState(core.term, "n1"), BASIC, random.Random(1))
    for at in (30, 42, 60):  # between the changes, on the second, after both
        h = store.entry(at).header
        cp = core.raft_log.conf_checkpoint(at, h.term, h.chain_crc)
        assert [i for i, _ in cp.confs] == [i for i in (-1, 1, 42) if i <= at]
        store.lowest = None
        again = RaftCore(
            "n1",
            ["n1"],
            store,
            HardState(core.term, "n1"),
            BASIC,
            random.Random(1),
            conf_checkpoint=ConfCheckpoint.decode(cp.encode()),
        )
        # The checkpoint's own entry (the log still holds it?) and nothing before it.
        assert store.lowest == at
        assert again.configuration == full.configuration == Configuration(("n1",), ("n2", "n3"))
        assert again.status().conf_index == 42
        for i in range(-1, 83):
            assert again.configuration_at(i) == full.configuration_at(i), i


def test_a_checkpoint_the_log_does_not_hold_is_ignored() -> None:
    core, store = _log_with_two_changes()
    h = store.entry(30).header
    stale = [
        ConfCheckpoint(30, h.term + 1, h.chain_crc, ((-1, Configuration(("n1",))),)),  # another term there
        ConfCheckpoint(30, h.term, h.chain_crc ^ 1, ((-1, Configuration(("n1",))),)),  # another chain
        ConfCheckpoint(500, h.term, h.chain_crc, ((-1, Configuration(("n1",))),)),  # past the log's end
    ]
    for cp in stale:
        store.lowest = None
        again = RaftCore(
            "n1", ["n1"], store, HardState(core.term, "n1"), BASIC, random.Random(1), conf_checkpoint=cp
        )
        assert store.lowest == 0  # the whole log was read
        assert again.configuration == Configuration(("n1",), ("n2", "n3")) and again.status().conf_index == 42


def test_config_entries_go_through_propose_conf_change_only() -> None:
    store = MemoryLogStore()
    core = RaftCore("n1", ["n1"], store, HardState(), BASIC, random.Random(1), log_event=lambda s: None)
    while core.role is not Role.LEADER:
        core.tick()
    with pytest.raises(InvalidRequestError, match="propose_conf_change"):
        core.propose([Configuration(("n1", "n2")).encode()], magic=codec.MAGIC_CONFIG)
