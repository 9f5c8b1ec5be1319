"""The generated code in each ``<package>/v1`` must match ``proto/<package>/v1``: a stale checkout fails here."""

from __future__ import annotations

import shutil
import subprocess
import sys

from dledger import protogen


def test_generated_code_is_up_to_date():
    problems = protogen.stale_files()
    assert problems == [], f"run `make proto`: {problems}"


def test_a_changed_proto_is_detected(tmp_path, monkeypatch):
    # Point the generator at a copy of the sources with one extra field: the committed code is now stale.
    proto_root = tmp_path / "proto"
    shutil.copytree(protogen.PROTO_ROOT, proto_root)
    client = proto_root / "dledger" / "v1" / "client.proto"
    client.write_text(
        client.read_text().replace("  int64 index = 2;\n}", "  int64 index = 2;\n  bool extra = 3;\n}", 1)
    )
    monkeypatch.setattr(protogen, "PROTO_ROOT", proto_root)
    problems = protogen.stale_files()
    assert any("client_pb2" in p for p in problems)
    assert not any("broker_pb2" in p for p in problems), "only what changed is stale"


def test_every_layer_s_protos_are_generated_beside_it():
    assert [p.as_posix() for p in protogen.proto_packages()] == ["broker_adapter/v1", "dledger/v1"]


def test_check_command_exit_code():
    r = subprocess.run([sys.executable, "-m", "dledger.protogen", "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
