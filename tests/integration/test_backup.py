"""Backup and restore as an operator runs them (docs/operations.md): `dledger backup` of a running KV group
under write load, `dledger restore` into a new group on new ports, every write acknowledged up to the backup's
index read back, the Spark audit passing on the restored nodes, and damaged backups refused naming the file."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dledger import group as grp
from dledger.cli import app
from dledger.errors import DLedgerError, OutcomeUnknownError
from dledger.kv.client import AsyncKVClient
from tests.integration.conftest import assert_audit_passes, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class Writers:
    """Puts of unique keys from a few tasks in a thread of their own; key -> (index, value) once acknowledged."""

    def __init__(self, g: grp.GroupSpec):
        self.g = g
        self.acked: dict[bytes, tuple[int, bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="writers")

    async def _run(self) -> None:
        async with AsyncKVClient(self.g.addresses, self.g.name, timeout_s=10, rpc_timeout_s=2) as c:

            async def writer(w: int) -> None:
                i = 0
                while not self._stop.is_set():
                    key, value = f"w{w}-{i}".encode(), f"value {w}-{i}".encode() * 8
                    i += 1
                    try:
                        r = await c.put(key, value)
                    except OutcomeUnknownError:
                        continue
                    except DLedgerError:
                        await asyncio.sleep(0.01)
                        continue
                    self.acked[key] = (r.index, value)

            await asyncio.gather(*(writer(w) for w in range(4)))

    def start(self) -> Writers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _cli(*args: str) -> str:
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return done.output


def test_an_online_backup_restores_into_a_new_group_with_everything_acknowledged_before_it(tmp_path):
    d, restored_dir, out = tmp_path / "g", tmp_path / "restored", tmp_path / "backup"
    g, _ = grp.up(d, 3, None, state_machine="kv")
    restored = None
    w = Writers(g).start()
    try:
        wait(lambda: len(w.acked) >= 300, timeout_s=60, what="300 puts before the backup")
        printed = _cli("backup", "--dir", str(d), "--out", str(out))  # the writers go on meanwhile
        n_at_backup = len(w.acked)
        wait(lambda: len(w.acked) >= n_at_backup + 200, timeout_s=60, what="puts after the backup")
    finally:
        w.stop()
        grp.stop_group(g)
    manifest = json.loads((out / "manifest.json").read_text())
    end = manifest["end"]
    printed = " ".join(printed.split())  # the console wraps long lines
    assert f"backup of group {g.name}" in printed and f"the log to index {end['index']}" in printed
    assert end["snapshot_index"] >= 0 and (out / "snapshot" / "data").stat().st_size > 0
    assert sorted(manifest["files"]) == ["log", "snapshot/data", "snapshot/meta.json"]
    before = {k: v for k, (i, v) in w.acked.items() if i <= end["index"]}
    after = {k for k, (i, _) in w.acked.items() if i > end["index"]}
    assert len(before) >= 300 and after, "writes went on while the backup was taken"

    try:
        printed = " ".join(_cli("restore", "--from", str(out), "--dir", str(restored_dir)).split())
        restored = grp.load(restored_dir)
        assert f"restored group {g.name} to index {end['index']}" in printed and "leads at" in printed
        assert not set(restored.addresses) & set(g.addresses), "a new group on new ports"

        async def read_back() -> tuple[dict[bytes, bytes | None], dict[bytes, bytes | None]]:
            async with AsyncKVClient(restored.addresses, restored.name, timeout_s=30) as c:
                got = {k: (await c.get(k)).value for k in before}
                later = {k: (await c.get(k)).value for k in list(after)[:50]}
                await c.put(b"after-restore", b"yes")
                return got, later

        got, later = asyncio.run(read_back())
        assert got == before, "every put acknowledged up to the backup's index is there, with its value"
        assert set(later.values()) == {None}, "nothing after the backup's index"
        grp.stop_group(restored)
        assert_audit_passes([n.data_dir for n in restored.nodes], tmp_path / "audit-report")
    finally:
        if restored is not None:
            grp.stop_group(restored)

    # A damaged backup is refused before anything is written, naming the file.
    for k, (name, damage, why) in enumerate(
        [
            ("log", lambda p: _flip(p, p.stat().st_size // 2), "log is damaged"),
            ("snapshot/data", lambda p: _flip(p, 10), "snapshot/data is damaged"),
            ("manifest.json", lambda p: p.unlink(), "manifest.json is missing"),
            ("log", lambda p: p.write_bytes(p.read_bytes()[:-7]), "log is damaged"),
        ]
    ):
        copy = tmp_path / f"damaged-{k}"
        shutil.copytree(out, copy)
        damage(copy / name)
        target = tmp_path / f"never-{copy.name}"
        done = CliRunner().invoke(app, ["restore", "--from", str(copy), "--dir", str(target)])
        assert done.exit_code != 0 and why in done.output and str(copy) in done.output.replace("\n", ""), (
            done.output
        )
        assert not target.exists(), "nothing written for a refused backup"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
