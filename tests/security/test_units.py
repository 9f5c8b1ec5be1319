"""The pieces of dledger.security without processes: the signature, peer proofs, users and their snapshot."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from cryptography import x509

from dledger.security import auth, certs, identity, tls
from dledger.security.users import (
    OP_ADD,
    OP_GRANT,
    OP_REMOVE,
    CommandVerifier,
    SecuredStateMachine,
    User,
    UserError,
    UserStore,
    encode,
    is_user_command,
    parse_permission,
    signer,
)
from statemachine.api import CommittedEntry
from statemachine.counter import _DELTA, Counter

NOW = dt.datetime(2026, 11, 24, 20, 0, 0, tzinfo=dt.UTC)
SECRETS = {"alice": "alice-secret"}


def _verify(md, **kw):
    return auth.verify(md, SECRETS.get, now=kw.pop("now", NOW), **kw)


def test_a_rocketmq_signature_authenticates_in_either_hex_case_and_with_a_scoped_credential():
    when, header = auth.headers("alice", "alice-secret", NOW)
    assert _verify([when, header]) == "alice"
    value = header[1]
    sig = value.rsplit("Signature=", 1)[1]
    upper = value.replace(sig, sig.upper())
    assert _verify([when, ("authorization", upper)]) == "alice"
    scoped = value.replace("Credential=alice,", "Credential=alice/cn-north/rmq,")
    assert _verify([when, ("authorization", scoped)]) == "alice"


def test_the_official_clients_signature_is_the_same_hmac():
    from rocketmq.v5.util.signature import Signature

    stamp = auth.date_time(NOW)
    assert Signature.sign("alice-secret", stamp) == auth.signature("alice-secret", stamp)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda md: [md[0]], "no authorization header"),
        (lambda md: [md[1]], "no x-mq-date-time"),
        (lambda md: [md[0], ("authorization", md[1][1].replace("MQv2-HMAC-SHA1", "Basic"))], "scheme"),
        (lambda md: [md[0], ("authorization", md[1][1].replace("alice", "bob"))], "unknown access key"),
        (lambda md: [("x-mq-date-time", "yesterday"), md[1]], "is not yyyyMMddTHHmmssZ"),
    ],
)
def test_missing_or_malformed_headers_are_refused_with_a_reason(mutate, reason):
    md = list(auth.headers("alice", "alice-secret", NOW))
    with pytest.raises(auth.AuthenticationError, match=reason):
        _verify(mutate(md))


def test_a_wrong_secret_is_refused_and_the_reason_never_shows_a_secret():
    md = auth.headers("alice", "not-the-secret", NOW)
    with pytest.raises(auth.AuthenticationError) as e:
        _verify(md)
    assert "wrong secret" in str(e.value)
    assert "alice-secret" not in str(e.value) and "not-the-secret" not in str(e.value)


def test_a_date_time_beyond_the_skew_is_refused_both_ways():
    md = auth.headers("alice", "alice-secret", NOW)
    assert _verify(md, now=NOW + dt.timedelta(minutes=14)) == "alice"
    with pytest.raises(auth.AuthenticationError, match="from the server's clock"):
        _verify(md, now=NOW + dt.timedelta(minutes=16))
    with pytest.raises(auth.AuthenticationError, match="from the server's clock"):
        _verify(md, now=NOW - dt.timedelta(minutes=16))
    with pytest.raises(auth.AuthenticationError, match="allowed: 60 s"):
        _verify(md, now=NOW + dt.timedelta(minutes=2), skew_s=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    certs.write_group(d / "group", ["n0", "n1", "n2"])
    certs.write_group(d / "other", ["n1"])
    return d


def _proof(pki, dir_name: str, cert_of: str, declared: str, group: str = "g"):
    d = pki / dir_name
    plugin = tls.PeerProofPlugin(
        group, declared, (d / f"{cert_of}.pem").read_bytes(), (d / f"{cert_of}.key").read_bytes()
    )
    return plugin.metadata()


def _verifier(pki, members=("n0", "n1", "n2")):
    return tls.PeerVerifier("g", (pki / "group" / "ca.pem").read_bytes(), lambda: members)


def test_a_member_proves_its_node_id_with_its_certificate(pki):
    cert = x509.load_pem_x509_certificate((pki / "group" / "n1.pem").read_bytes())
    assert identity.node_identity(cert) == "n1"
    v = _verifier(pki)
    assert v.verify(_proof(pki, "group", "n1", "n1")) == "n1"
    assert v.verify(_proof(pki, "group", "n1", "n1")) == "n1"  # the cached path checks the same things


@pytest.mark.parametrize(
    ("dir_name", "cert_of", "declared", "reason"),
    [
        ("group", "n1", "n2", "presented the certificate of node 'n1'"),
        ("other", "n1", "n1", "not issued by this group's CA"),
    ],
)
def test_another_nodes_certificate_and_another_cas_are_refused(pki, dir_name, cert_of, declared, reason):
    with pytest.raises(tls.PeerIdentityError, match=reason):
        _verifier(pki).verify(_proof(pki, dir_name, cert_of, declared))


def test_a_proof_for_another_group_a_non_member_and_no_proof_are_refused(pki):
    with pytest.raises(tls.PeerIdentityError, match="signature does not match"):
        _verifier(pki).verify(_proof(pki, "group", "n1", "n1", group="other-group"))
    with pytest.raises(tls.PeerIdentityError, match="not a member"):
        _verifier(pki, members=("n0", "n2")).verify(_proof(pki, "group", "n1", "n1"))
    with pytest.raises(tls.PeerIdentityError, match="without a node proof"):
        _verifier(pki).verify([("x-dledger-node", "n1")])


def test_permissions_parse_and_match_with_wildcards():
    assert parse_permission(" publish:orders ") == "publish:orders"
    for bad in ("publish", "publish:", "subscribe:orders", "root", "publish:a b"):
        with pytest.raises(UserError):
            parse_permission(bad)
    u = User("bob", "s" * 8, {"publish:orders", "subscribe:orders:billing", "subscribe:*:audit"})
    assert u.allows("publish:orders") and not u.allows("publish:payments")
    assert u.allows("subscribe:orders:billing") and not u.allows("subscribe:orders:other")
    assert u.allows("subscribe:payments:audit")
    assert not u.allows("admin")
    assert User("root", "s" * 8, {"admin"}).allows("publish:anything")


@pytest.fixture(scope="module")
def node_pki():
    ca = certs.make_ca()
    other_ca = certs.make_ca()
    return (
        ca,
        certs.make_node_cert(ca, "n0"),
        certs.make_node_cert(other_ca, "n0"),
        certs.make_client_cert(ca, "c"),
    )


def _der(issued) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return x509.load_pem_x509_certificate(issued.cert_pem).public_bytes(serialization.Encoding.DER)


def _command(issued, op, payload, index, group="g") -> bytes:
    """A user command as the leader's prepare leaves it at ``index``."""
    return signer(group, issued.key_pem)(index, 0, encode(op, payload, _der(issued)))


