"""The security step of ``make demo`` (docs/security.md): a secure group refusing what it should, briefly.

Starts a three-node broker group with ``--secure`` in ``group_dir``, adds a user allowed to publish to one topic,
and shows: its signed send acknowledged; the same user on another topic, a wrong secret and a plaintext client
refused; a node's certificate presented under another node id refused, with the node's log line. Always stops
the group. It speaks to the broker through its generated stubs only; it lives with the broker, whose demo it ends.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from rich.console import Console

from broker_adapter.v1 import broker_pb2, broker_pb2_grpc
from dledger import group as grp
from dledger.errors import DLedgerError
from dledger.security import tls
from dledger.security.client import SecurityClient
from dledger.security.config import ClientSecurity
from dledger.transport.grpc import run_sync
from dledger.v1 import raft_pb2, raft_pb2_grpc

USER = ("alice", "alice-demo-secret")


def _send(address: str, credentials, topic: str) -> str:
    ch = (
        grpc.secure_channel(address, credentials)
        if credentials is not None
        else grpc.insecure_channel(address)
    )
    try:
        req = broker_pb2.SendRequest(topic=topic, messages=[broker_pb2.OutgoingMessage(body=b"hello")])
        r = broker_pb2_grpc.BrokerStub(ch).Send(req, timeout=5)
        return (
            f"[green]acknowledged[/green] at queue {r.results[0].queue_id} offset {r.results[0].queue_offset}"
        )
    except grpc.RpcError as e:
        return f"[red]{e.code().name}[/red]: {(e.details() or '')[:110]}"
    finally:
        ch.close()


def run(group_dir: Path, console: Console) -> int:
    console.rule(
        "[bold]security: TLS, signed clients, permissions in the log, peers that prove their node id"
    )
    g = grp.create(Path(group_dir), 3, None, state_machine="broker", secure=True)
    try:
        for spec in g.nodes:
            grp.start_node(spec)
        leader = grp.wait_for_leader(g)
        admin = ClientSecurity.from_file(Path(g.security))
        console.print(
            f"secure group up (leader {leader.id}); certificates and the bootstrap admin in {group_dir}"
        )

        async def setup() -> None:
            sc = SecurityClient(g.addresses, admin)
            try:
                await sc.call(
                    "AddUser",
                    {"access_key": USER[0], "secret_key": USER[1], "permissions": ["publish:orders"]},
                )
            finally:
                await sc.close()

        ch = grpc.secure_channel(leader.address, tls.client_channel_credentials(admin))
        try:
            stub = broker_pb2_grpc.BrokerStub(ch)
            for topic in ("orders", "payments"):
                stub.CreateTopic(broker_pb2.CreateTopicRequest(topic=topic, queues=2), timeout=10)
        finally:
            ch.close()
        run_sync(setup())
        console.print("user alice may publish to 'orders' (dledger user add, a log entry every node applies)")
        ca = admin.ca_file
        alice = tls.client_channel_credentials(ClientSecurity(ca, *USER))
        wrong = tls.client_channel_credentials(ClientSecurity(ca, USER[0], "not-her-secret"))
        for what, creds, topic in (
            ("alice -> orders", alice, "orders"),
            ("alice -> payments", alice, "payments"),
            ("alice, wrong secret", wrong, "orders"),
            ("plaintext client", None, "orders"),
        ):
            console.print(f"  {what:<22} {_send(leader.address, creds, topic)}")
        tls_dir = ca.parent
        cert, key = (tls_dir / "n1.pem").read_bytes(), (tls_dir / "n1.key").read_bytes()
        target = g.node("n0")
        ch = grpc.secure_channel(
            target.address, tls.peer_channel_credentials(g.name, "n2", cert, key, ca.read_bytes())
        )
        try:
            raft_pb2_grpc.RaftPeerStub(ch).Vote(
                raft_pb2.VoteRequest(group=g.name, src="n2", dst="n0"), timeout=10, wait_for_ready=True
            )  # waits out a connection not yet up (a loaded machine): the refusal is the node's, not the network's
            console.print("[red]n1's certificate was accepted as n2[/red]")
            return 1
        except grpc.RpcError as e:
            console.print(f"  {'n1 cert claiming n2':<22} [red]{e.code().name}[/red]")
        finally:
            ch.close()
        lines = [
            line
            for line in (Path(target.data_dir) / "node.log").read_text().splitlines()
            if "claiming to be" in line
        ]
        console.print(
            f"  n0's log: {lines[-1].split(' dledger.security: ', 1)[-1] if lines else '(no line)'}"
        )
        return 0
    except DLedgerError as e:
        console.print(f"[red]security demo failed:[/red] {e}")
        return 1
    finally:
        console.print(f"stopped {', '.join(grp.stop_group(g))}")
