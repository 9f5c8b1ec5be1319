"""``dledger.security.tls.hold_event_engine``: closing a channel that carries our Python call credentials does not
shut gRPC's event engine down. A close that does holds the GIL while it waits for the engine's threads, and one
of them may need the GIL to release the plugin: the whole process froze (grpc/grpc PR 42247; a CI run hung so).

Observable from outside: an engine shut down and started again runs new threads. A client process that opens
and closes such channels one after another saw 47-57 distinct engine threads in 20 closes without the holder
(the engine restarted every close or two), 4 with it."""

from __future__ import annotations

import socket
import subprocess
import sys

CLIENT = """
import os, sys
import grpc
from dledger.security import certs, tls

ca = certs.make_ca()
node = certs.make_node_cert(ca, "n0", group="g1")

def engine_threads():
    tids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "event_engine":
                    tids.add(tid)
        except OSError:  # ended meanwhile
            pass
    return tids

first, seen = None, set()
for _ in range(20):
    creds = tls.peer_channel_credentials("g1", "n0", node.cert_pem, node.key_pem, ca.cert_pem)
    with grpc.secure_channel(sys.argv[1], creds) as ch:
        try:
            ch.unary_unary("/test.Nothing/Here")(b"", timeout=2)
        except grpc.RpcError:  # nothing listens there: the call fails, its credentials were asked for or not
            pass
    now = engine_threads()
    first = first or now
    seen |= now
print(len(first), len(seen))
"""


def test_closing_channels_with_call_credentials_leaves_the_event_engine_running() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    # A process of its own: no server or other channel there keeps the engine alive.
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, address], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    first, seen = map(int, done.stdout.split())
    assert first > 0, "no event_engine thread found: gRPC names its threads otherwise now"
    assert seen <= 2 * first, f"{seen} engine threads in 20 closes (first {first}): the engine restarted"
