"""The pieces a secure name server checks with, in process: node proofs outside a group, certificates bound to
their group, and the name server's own files (docs/cluster.md, "Security"; real processes:
test_secure_cluster.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker_adapter.nameserver.guard import NameServerSecurity, read_users
from dledger.errors import ConfigError
from dledger.security import auth, certs, tls


@pytest.fixture(scope="module")
def ca():
    return certs.make_ca()


def _proof(issued: certs.Issued, group: str, node: str, when: str | None = None):
    """What a node's channel sends: PeerProofPlugin's metadata, or one dated ``when``."""
    if when is None:
        return tls.PeerProofPlugin(group, node, issued.cert_pem, issued.key_pem).metadata()
    key = serialization.load_pem_private_key(issued.key_pem, None)
    der = x509.load_pem_x509_certificate(issued.cert_pem).public_bytes(serialization.Encoding.DER)
    sig = key.sign(f"{group}|{node}|{when}".encode(), ec.ECDSA(hashes.SHA256()))
    return ((tls.NODE, node), (tls.NODE_CERT, der), (tls.NODE_SIG, sig), (auth.DATE_TIME, when))


def test_a_cluster_node_proves_its_group_and_node_id(ca):
    n0 = certs.make_node_cert(ca, "n0", group="g1")
    assert tls.NodeProofVerifier(ca.cert_pem).verify(_proof(n0, "g1", "n0")) == ("g1", "n0")


@pytest.mark.parametrize(
    "case, why",
    [
        ("no group in the certificate", "names no group"),
        ("signed for another group", "does not match"),
        ("another node id", "presented the certificate of node 'n0'"),
        ("another CA", "not issued by this group's CA"),
        ("stale", "outside the allowed clock skew"),
        ("a name server's certificate", "names no group"),
        ("no proof at all", "without a node proof"),
    ],
)
def test_bad_node_proofs_are_refused(ca, case, why):
    verifier = tls.NodeProofVerifier(ca.cert_pem)
    n0 = certs.make_node_cert(ca, "n0", group="g0")
    metadata = {
        "no group in the certificate": lambda: _proof(certs.make_node_cert(ca, "n0"), "g0", "n0"),
        "signed for another group": lambda: _proof(n0, "g1", "n0"),
        "another node id": lambda: _proof(n0, "g0", "n1"),
        "another CA": lambda: _proof(certs.make_node_cert(certs.make_ca(), "n0", group="g0"), "g0", "n0"),
        "stale": lambda: _proof(
            n0, "g0", "n0", auth.date_time(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
        ),
        "a name server's certificate": lambda: _proof(
            certs.make_service_cert(ca, "nameserver", "ns0"), "g0", "ns0"
        ),
        "no proof at all": lambda: auth.headers("admin", "secret"),
    }[case]()
    with pytest.raises(tls.PeerIdentityError, match=why):
        verifier.verify(metadata)


def test_a_group_refuses_a_peer_certificate_bound_to_another_group(ca):
    g0_n0 = certs.make_node_cert(ca, "n0", group="g0")
    g1_peers = tls.PeerVerifier("g1", ca.cert_pem, lambda: ("n0", "n1", "n2"))
    with pytest.raises(tls.PeerIdentityError, match="of group 'g0', not of this group \\('g1'\\)"):
        g1_peers.verify(_proof(g0_n0, "g1", "n0"))
    assert g1_peers.verify(_proof(certs.make_node_cert(ca, "n0", group="g1"), "g1", "n0")) == "n0"
    assert g1_peers.verify(_proof(certs.make_node_cert(ca, "n1"), "g1", "n1")) == "n1"  # unbound: as before


def test_the_name_servers_files_are_checked_with_messages_naming_them(tmp_path: Path):
    users = tmp_path / "users.toml"
    users.write_text('[[user]]\naccess_key = "alice"\nsecret_key = "s1"\n[[user]]\naccess_key = "bob"\n')
    with pytest.raises(ConfigError, match="#2 needs access_key and secret_key"):
        read_users(users)
    users.write_text("[[user]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_users(users)
    users.write_text('[[user]]\naccess_key = "alice"\nsecret_key = "s1"\n')
    assert read_users(users) == ({"alice": "s1"}, {"alice": frozenset()})
    admin = tmp_path / "admin.toml"
    admin.write_text('access_key = "admin"\nsecret_key = "s0"\n')
    missing = NameServerSecurity(tmp_path / "none.pem", tmp_path / "k", tmp_path / "ca", admin)
    with pytest.raises(ConfigError, match="--cert"):
        missing.load()
    for name in ("ns.pem", "ns.key", "ca.pem"):
        (tmp_path / name).write_bytes(b"x")
    sec = NameServerSecurity(tmp_path / "ns.pem", tmp_path / "ns.key", tmp_path / "ca.pem", admin, users)
    assert sec.load()[3:] == ({"alice": "s1", "admin": "s0"}, "admin", {"alice": frozenset()})


def test_a_users_file_names_the_consumer_groups_each_user_may_join(tmp_path: Path):
    users = tmp_path / "users.toml"
    users.write_text(
        '[[user]]\naccess_key = "alice"\nsecret_key = "s1"\nconsumer_groups = ["billing", "audit"]\n'
        '[[user]]\naccess_key = "ops"\nsecret_key = "s2"\nconsumer_groups = ["*"]\n'
        '[[user]]\naccess_key = "bob"\nsecret_key = "s3"\n'
    )
    secrets, groups = read_users(users)
    assert groups == {
        "alice": frozenset({"billing", "audit"}),
        "ops": frozenset({"*"}),
        "bob": frozenset(),  # none given: bob may ask routes, not join a consumer group
    }
    assert secrets == {"alice": "s1", "ops": "s2", "bob": "s3"}
    for bad in ('"billing"', "[1]", '[""]'):
        users.write_text(f'[[user]]\naccess_key = "alice"\nsecret_key = "s1"\nconsumer_groups = {bad}\n')
        with pytest.raises(ConfigError, match=r"#1 \(alice\): consumer_groups must be a list"):
            read_users(users)


def test_cluster_certs_issues_name_server_certificates_that_name_no_node(tmp_path):
    from typer.testing import CliRunner

    from broker_adapter.cluster.cli import cluster_app
    from dledger.security.identity import node_identity

    done = CliRunner().invoke(cluster_app, ["certs", "--dir", str(tmp_path), "--nameservers", "ns0, ns1"])
    assert done.exit_code == 0, done.output
    assert {p.name for p in tmp_path.iterdir()} == {
        "ca.pem",
        "ca.key",
        "ns0.pem",
        "ns0.key",
        "ns1.pem",
        "ns1.key",
    }
    cert = x509.load_pem_x509_certificate((tmp_path / "ns0.pem").read_bytes())
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    assert uris == ["dledger:nameserver:ns0"]
    assert node_identity(cert) is None
    with pytest.raises(ValueError, match="other than node and group"):
        certs.make_service_cert(certs.load_or_make_ca(tmp_path), "node", "n9")


def test_a_load_reads_the_users_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Secrets and consumer groups come from one reading of the file, so a reload never pairs two versions."""
    from broker_adapter.nameserver import guard

    users = tmp_path / "users.toml"
    users.write_text('[[user]]\naccess_key = "alice"\nsecret_key = "s1"\nconsumer_groups = ["billing"]\n')
    admin = tmp_path / "admin.toml"
    admin.write_text('access_key = "admin"\nsecret_key = "s0"\n')
    for name in ("ns.pem", "ns.key", "ca.pem"):
        (tmp_path / name).write_bytes(b"x")
    reads: list[Path] = []
    tables = guard._user_tables
    monkeypatch.setattr(guard, "_user_tables", lambda p: reads.append(p) or tables(p))
    sec = NameServerSecurity(tmp_path / "ns.pem", tmp_path / "ns.key", tmp_path / "ca.pem", admin, users)
    assert sec.load()[5] == {"alice": frozenset({"billing"})}
    assert reads == [users]
