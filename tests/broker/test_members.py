"""``PullingMembers`` (broker_adapter/members.py): who pulled for a consumer group lately, bounded, and checked."""

from __future__ import annotations

import pytest

from broker_adapter import members
from broker_adapter.members import PullingMembers
from dledger.errors import InvalidRequestError


def test_a_member_is_listed_while_it_pulls_and_gone_after_the_ttl():
    now = [100.0]
    m = PullingMembers(clock=lambda: now[0])
    m.pulled("g1", "host@1#a")
    m.pulled("g1", "host@2#b")
    m.pulled("g2", "host@1#a")
    m.pulled("", "")  # an anonymous read: nobody's member
    assert m.of("g1") == ["host@1#a", "host@2#b"] and m.of("g2") == ["host@1#a"] and m.of("g3") == []
    now[0] += members.MEMBER_TTL_S - 1
    m.pulled("g1", "host@2#b")
    now[0] += 2
    assert m.of("g1") == ["host@2#b"], "the one that kept pulling stays; the other is gone"


def test_the_table_is_bounded_by_forgetting_the_least_recently_seen(monkeypatch):
    monkeypatch.setattr(members, "MAX_MEMBERS", 3)
    m = PullingMembers(clock=lambda: 0.0)
    for cid in ("a", "b", "c"):
        m.pulled("g", cid)
    m.pulled("g", "a")  # seen again: the least recently seen is now b
    m.pulled("g", "d")
    assert m.of("g") == ["a", "c", "d"]


@pytest.mark.parametrize(
    "group, client_id, why",
    [
        ("g", "", "both its consumer_group and its client_id"),
        ("", "c", "both its consumer_group and its client_id"),
        ("no spaces", "c", "invalid consumer group"),
        ("g", "x" * 257, "at most 256"),
    ],
)
def test_a_bad_pull_is_refused_naming_what_is_wrong(group, client_id, why):
    with pytest.raises(InvalidRequestError, match=why):
        PullingMembers().pulled(group, client_id)
