"""Versions a node checks (docs/formats.md sections 6 and 7): the data format of its directory (a downgrade after
a format change is refused with a message) and the peer protocol a peer speaks (a newer one is refused)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from dledger import group as grp
from dledger.errors import ConfigError
from dledger.runtime.datadir import DATA_FORMAT, DATA_FORMAT_KEY, check_data_format
from dledger.transport.grpc import PROTOCOL_KEY, PROTOCOL_VERSION
from dledger.v1 import raft_pb2, raft_pb2_grpc
from storage.meta_lmdb import LmdbMetaStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_the_data_format_is_recorded_and_a_newer_one_refused(tmp_path):
    meta = LmdbMetaStore(str(tmp_path / "meta"))
    try:
        check_data_format(meta, tmp_path)  # a new directory (or one from before formats were recorded)
        assert meta.get(DATA_FORMAT_KEY) == str(DATA_FORMAT).encode()
        meta.put(DATA_FORMAT_KEY, str(DATA_FORMAT + 1).encode(), sync=True)
        with pytest.raises(
            ConfigError, match=f"holds data format {DATA_FORMAT + 1}, written by a newer dledger"
        ):
            check_data_format(meta, tmp_path)
    finally:
        meta.close()


def test_a_node_refuses_a_directory_of_a_newer_format_and_a_peer_of_a_newer_protocol(tmp_path):
    g, _ = grp.up(tmp_path / "g", 3, None)
    try:
        for method, call in [
            ("Vote", lambda stub, md: stub.Vote(raft_pb2.VoteRequest(group=g.name), timeout=5, metadata=md)),
            (
                "Pipe",
                lambda stub, md: list(
                    stub.Pipe(iter([raft_pb2.DeliverRequest(group=g.name)]), timeout=5, metadata=md)
                ),
            ),
        ]:
            with grpc.insecure_channel(g.addresses[0]) as ch:
                stub = raft_pb2_grpc.RaftPeerStub(ch)
                with pytest.raises(grpc.RpcError) as e:
                    call(stub, ((PROTOCOL_KEY, str(PROTOCOL_VERSION + 1)),))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert f"speaks peer protocol '{PROTOCOL_VERSION + 1}'" in e.value.details(), method
    finally:
        grp.stop_group(g)

    spec = g.nodes[0]  # stopped: its directory as a newer version would have left it
    meta = LmdbMetaStore(str(Path(spec.data_dir) / "meta"))
    meta.put(DATA_FORMAT_KEY, str(DATA_FORMAT + 1).encode(), sync=True)
    meta.close()
    pid = grp.start_node(spec)
    deadline = time.monotonic() + 30
    while grp.is_running(spec, pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not grp.is_running(spec, pid), "a node on a directory of a newer format must not run"
    log = (Path(spec.data_dir) / "node.log").read_text()
    assert "written by a newer dledger" in log and "a downgrade after a format change is refused" in log
