"""Certificate reload and CA rotation without processes: what a reload refuses and keeps, what the verifiers trust
after it, and the three file steps of a rotation (dledger/security/rotation.py, certs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from dledger.errors import ConfigError
from dledger.security import certs, tls
from dledger.security.identity import node_group, node_identity
from dledger.security.rotation import Material, MaterialFiles, Reloadable, check_material
from dledger.security.users import CommandVerifier, encode, signer


def _files(d: Path, node: str = "n0") -> MaterialFiles:
    return MaterialFiles(d / f"{node}.pem", d / f"{node}.key", d / "ca.pem")


def _reloadable(d: Path, node: str = "n0") -> Reloadable:
    files = _files(d, node)
    return Reloadable(files.read, lambda m: check_material(m, files, node, "g"))


def test_a_reload_refuses_material_that_cannot_serve_naming_the_file_and_keeps_the_old(tmp_path):
    certs.write_group(tmp_path, ["n0", "n1"], clients=())
    r = _reloadable(tmp_path)
    seen: list[Material] = []
    r.on_reload(seen.append)
    before = r.material
    assert r.reload()["changed"] is False and not seen  # same files: nothing to do

    (tmp_path / "n0.key").write_bytes((tmp_path / "n1.key").read_bytes())  # half of a replacement
    with pytest.raises(ConfigError, match=r"n0\.key is not the key of the certificate"):
        r.reload()
    (tmp_path / "n0.pem").write_bytes((tmp_path / "n1.pem").read_bytes())  # another node's certificate
    with pytest.raises(ConfigError, match=r"names node 'n1', not this node \('n0'\)"):
        r.reload()
    other = certs.make_ca("another CA")
    stranger = certs.make_node_cert(other, "n0")
    certs.write_issued(tmp_path, "n0", stranger)
    with pytest.raises(ConfigError, match="was not issued by a CA of the bundle"):
        r.reload()
    (tmp_path / "ca.pem").write_bytes(b"not a certificate")
    with pytest.raises(ConfigError, match=r"ca\.pem: not a PEM CA bundle"):
        r.reload()
    (tmp_path / "ca.pem").write_bytes(before.ca_pem + stranger.cert_pem)
    with pytest.raises(ConfigError, match="is not a CA certificate"):
        r.reload()
    assert r.material == before and not seen  # every refusal left the material in use alone

    (tmp_path / "ca.pem").write_bytes(before.ca_pem + other.cert_pem)  # trusting the other CA too: it serves
    summary = r.reload()
    assert summary["changed"] and len(summary["cas"]) == 2 and "another CA" in summary["issuer"]
    assert seen == [r.material] and r.material.cert_pem == stranger.cert_pem


def test_verifiers_trust_what_the_bundle_holds_from_the_next_call_on(tmp_path):
    old, new = certs.make_ca("old"), certs.make_ca("new")
    n1_old, n1_new = certs.make_node_cert(old, "n1"), certs.make_node_cert(new, "n1")

    def proof(issued: certs.Issued) -> tls.Metadata:
        return tls.PeerProofPlugin("g", "n1", issued.cert_pem, issued.key_pem).metadata()

    verifier = tls.PeerVerifier("g", old.cert_pem, lambda: ("n0", "n1"))
    assert verifier.verify(proof(n1_old)) == "n1"
    with pytest.raises(tls.PeerIdentityError, match="not issued by this group's CA"):
        verifier.verify(proof(n1_new))
    verifier.set_ca(old.cert_pem + new.cert_pem)  # step 1: both
    assert verifier.verify(proof(n1_old)) == "n1" and verifier.verify(proof(n1_new)) == "n1"
    verifier.set_ca(new.cert_pem)  # step 3: the old one dropped, its cached proof forgotten too
    with pytest.raises(tls.PeerIdentityError, match="not issued by this group's CA"):
        verifier.verify(proof(n1_old))
    assert verifier.verify(proof(n1_new)) == "n1"

    # One plugin, updated in place: channels made before the reload send the new certificate's proof.
    plugin = tls.PeerProofPlugin("g", "n1", n1_old.cert_pem, n1_old.key_pem)
    plugin.update(n1_new.cert_pem, n1_new.key_pem)
    assert verifier.verify(plugin.metadata()) == "n1"

    # User commands: a node of the new CA signs; the verifier trusts it once the bundle was added, and never
    # forgets the old CA while it runs (a command's verdict must not depend on when a node reloaded).
    commands = CommandVerifier("g", old.cert_pem)
    der = x509.load_pem_x509_certificate(n1_new.cert_pem).public_bytes(serialization.Encoding.DER)
    signed = signer("g", n1_new.key_pem)(7, 0, encode(1, {"access_key": "a"}, der))
    assert not commands.verify(signed, 7)
    commands.add_ca(new.cert_pem)
    assert commands.verify(signed, 7)
    der_old = x509.load_pem_x509_certificate(n1_old.cert_pem).public_bytes(serialization.Encoding.DER)
    assert commands.verify(signer("g", n1_old.key_pem)(8, 0, encode(1, {"access_key": "a"}, der_old)), 8)


def test_the_three_steps_of_a_ca_rotation_on_the_files(tmp_path):
    certs.write_group(
        tmp_path, ["n0", "n1"], clients=(), addresses=["127.0.0.1:1", "127.0.0.1:2"], group="g1"
    )
    ns = certs.make_service_cert(certs.load_or_make_ca(tmp_path), "nameserver", "ns0")
    certs.write_issued(tmp_path, "ns0", ns)
    old_ca = (tmp_path / "ca.pem").read_bytes()
    n0_before = x509.load_pem_x509_certificate((tmp_path / "n0.pem").read_bytes())

    new = certs.begin_ca_rotation(tmp_path)
    bundle = x509.load_pem_x509_certificates((tmp_path / "ca.pem").read_bytes())
    assert len(bundle) == 2 and (tmp_path / "ca.pem").read_bytes().startswith(old_ca.rstrip(b"\n"))
    assert certs.begin_ca_rotation(tmp_path) == new  # again: the same new CA, the bundle unchanged
    assert len(x509.load_pem_x509_certificates((tmp_path / "ca.pem").read_bytes())) == 2

    assert certs.reissue_from_next_ca(tmp_path) == ["n0", "n1", "ns0"]
    new_ca = x509.load_pem_x509_certificate(new.cert_pem)
    n0 = x509.load_pem_x509_certificate((tmp_path / "n0.pem").read_bytes())
    n0.verify_directly_issued_by(new_ca)
    assert (node_identity(n0), node_group(n0)) == ("n0", "g1")
    san = x509.SubjectAlternativeName
    assert n0.extensions.get_extension_for_class(san) == n0_before.extensions.get_extension_for_class(san)
    files = _files(tmp_path)
    check_material(files.read(), files, "n0", "g1")  # the key written is the new certificate's
    ns_after = x509.load_pem_x509_certificate((tmp_path / "ns0.pem").read_bytes())
    assert ns_after.extensions.get_extension_for_class(san).value.get_values_for_type(
        x509.UniformResourceIdentifier
    ) == ["dledger:nameserver:ns0"]

    certs.finish_ca_rotation(tmp_path)
    assert (tmp_path / "ca.pem").read_bytes() == new.cert_pem
    assert (tmp_path / "ca.key").read_bytes() == new.key_pem
    assert not (tmp_path / f"{certs.NEXT_CA}.pem").exists()
    with pytest.raises(FileNotFoundError, match="nothing to finish"):
        certs.finish_ca_rotation(tmp_path)
    with pytest.raises(FileNotFoundError, match="begin the rotation first"):
        certs.reissue_from_next_ca(tmp_path)
