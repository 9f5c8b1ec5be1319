"""Ports for the nodes of local groups on 127.0.0.1: taken below the kernel's ephemeral range, walked in turn
so that groups started side by side never share one (``free_ports``: what ``dledger group up --base-port 0`` takes, README.md).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path
from typing import Final

from dledger.errors import ConfigError

LISTEN_PORTS_FROM: Final = 20000  # free_ports picks from here up to the kernel's ephemeral range
# "LOW-HIGH": where free_ports picks instead (HIGH excluded), inherited by child processes: processes that start
# groups side by side on one machine (a test suite's workers, which kill and restart nodes on their ports) each
# get a range of their own, so one never takes a port another's stopped node is about to bind again.
PORTS_ENV: Final = "DLEDGER_LISTEN_PORTS"


def _ephemeral_low() -> int:
    """Where the kernel's range for the local ports of outgoing connections starts (``ip_local_port_range``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Where this process's next free_ports call starts looking. Ports handed out are not bound until a node starts,
# so independent draws (a sample per call) gave the same port to two groups of one cluster; a walk through the
# room gives distinct ports until it has gone all the way round, as the kernel's own choice did, and each
# process starts it at a random place, away from other processes' walks.
_cursor = itertools.count(random.randrange(1 << 16))


def listen_room() -> range:
    """The ports ``free_ports`` walks: ``DLEDGER_LISTEN_PORTS`` when set, else ``LISTEN_PORTS_FROM`` up to the
    kernel's ephemeral range."""
    spec = os.environ.get(PORTS_ENV)
    if not spec:
        return range(LISTEN_PORTS_FROM, _ephemeral_low())
    low, _, high = spec.partition("-")
    try:
        room = range(int(low), int(high))
    except ValueError:
        room = range(0)
    if not room or room.start < 1 or room.stop > 65536:
        raise ConfigError(f"{PORTS_ENV} must be LOW-HIGH with 0 < LOW < HIGH <= 65536, got {spec!r}")
    return room


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago on 127.0.0.1, each bound (and let go) here to be sure.

    They are taken below the kernel's ephemeral range: a port the OS would pick for ``bind(0)`` is one it may
    also give any outgoing connection as its local port, and on a busy machine one did, between this call and
    the node's bind ("Failed to bind to address"). Ports from ``LISTEN_PORTS_FROM`` up are tried in turn
    (``_cursor``; ``listen_room``); where the ephemeral range leaves no room below it, the OS picks."""
    room = listen_room()
    # taken one at a time, only while more are needed: the cursor moves past the ports tried, no further
    candidates = (room[next(_cursor) % len(room)] for _ in range(min(len(room), n + 64)))
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            port = next(candidates, None)
            if port is None:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use (or in TIME_WAIT: passed over, it will be free later)
                s.close()
                continue
            socks.append(s)
            ports.append(port)
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports
