"""``RaftConfig.check_quorum_periods`` (the node runtime runs with 2, dledger/runtime/node.py; docs/raft.md): a
leader steps down only after that many election-minimum periods in a row without hearing from a quorum, so a
pause of every follower shorter than two periods (a shared disk's fdatasync stall) is not an election. The unit
tests pin the rule; the schedules rerun the safety property test's random schedules (tests/property/
test_raft_safety.py) with the runtime's settings, derandomized, with every invariant checked at each step."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from dledger.core.config import RaftConfig
from dledger.core.messages import HeartbeatResponse, Role
from dledger.errors import ConfigError
from tests.core.test_raft import elect, make
from tests.property.test_raft_safety import RaftSchedule, run_variant

PERIOD = RaftConfig().election_ticks[0]


def _tick(core, n: int, answer: bool = False) -> None:
    for _ in range(n):  # an answer is stepped before the tick, so it falls in the period that tick closes
        if answer:
            core.step(HeartbeatResponse(core.term, "n2", "n1"))
        core.tick()


def test_a_leader_steps_down_only_after_two_silent_periods_in_a_row() -> None:
    core = make(config=RaftConfig(check_quorum_periods=2))
    elect(core)
    _tick(core, PERIOD)
    assert core.role is Role.LEADER, "one silent period is not enough"
    _tick(core, PERIOD)
    assert core.role is Role.FOLLOWER and core.term == 1


def test_a_quorum_heard_between_two_silent_periods_starts_the_count_again() -> None:
    core = make(config=RaftConfig(check_quorum_periods=2))
    elect(core)
    for _ in range(4):  # silent, heard, silent, heard ...: never two silent periods in a row
        _tick(core, PERIOD)
        _tick(core, PERIOD, answer=True)
    assert core.role is Role.LEADER
    _tick(core, 2 * PERIOD)
    assert core.role is Role.FOLLOWER


def test_the_default_is_the_thesis_rule_of_one_period() -> None:
    core = make(config=RaftConfig())
    elect(core)
    _tick(core, PERIOD)
    assert core.role is Role.FOLLOWER


@pytest.mark.parametrize("bad", [0, 11, -1, True, 1.5, "2"])
def test_bad_periods_are_refused_with_the_setting_named(bad) -> None:
    with pytest.raises(ConfigError, match="check_quorum_periods"):
        RaftConfig(check_quorum_periods=bad)


class RuntimeSettingsSchedule(RaftSchedule):
    """The safety schedules with the node runtime's settings."""

    config_overrides: ClassVar[dict[str, Any]] = {"commit_at_tick": True, "check_quorum_periods": 2}


def test_schedules_with_the_runtime_settings() -> None:
    run_variant(RuntimeSettingsSchedule)