def _secured(ca, inner=None) -> SecuredStateMachine:
    return SecuredStateMachine(
        inner if inner is not None else Counter(), UserStore(), CommandVerifier("g", ca.cert_pem)
    )


def _delta(n: int) -> bytes:
    return _DELTA.pack(n)


def _entries(bodies):
    return [CommittedEntry(i, 1, i * 100, b) for i, b in enumerate(bodies)]


def test_user_commands_and_the_wrapped_machine_share_the_log_and_the_snapshot(node_pki):
    ca, node, _, _ = node_pki
    sm = _secured(ca)
    store = sm.users
    add = _command(
        node, OP_ADD, {"access_key": "bob", "secret_key": "bob-secret", "permissions": ["publish:t"]}, 0
    )
    grant = _command(node, OP_GRANT, {"access_key": "bob", "permission": "admin"}, 2)
    assert is_user_command(add) and not is_user_command(b"\x00\x00\x00\x09DLBC\x01")
    results = sm.apply(_entries([add, _delta(5), grant, _delta(2)]))
    assert (results[1], results[3], sm.inner.value) == (5, 7, 7)  # the counter saw its own entries, in order
    assert results[0] == {"access_key": "bob", "permissions": ["publish:t"]}
    assert results[2]["permissions"] == ["admin", "publish:t"]
    again = _command(node, OP_ADD, {"access_key": "bob", "secret_key": "x" * 8}, 0)
    assert isinstance(sm.apply(_entries([again]))[0], UserError)  # added twice: refused alike on every node
    buf = io.BytesIO()
    sm.save_snapshot(buf)
    assert b"bob-secret" in buf.getvalue()  # the snapshot is the state: data dirs must stay private
    other = _secured(ca)
    other.load_snapshot(io.BytesIO(buf.getvalue()))
    assert other.users.users["bob"].permissions == {"admin", "publish:t"}
    buf2, buf3 = io.BytesIO(), io.BytesIO()
    sm.inner.save_snapshot(buf2)
    other.inner.save_snapshot(buf3)
    assert buf2.getvalue() == buf3.getvalue()
    assert sm.apply(_entries([_command(node, OP_REMOVE, {"access_key": "bob"}, 0)]))[0]["removed"]
    assert "bob" not in store.users


