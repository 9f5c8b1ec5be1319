"""Certificate rotation without a restart (docs/security.md, "Rotating certificates"): a secure 3-node broker group
under continuous produce load moves to a new CA in three steps, each by reload only, and no call fails."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from broker_adapter.cli import ack_record
from broker_adapter.client import BrokerConnection, Producer
from broker_adapter.v1 import nameserver_pb2 as pb
from broker_adapter.v1 import nameserver_pb2_grpc as pb_grpc
from dledger import group as grp
from dledger.errors import DLedgerError
from dledger.security import certs, tls
from dledger.security.config import ClientSecurity
from dledger.v1 import client_pb2, client_pb2_grpc, raft_pb2, raft_pb2_grpc
from tests.integration.conftest import assert_audit_passes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TOPIC = "rotation"


def _dledger(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "dledger", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


class _Load:
    """One producer sending small batches until stopped; every acknowledgement goes to the ack log, every failed
    call is kept."""

    def __init__(self, g: grp.GroupSpec, security: ClientSecurity, ack_log: Path):
        self.acked = 0
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._producer = Producer(g.addresses, security=security)
        self._ack = ack_log.open("a")
        self._thread = threading.Thread(target=self._run, name="rotation-load")
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                results = self._producer.send_batch(TOPIC, [f"m-{n + i}".encode() for i in range(8)])
            except (DLedgerError, grpc.RpcError) as e:
                self.failures.append(e)
                continue
            self._ack.write("".join(json.dumps(ack_record(r)) + "\n" for r in results))
            n += len(results)
            self.acked = n
            time.sleep(0.005)

    def wait_more(self, count: int, timeout_s: float = 60.0) -> None:
        """Until ``count`` more messages were acknowledged (the load is running through the current step)."""
        goal, deadline = self.acked + count, time.monotonic() + timeout_s
        while self.acked < goal and not self.failures:
            assert time.monotonic() < deadline, f"the load stalled at {self.acked} acknowledged"
            time.sleep(0.05)
        assert not self.failures, self.failures

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._producer.close()
        self._ack.close()


def _metadata(address: str, ca: Path) -> grpc.RpcError | client_pb2.MetadataResponse:
    """A fresh TLS connection trusting only ``ca`` (what the node serves now), asking for metadata unsigned: a
    handshake that fails is UNAVAILABLE; one that passes reaches the guard (UNAUTHENTICATED, no signature)."""
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes())) as ch:
        try:
            return client_pb2_grpc.DLedgerStub(ch).Metadata(client_pb2.MetadataRequest(), timeout=5)
        except grpc.RpcError as e:
            return e


def _handshake_code(address: str, ca: Path) -> grpc.StatusCode:
    got = _metadata(address, ca)
    assert isinstance(got, grpc.RpcError), got
    return got.code()


def _vote_with(
    address: str, cert: Path, key: Path, ca: Path, node: str
) -> grpc.RpcError | raft_pb2.PeerReply:
    creds = tls.peer_channel_credentials(
        "dledger", node, cert.read_bytes(), key.read_bytes(), ca.read_bytes()
    )
    with grpc.secure_channel(address, creds) as ch:
        req = raft_pb2.VoteRequest(
            group="dledger", term=0, src=node, dst="n0", last_log_index=-1, last_log_term=0
        )
        try:
            return raft_pb2_grpc.RaftPeerStub(ch).Vote(req, timeout=5)
        except grpc.RpcError as e:
            return e


def _issuer(path: Path) -> str:
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes()).issuer.rfc4514_string()


@pytest.mark.long  # a whole rotation under load (about 25 s): make test-long, run by CI
def test_rotation_to_a_new_ca_under_load_by_reload_only(tmp_path):
    g, _ = grp.up(tmp_path / "g", 3, None, state_machine="broker", secure=True)
    directory, tls_dir = tmp_path / "g", tmp_path / "g" / "tls"
    old = tmp_path / "old"  # the old CA and n1's old certificate, kept to try them after the rotation
    shutil.copytree(tls_dir, old)
    try:
        grp.wait_for_all(g, 30)
        pids = {n.id: grp.read_pid(n) for n in g.nodes}
        admin = ClientSecurity.from_file(Path(g.security))
        with BrokerConnection(g.addresses, security=admin) as c:
            c.create_topic(TOPIC, 4)
        ack_log = tmp_path / "ack.jsonl"
        load = _Load(g, admin, ack_log)
        try:
            load.wait_more(200)

            # Step 1: every node trusts the old and the new CA.
            _dledger("cert", "rotate-ca", "--dir", str(directory), "--step", "trust")
            out = _dledger("cert", "reload", "--dir", str(directory))
            assert out.count(": reloaded:") == 3, out
            load.wait_more(200)
            for n in g.nodes:  # the nodes still serve their old-CA certificates
                assert _handshake_code(n.address, old / "ca.pem") == grpc.StatusCode.UNAUTHENTICATED

            # Step 2: every node gets a certificate from the new CA.
            _dledger("cert", "rotate-ca", "--dir", str(directory), "--step", "issue")
            new_ca = tls_dir / "next-ca.pem"
            assert all(_issuer(tls_dir / f"{n.id}.pem") == _issuer(new_ca) for n in g.nodes)
            out = _dledger("cert", "reload", "--dir", str(directory))
            assert out.count(": reloaded:") == 3, out
            load.wait_more(200)  # replication now runs on new-CA proofs: the leader still commits
            for n in g.nodes:  # a new connection sees the new certificate: only the new CA verifies it
                assert _handshake_code(n.address, new_ca) == grpc.StatusCode.UNAUTHENTICATED
                assert _handshake_code(n.address, old / "ca.pem") == grpc.StatusCode.UNAVAILABLE

            # Step 3: the old CA is dropped.
            _dledger("cert", "rotate-ca", "--dir", str(directory), "--step", "finish")
            out = _dledger("cert", "reload", "--dir", str(directory))
            assert out.count(": reloaded:") == 3, out
            load.wait_more(200)
        finally:
            load.stop()
        assert not load.failures, load.failures  # every send acknowledged

        # After the rotation: a client with only the old CA cannot connect; a node certificate of the old CA is
        # refused as a peer (by every node), while the same node's new certificate is heard.
        n0 = g.node("n0")
        for n in g.nodes:
            assert _handshake_code(n.address, old / "ca.pem") == grpc.StatusCode.UNAVAILABLE
            refused = _vote_with(n.address, old / "n1.pem", old / "n1.key", tls_dir / "ca.pem", "n1")
            assert isinstance(refused, grpc.RpcError), refused
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused
        heard = _vote_with(n0.address, tls_dir / "n1.pem", tls_dir / "n1.key", tls_dir / "ca.pem", "n1")
        assert isinstance(heard, raft_pb2.PeerReply), heard
        assert "not issued by this group's CA" in (Path(n0.data_dir) / "node.log").read_text()
        # A client of the new CA alone works, and nothing was restarted.
        with Producer(g.addresses, security=ClientSecurity.from_file(Path(g.security))) as p:
            r = p.send(TOPIC, b"after the rotation")
        with ack_log.open("a") as f:
            f.write(json.dumps(ack_record(r)) + "\n")
        assert {n.id: grp.read_pid(n) for n in g.nodes} == pids
        # The peers' channels were made anew at the reloads: a follower killed now and started again (serving
        # its new-CA certificate) is dialled and caught up. A channel still trusting only the old CA would fail
        # every handshake with it.
        follower = next(n for n in g.nodes if n.id != grp.wait_for_leader(g).id)
        grp.kill_node(follower)
        with Producer(g.addresses, security=ClientSecurity.from_file(Path(g.security))) as p:
            r2 = p.send(TOPIC, b"while a follower is down")
        grp.start_node(follower)
        top = max(row.commit_index or 0 for row in grp.status(g))
        row = grp.wait_caught_up(g, follower.id, top, timeout_s=60)
        assert row is not None and (row.commit_index or -1) >= top, f"the restarted follower: {row}"
        with ack_log.open("a") as f:
            f.write(json.dumps(ack_record(r2)) + "\n")
    finally:
        grp.stop_group(g)
    # Every acknowledged message is in the committed log exactly once, and the nodes agree.
    assert_audit_passes([n.data_dir for n in g.nodes], tmp_path / "audit-report", "--ack-log", str(ack_log))


def _register(address: str, ca: Path, issued: tuple[bytes, bytes], node: str = "n0") -> grpc.StatusCode:
    """A registration of g1/``node`` with that certificate and key, over TLS trusting ``ca``: its status code."""
    creds = tls.peer_channel_credentials("g1", node, issued[0], issued[1], ca.read_bytes())
    reg = pb.BrokerRegistration(cluster="c", group="g1", node_id=node, address="127.0.0.1:1", term=1)
    with grpc.secure_channel(address, creds) as ch:
        try:
            pb_grpc.NameServerStub(ch).RegisterBroker(reg, timeout=5)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_a_name_server_reloads_on_sighup_and_from_the_cli(tmp_path):
    d = tmp_path / "tls"
    ca = certs.load_or_make_ca(d)
    certs.write_issued(d, "ns0", certs.make_service_cert(ca, "nameserver", "ns0"))
    old_node = certs.make_node_cert(ca, "n0", group="g1")
    (tmp_path / "admin.toml").write_text('access_key = "admin"\nsecret_key = "admin-secret-1"\n')
    (tmp_path / "users.toml").write_text('[[user]]\naccess_key = "reader"\nsecret_key = "reader-secret-1"\n')
    old_ca = tmp_path / "old-ca.pem"
    shutil.copy(d / "ca.pem", old_ca)
    (port,) = grp.free_ports(1)
    address = f"127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "dledger",
        "nameserver",
        "--listen",
        address,
        "--admin",
        str(tmp_path / "admin.toml"),
    ]
    argv += ["--cert", str(d / "ns0.pem"), "--key", str(d / "ns0.key"), "--ca", str(d / "ca.pem")]
    log = tmp_path / "ns.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*argv, "--users", str(tmp_path / "users.toml")], stdout=out, stderr=subprocess.STDOUT
        )

    def cli_reload(access_key: str = "admin", secret: str = "admin-secret-1") -> subprocess.CompletedProcess:
        keys = ["--ca-file", str(d / "ca.pem"), "--access-key", access_key, "--secret-key", secret]
        return subprocess.run(
            [sys.executable, "-m", "dledger", *keys, "cert", "reload", "--addresses", address],
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert _register(address, d / "ca.pem", (old_node.cert_pem, old_node.key_pem)) == grpc.StatusCode.OK

        # Step 1 by SIGHUP: a node certificate of the new CA is accepted once the bundle is loaded.
        new = certs.begin_ca_rotation(d)
        new_node = certs.make_node_cert(new, "n0", group="g1")
        pair = (new_node.cert_pem, new_node.key_pem)
        assert _register(address, d / "ca.pem", pair) == grpc.StatusCode.UNAUTHENTICATED
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while _register(address, d / "ca.pem", pair) != grpc.StatusCode.OK:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

        # Step 2 from the CLI: its own certificate from the new CA; only the bootstrap admin may ask.
        certs.reissue_from_next_ca(d)
        refused = cli_reload("reader", "reader-secret-1")
        assert (
            refused.returncode == 1 and "may not call ReloadCertificates" in refused.stdout + refused.stderr
        )
        assert _handshake_code(address, d / f"{certs.NEXT_CA}.pem") == grpc.StatusCode.UNAVAILABLE
        ok = cli_reload()
        assert ok.returncode == 0 and ": reloaded:" in ok.stdout, ok.stdout + ok.stderr
        assert _register(address, d / f"{certs.NEXT_CA}.pem", pair) == grpc.StatusCode.OK

        # The users file is read again by a reload: a user added is known from then on (a known non-admin is
        # refused the reload itself, an unknown one is not even heard); a bad users file changes nothing.
        users = tmp_path / "users.toml"
        kept = users.read_text()
        users.write_text(kept + '[[user]]\naccess_key = "late"\nsecret_key = "late-secret-22"\n')
        unknown = cli_reload("late", "late-secret-22")
        assert unknown.returncode == 1 and "unknown access key 'late'" in unknown.stdout + unknown.stderr
        assert cli_reload().returncode == 0
        known = cli_reload("late", "late-secret-22")
        assert known.returncode == 1 and "may not call ReloadCertificates" in known.stdout + known.stderr
        users.write_text('[[user]]\naccess_key = "late"\n')
        bad = cli_reload()
        assert bad.returncode == 1 and "users.toml" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
        known = cli_reload("late", "late-secret-22")  # the users it had
        assert "may not call ReloadCertificates" in known.stdout + known.stderr
        users.write_text(kept)

        # Files that cannot serve: refused naming the file, and the name server goes on with what it had.
        good_key = (d / "ns0.key").read_bytes()
        (d / "ns0.key").write_bytes(new_node.key_pem)
        bad = cli_reload()
        assert bad.returncode == 1 and "ns0.key is not the key of the certificate" in bad.stdout + bad.stderr
        (d / "ns0.key").write_bytes(good_key)
        assert _register(address, d / f"{certs.NEXT_CA}.pem", pair) == grpc.StatusCode.OK

        # Step 3: the old CA dropped; its node certificate and a client trusting only it are refused.
        certs.finish_ca_rotation(d)
        assert cli_reload().returncode == 0
        assert (
            _register(address, d / "ca.pem", (old_node.cert_pem, old_node.key_pem))
            == grpc.StatusCode.UNAUTHENTICATED
        )
        assert _register(address, old_ca, pair) == grpc.StatusCode.UNAVAILABLE
        assert _register(address, d / "ca.pem", pair) == grpc.StatusCode.OK
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "not issued by this group's CA" in log.read_text() and "admin-secret-1" not in log.read_text()
