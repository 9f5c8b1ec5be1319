"""A secure group grows and heals (docs/security.md, "Adding a node"): `member add` issues the newcomer's
certificate from the group's CA, it catches up and is promoted, a dead node is replaced, and a removed node's
certificate stops working for the peers at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dledger import group as grp
from dledger import group_members as members
from dledger.kv.client import AsyncKVClient
from dledger.security import certs, tls
from dledger.security.config import ClientSecurity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_secure_group_adds_replaces_and_removes_nodes_without_losing_a_write(tmp_path):
    d = tmp_path / "g"
    g, _ = grp.up(d, 3, None, state_machine="kv", secure=True)
    admin = ClientSecurity.from_file(Path(g.security))
    try:

        async def put(addresses: list[str], keys: range) -> None:
            async with AsyncKVClient(addresses, security=admin, timeout_s=30) as kv:
                for i in keys:
                    await kv.put(f"k{i}".encode(), f"v{i}".encode())

        async def read_all(addresses: list[str], n: int) -> dict[int, bytes | None]:
            async with AsyncKVClient(addresses, security=admin, timeout_s=30) as kv:
                return {i: (await kv.get(f"k{i}".encode())).value for i in range(n)}

        asyncio.run(put(g.addresses, range(0, 100)))
        spec = members.add_member(d)  # a new node, its certificate issued from the group's CA
        assert (d / "tls" / f"{spec.id}.pem").exists()
        members.promote_member(d, spec.id, timeout_s=60)
        asyncio.run(put(grp.load(d).addresses, range(100, 200)))
        victim = g.nodes[1]
        assert grp.kill_node(victim) is not None  # its machine is gone
        r = members.replace_node(d, victim.id, timeout_s=90)
        asyncio.run(put(grp.load(d).addresses, range(200, 300)))
        final = grp.load(d)
        assert {n.id for n in final.nodes} == {"n0", "n2", spec.id, r.new}
        lead = grp.configuration(final)
        assert lead is not None and sorted(lead.voters) == sorted(n.id for n in final.nodes)
        got = asyncio.run(read_all(final.addresses, 300))
        assert got == {i: f"v{i}".encode() for i in range(300)}

        # The removed node's certificate and key still verify against the CA, but no member talks to it.
        tls_dir = d / "tls"
        proof = tls.PeerProofPlugin(
            g.name,
            victim.id,
            (tls_dir / f"{victim.id}.pem").read_bytes(),
            (tls_dir / f"{victim.id}.key").read_bytes(),
        ).metadata()
        verifier = tls.PeerVerifier(g.name, (tls_dir / "ca.pem").read_bytes(), lambda: lead.voters)
        with pytest.raises(tls.PeerIdentityError, match=f"node '{victim.id}' is not a member"):
            verifier.verify(proof)
    finally:
        grp.stop_group(grp.load(d))


def test_a_removed_member_is_refused_at_once_even_with_a_proof_verified_a_moment_ago():
    ca = certs.make_ca()
    n3 = certs.make_node_cert(ca, "n3")
    members = {"n0", "n1", "n2", "n3"}
    verifier = tls.PeerVerifier("g", ca.cert_pem, lambda: members)
    proof = tls.PeerProofPlugin("g", "n3", n3.cert_pem, n3.key_pem).metadata()
    assert verifier.verify(proof) == "n3"
    assert verifier.verify(proof) == "n3"  # the second time from the cache of verified proofs
    members.discard("n3")  # `member remove n3` reached this node's log
    with pytest.raises(tls.PeerIdentityError, match="not a member"):
        verifier.verify(proof)
