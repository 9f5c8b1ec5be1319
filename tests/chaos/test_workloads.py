"""The chaos runner finds its workloads through entry points (``dledger.chaos_workloads``), not imports."""

from __future__ import annotations

import pytest

from dledger.chaos.workload import Workload, load_workload, workload_names


def test_the_builtin_workloads_are_registered():
    assert {"broker", "kv"} <= set(workload_names())
    for name, state_machine in (("broker", "broker"), ("kv", "kv")):
        factory = load_workload(name)
        assert issubclass(factory, Workload) and factory.state_machine == state_machine
        assert factory.progress, "a workload names the operations that show progress"


def test_an_unknown_workload_names_the_installed_ones():
    with pytest.raises(ValueError, match=r"unknown workload 'meteor'; installed: .*broker.*kv"):
        load_workload("meteor")
