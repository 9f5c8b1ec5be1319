"""The proxy forwards both directions, blocks (discards) per direction and message direction, delays, resets,
and closes connections that lost bytes once healed. An echo server stands in for a node."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

import pytest

from dledger.chaos.proxy import LinkSpec, Network
from dledger.group import free_ports


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def net(echo):
    p1, p2 = free_ports(2)
    # a -> b goes to the echo server; so does b -> a (only a->b is exercised by connections)
    n = Network([LinkSpec("a", "b", p1, echo), LinkSpec("b", "a", p2, echo)], seed=3)
    n.start()
    yield n
    n.stop()


def _connect(net: Network) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", net.links[("a", "b")].spec.port), timeout=5)
    s.settimeout(5)
    return s


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _closed(s: socket.socket) -> bool:
    """True once the peer closed or reset the connection (recv gets EOF or ECONNRESET)."""
    try:
        return s.recv(10) == b""
    except ConnectionResetError:
        return True


def _poll(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_forwards_both_ways(net):
    with _connect(net) as s:
        payload = bytes(range(256)) * 1000
        s.sendall(payload)
        assert _recv_exactly(s, len(payload)) == payload
    assert net.stats()["bytes_forwarded"] >= 2 * len(payload)


def test_delayed_bytes_arrive_in_order(net):
    net.delay("a", "b", 0.05)
    with _connect(net) as s:
        for i in range(20):
            s.sendall(f"{i:04d}".encode())
        assert _recv_exactly(s, 80) == b"".join(f"{i:04d}".encode() for i in range(20))


def test_block_discards_then_heal_closes_the_tainted_connection(net):
    with _connect(net) as s:
        net.block("a", "b")  # a's requests to b are lost
        s.sendall(b"lost")
        assert _poll(lambda: net.stats()["bytes_discarded"] >= 4)
        net.heal()
        assert _closed(s)  # closed by the heal, never the lost bytes
    with _connect(net) as s:  # a fresh connection works again
        s.sendall(b"again")
        assert _recv_exactly(s, 5) == b"again"


def test_block_of_the_reverse_direction_drops_answers(net):
    # messages from b to a travel as answers on link a->b: blocking b->a must swallow them
    net.block("b", "a")
    with _connect(net) as s:
        s.sendall(b"ping")
        assert _poll(lambda: net.stats()["bytes_discarded"] >= 4)
        assert net.links[("a", "b")].fwd.blocked is False
        assert net.links[("a", "b")].bwd.blocked is True


def test_partition_cuts_only_pairs_on_different_sides(net):
    assert net.partition([["a"], ["b"]]) == [("a", "b"), ("b", "a")]
    net.heal()
    assert net.partition([["a", "b"]]) == []


def test_reset_probability_one_breaks_the_connection(net):
    net.loss("a", "b", 1.0)
    with _connect(net) as s:
        s.sendall(b"x")
        assert _closed(s)
    assert net.stats()["resets"] >= 1


def test_destination_down_refuses(echo):
    (p1,) = free_ports(1)
    (dead,) = free_ports(1)
    with Network([LinkSpec("a", "b", p1, f"127.0.0.1:{dead}")]) as net, _connect(net) as s:
        assert _closed(s)


def test_a_new_members_links_listen_and_a_partition_cuts_only_linked_pairs(net, echo):
    """A node that joined (``Network.add_links``) is reachable through its links at once; a partition across
    it and a node that left before it joined (no link between them) cuts only the pairs that have one."""
    p3, p4 = free_ports(2)
    net.add_links([LinkSpec("c", "a", p3, echo), LinkSpec("a", "c", p4, echo)])
    s = socket.create_connection(("127.0.0.1", p3), timeout=5)
    s.settimeout(5)
    s.sendall(b"joined")
    assert _recv_exactly(s, 6) == b"joined"
    s.close()
    cut = net.partition([["a"], ["b", "c"]])
    assert sorted(cut) == [("a", "b"), ("a", "c"), ("b", "a"), ("c", "a")]  # nothing between b and c
    net.heal()