def test_only_a_command_a_node_signed_for_its_own_index_changes_users(node_pki):
    """Bytes a client can place in an entry (a KV key, a raw append) can neither forge nor replay a command:
    an unverifiable one goes to the wrapped machine like any other entry."""
    ca, node, foreign_node, client = node_pki
    grant = {"access_key": "mallory", "secret_key": "mallory-secret", "permissions": ["admin"]}
    unsigned = encode(OP_ADD, grant, _der(node))
    forged_elsewhere = _command(foreign_node, OP_ADD, grant, 0)  # another CA's node
    by_a_client = _command(client, OP_ADD, grant, 0)  # the group's CA, but no node certificate
    other_group = _command(node, OP_ADD, grant, 0, group="other")
    replayed = _command(node, OP_ADD, grant, 7)  # signed for index 7, placed at 0
    tampered = bytearray(_command(node, OP_ADD, grant, 0))
    tampered[-3] ^= 1
    for body in (unsigned, forged_elsewhere, by_a_client, other_group, replayed, bytes(tampered)):
        sm = _secured(ca)
        result = sm.apply(_entries([body]))[0]
        assert sm.users.users == {}
        assert isinstance(result, ValueError)  # the counter's own refusal: not its kind of entry
    sm = _secured(ca)
    sm.apply(_entries([_command(node, OP_ADD, grant, 0)]))
    assert sm.users.users["mallory"].permissions == {"admin"}


def test_a_snapshot_from_before_security_was_on_loads_into_the_wrapped_machine():
    plain = Counter()
    plain.apply(_entries([_delta(7)]))
    buf = io.BytesIO()
    plain.save_snapshot(buf)
    sm = _secured(certs.make_ca())
    sm.load_snapshot(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    sm.inner.save_snapshot(out)
    assert out.getvalue() == buf.getvalue() and sm.users.users == {}


def test_the_revocation_list_is_replicated_state_in_snapshots_old_and_new():
    from dledger.security import users as u

    store = u.UserStore()
    store.users["alice"] = u.User("alice", "alice-secret", {"publish:t"})
    old_format = store.to_json()  # no revocations: the format snapshots had before them
    assert json.loads(old_format) == {"alice": ["alice-secret", ["publish:t"]]}
    bad = store.apply_one(u.encode(u.OP_REVOKE_CERT, {"fingerprint": "nothex"}, b""))
    assert isinstance(bad, u.UserError) and "64 hex digits" in str(bad)
    fp = u.fingerprint(b"some certificate")
    assert store.apply_one(u.encode(u.OP_REVOKE_CERT, {"fingerprint": fp, "node": "n3"}, b""))["revoked"]
    again = u.UserStore()
    again.load_json(store.to_json())
    assert again.revoked_certs == {fp: "n3"} and set(again.users) == {"alice"}
    again.load_json(old_format)
    assert again.revoked_certs == {} and set(again.users) == {"alice"}
