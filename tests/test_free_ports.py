"""``dledger.ports.free_ports``: ports for a local group's nodes, taken where no outgoing connection can take them
first (below the kernel's ephemeral range), each one free when it was chosen."""

from __future__ import annotations

import socket

import pytest

from dledger import ports as local_ports
from dledger.errors import ConfigError


@pytest.fixture(autouse=True)
def _whole_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the default room (the suite gives each xdist worker a range of its own)."""
    monkeypatch.delenv(local_ports.PORTS_ENV, raising=False)


def test_ports_are_distinct_below_the_ephemeral_range_and_free() -> None:
    low = local_ports._ephemeral_low()
    ports = local_ports.free_ports(24)
    assert len(set(ports)) == 24
    assert all(local_ports.LISTEN_PORTS_FROM <= p < low for p in ports), ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # the only room below the "ephemeral range" is the port in use and the one after it
        monkeypatch.setattr(local_ports, "LISTEN_PORTS_FROM", port)
        monkeypatch.setattr(local_ports, "_ephemeral_low", lambda: port + 2)
        (got,) = local_ports.free_ports(1)  # port + 1, or the OS's pick if that one is busy too
        assert got != port


def test_without_room_below_the_ephemeral_range_the_os_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_ports, "_ephemeral_low", lambda: local_ports.LISTEN_PORTS_FROM)
    ports = local_ports.free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


def test_calls_in_a_row_hand_out_distinct_ports() -> None:
    """Ports are not bound until a node starts: a cluster's groups, each given its ports by a call of its own,
    must not be given the same one."""
    ports = [p for _ in range(300) for p in local_ports.free_ports(3)]
    assert len(set(ports)) == len(ports)


def test_a_range_of_ones_own_is_walked_and_a_bad_one_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(local_ports.PORTS_ENV, "21000-21100")
    ports = [p for _ in range(20) for p in local_ports.free_ports(3)]
    assert len(set(ports)) == len(ports) and all(21000 <= p < 21100 for p in ports), ports
    for bad in ("21100-21000", "x-y", "0-10", "100"):
        monkeypatch.setenv(local_ports.PORTS_ENV, bad)
        with pytest.raises(ConfigError, match="DLEDGER_LISTEN_PORTS"):
            local_ports.free_ports(1)
