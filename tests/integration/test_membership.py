"""Membership changes on real processes under produce load (docs/membership.md): a killed follower replaced by
a new node on a new directory and port, and a group grown from 3 to 5 voters and shrunk back to 3 (removing the
leader on the way). Nothing acknowledged is lost: every acknowledged entry is read back from every final
member, through the client and straight from its data files."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dledger import group as grp
from dledger import group_members as members
from dledger.client import AsyncDLedgerClient, DLedgerClient
from dledger.errors import DLedgerError, InvalidRequestError, NotFoundError, OutcomeUnknownError
from tests.integration.conftest import assert_audit_passes, read_log, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class Producer:
    """Writers appending in a thread of their own (the group functions run their own event loops)."""

    def __init__(self, g: grp.GroupSpec, writers: int = 4):
        self.addresses = list(g.addresses)
        self.name = g.name
        self.writers = writers
        self.acked: dict[int, bytes] = {}
        self.unknown = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="producer")

    async def _writer(self, c: AsyncDLedgerClient, wid: int) -> None:
        i = 0
        while not self._stop.is_set():
            body = f"w{wid}-{i}".encode()
            i += 1
            try:
                r = await c.append(body)
            except OutcomeUnknownError:
                self.unknown += 1
                continue
            except DLedgerError:
                await asyncio.sleep(0.01)
                continue
            self.acked[r.index] = body

    async def _run(self) -> None:
        async with AsyncDLedgerClient(self.addresses, self.name, timeout_s=10, rpc_timeout_s=2) as c:
            await asyncio.gather(*[self._writer(c, w) for w in range(self.writers)])

    def start(self) -> Producer:
        self._thread.start()
        return self

    def wait_for(self, n: int, what: str) -> None:
        target = len(self.acked) + n
        wait(lambda: len(self.acked) >= target, timeout_s=60, what=what)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the producer did not stop"


def check_nothing_lost(g: grp.GroupSpec, acked: dict[int, bytes]) -> None:
    top = max(acked)
    with DLedgerClient(g.addresses, g.name, timeout_s=30) as c:
        for spec in g.nodes:
            wait(
                lambda s=spec: c.metadata(s.address).commit_index >= top,
                timeout_s=60,
                what=f"{spec.id} commit",
            )
        for index, body in acked.items():
            assert c.get(index).body == body, f"acknowledged entry {index} lost or changed"
    for spec in g.nodes:  # and straight from each member's files
        on_disk = {e.index: bytes(e.body) for e in read_log(spec.data_dir)}
        for index, body in acked.items():
            assert on_disk.get(index) == body, f"{spec.id} lacks acknowledged entry {index} on disk"


def test_replace_a_killed_follower_under_load(make_group):
    g = make_group(3)
    d = Path(g.nodes[0].data_dir).parent
    try:
        _replace_a_killed_follower(g, d)
    finally:
        grp.stop_group(grp.load(d))  # the members added by the test too


def _replace_a_killed_follower(g: grp.GroupSpec, d: Path) -> None:
    p = Producer(g).start()
    try:
        p.wait_for(200, "200 appends before the kill")
        leader = grp.wait_for_leader(g)
        victim = next(n for n in g.nodes if n.id != leader.id)
        assert grp.kill_node(victim) is not None
        p.wait_for(100, "appends with a follower down")
        r = members.replace_node(d, victim.id, timeout_s=60)
        p.wait_for(200, "appends after the replacement")
        # Then the leader's machine: killed, and replaced the same way once another node leads.
        g2 = grp.load(d)
        old_leader = grp.wait_for_leader(g2)
        assert grp.kill_node(g2.node(old_leader.id)) is not None
        grp.wait_for_leader(g2, exclude=old_leader.id)
        r2 = members.replace_node(d, old_leader.id, timeout_s=60)
        p.wait_for(200, "appends after replacing the leader")
    finally:
        p.stop()
    final = grp.load(d)
    print(
        f"\nreplaced {r.dead} by {r.new} in {r.seconds:.1f} s (caught up to {r.caught_up_index}); "
        f"{len(p.acked)} acknowledged, {p.unknown} outcome unknown"
    )
    print(f"replaced leader {r2.dead} by {r2.new} in {r2.seconds:.1f} s")
    gone = {victim.id, r2.dead}
    assert [n.id for n in final.nodes] == [n.id for n in g.nodes if n.id not in gone] + [r.new, r2.new]
    lead = grp.configuration(final)
    assert lead is not None and sorted(lead.voters) == sorted(n.id for n in final.nodes) and not lead.learners
    check_nothing_lost(final, p.acked)


@pytest.mark.long  # four membership changes on a live group (about 20 s): make test-long, run by CI
def test_grow_three_to_five_and_back_removing_the_leader(make_group, tmp_path):
    g = make_group(3)
    d = Path(g.nodes[0].data_dir).parent
    try:
        _grow_and_shrink(g, d, tmp_path / "audit-report")
    finally:
        grp.stop_group(grp.load(d))


def _grow_and_shrink(g: grp.GroupSpec, d: Path, report_dir: Path) -> None:
    p = Producer(g).start()
    added = []
    try:
        p.wait_for(100, "appends before growing")
        for _ in range(2):
            spec = members.add_member(d)
            members.promote_member(d, spec.id, timeout_s=60)
            added.append(spec.id)
            p.wait_for(50, f"appends after adding {spec.id}")
        lead = grp.configuration(grp.load(d))
        assert lead is not None and len(lead.voters) == 5 and not lead.learners
        # Shrink back: remove the leader (it hands over first), then one of the original nodes.
        members.remove_member(d, lead.node_id)
        p.wait_for(50, "appends after removing the leader")
        rest = [n.id for n in grp.load(d).nodes if n.id not in added]
        members.remove_member(d, rest[0])
        p.wait_for(100, "appends on three nodes again")
    finally:
        p.stop()
    final = grp.load(d)
    assert len(final.nodes) == 3 and set(added) <= {n.id for n in final.nodes}
    lead = grp.configuration(final)
    assert lead is not None and sorted(lead.voters) == sorted(n.id for n in final.nodes)
    print(
        f"\n3 -> 5 -> 3: {len(p.acked)} acknowledged, {p.unknown} outcome unknown; voters now {lead.voters}"
    )
    check_nothing_lost(final, p.acked)
    # The Spark audit over the final members' files: integrity and cross-node agreement (docs/audit.md).
    assert_audit_passes([n.data_dir for n in final.nodes], report_dir)


def test_bad_membership_changes_are_refused_with_actionable_errors(make_group):
    g = make_group(3)
    with DLedgerClient(g.addresses, g.name, timeout_s=10) as c:
        for args, why in [
            (("demote", "n1"), "unknown membership change 'demote'; one of: add-learner"),
            (("remove", "n9"), "cannot remove 'n9': it is not a member"),
            (("add-learner", "n5"), "needs the new node's address"),
            (("add-learner", "n5", "nowhere"), "is not host:port"),
            (("add-learner", "bad id!", "127.0.0.1:1"), "node id 'bad id!' is invalid"),
            (("promote", "n1"), "cannot promote 'n1': it is already a voter"),
            (("add-learner", "n0", "127.0.0.1:1"), "it is already a voter"),
        ]:
            with pytest.raises(InvalidRequestError, match=why):
                c.change_membership(*args)
        before = c.metadata().commit_index
        assert c.metadata().voters == ("n0", "n1", "n2") and c.metadata().conf_index == -1
        assert c.metadata().commit_index == before, "a refused change wrote nothing"


def test_a_learner_catches_up_from_a_snapshot_and_restarts_with_its_configuration(tmp_path):
    """Compacted logs: the new member gets the leader's snapshot (its configuration in the snapshot meta), and
    after compacting past every config entry, nodes restarted with kill -9 find their configuration again."""
    d = tmp_path / "g"
    grp.up(d, 3, None, state_machine="kv")
    try:
        # ``up`` returns once a leader is elected; every node must be serving before each is asked to snapshot
        assert all(r.role != "down" for r in grp.wait_for_all(grp.load(d), timeout_s=30))
        _snapshot_catch_up(d)
    finally:
        grp.stop_group(grp.load(d))


def _snapshot_all(d: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dledger", "snapshot", "--dir", str(d)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def _snapshot_catch_up(d: Path) -> None:
    g = grp.load(d)
    with DLedgerClient(g.addresses, g.name, timeout_s=15) as c:
        _append_batch(c, [b"before the snapshot"] * 300)
    _snapshot_all(d)
    spec = members.add_member(d)
    members.promote_member(d, spec.id, timeout_s=60)
    g = grp.load(d)
    with DLedgerClient(g.addresses, g.name, timeout_s=15) as c:
        with pytest.raises(NotFoundError, match="compacted"):  # it started from the snapshot, not entry 0
            c.get(5, address=spec.address)
        _append_batch(c, [b"after the promotion"] * 50)
        _snapshot_all(d)  # every log now starts after every config entry
        top = _append_batch(c, [b"last"])[-1].index
    for node in (spec, g.nodes[0]):
        grp.kill_node(node)
        grp.start_node(node)
    g = grp.load(d)
    with DLedgerClient(g.addresses, g.name, timeout_s=30) as c:
        for node in (spec, g.nodes[0]):
            info = wait(lambda n=node: _answer(c, n.address), timeout_s=30, what=f"{node.id} back")
            assert sorted(info.voters) == sorted(n.id for n in g.nodes) and not info.learners, info
        top = _append_batch(c, [b"after the restarts"])[-1].index
        for node in g.nodes:
            wait(
                lambda n=node: c.metadata(n.address).commit_index >= top,
                timeout_s=30,
                what=f"{node.id} commit",
            )


def _append_batch(c: DLedgerClient, bodies: list[bytes]):
    """Append, sent again when the outcome is unknown: a fresh leader can step down under load (check-quorum)
    with the append in flight. These tests only need the entries to exist, not exactly once."""
    for _attempt in range(5):
        try:
            return c.append_batch(bodies)
        except OutcomeUnknownError:
            continue
    return c.append_batch(bodies)


def _answer(c: DLedgerClient, address: str):
    try:
        return c.metadata(address)
    except DLedgerError:
        return None


def test_a_learner_serves_committed_reads_and_nothing_past_its_commit_index(make_group):
    g = make_group(3)
    d = Path(g.nodes[0].data_dir).parent
    try:
        spec = members.add_member(d)
        with DLedgerClient(g.addresses, g.name, timeout_s=15) as c:
            results = c.append_batch([f"r{i}".encode() for i in range(20)])
            top = results[-1].index
            wait(
                lambda: (i := _answer(c, spec.address)) is not None and i.commit_index >= top,
                timeout_s=30,
                what="the learner's commit",
            )
            info = c.metadata(spec.address)
            assert info.learners == (spec.id,) and spec.id not in info.voters
            for r, i in zip(results, range(20), strict=True):
                assert c.get(r.index, address=spec.address).body == f"r{i}".encode()
            beyond = c.metadata(spec.address).commit_index + 1
            with pytest.raises(NotFoundError, match="not committed on node"):
                c.get(beyond, address=spec.address)
    finally:
        grp.stop_group(grp.load(d))


def test_member_cli_lists_and_refuses_with_a_message(make_group):
    g = make_group(3)
    d = str(Path(g.nodes[0].data_dir).parent)

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "dledger", *args, "--dir", d]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    out = wait(lambda: (r := cli("member", "list", "--json")).returncode == 0 and r, what="member list")
    doc = json.loads(out.stdout)
    assert doc["voters"] == ["n0", "n1", "n2"] and doc["learners"] == [] and doc["conf_index"] == -1
    assert {n["member"] for n in doc["nodes"]} == {"voter"}
    bad = cli("member", "promote", "n7")
    assert bad.returncode == 1 and "error:" in bad.stderr and "no node 'n7'" in bad.stderr, bad.stderr
    status = cli("group", "status")
    assert "configuration: voters n0, n1, n2 (the initial members)" in status.stdout, status.stdout


def test_a_group_that_lost_its_majority_for_good_is_recovered_from_a_survivor(make_group):
    """Two of three nodes killed for good: the survivor alone can never commit. `dledger group recover --from`
    makes it a one-node group with its whole log; every entry it held is still there (the acknowledged ones
    with their bodies), it takes writes again, and `member add` grows it back."""
    g = make_group(3)
    d = Path(g.nodes[0].data_dir).parent
    try:
        _recover_from_a_survivor(g, d)
    finally:
        grp.stop_group(grp.load(d))


def _recover_from_a_survivor(g: grp.GroupSpec, d: Path) -> None:
    from typer.testing import CliRunner

    from dledger.cli import app
    from dledger.errors import ConfigError

    p = Producer(g).start()
    try:
        p.wait_for(300, "300 appends before losing the majority")
    finally:
        p.stop()
    leader = grp.wait_for_leader(g)
    survivor = next(n for n in g.nodes if n.id != leader.id)
    top = max(p.acked)
    assert grp.wait_caught_up(g, survivor.id, top) is not None, "the survivor holds every acknowledged entry"
    with pytest.raises(ConfigError, match="still running"):  # a live majority: nothing to recover
        members.recover_group(d, survivor.id)
    lost = [n for n in g.nodes if n.id != survivor.id]
    for n in lost:
        assert grp.kill_node(n) is not None
    held = {e.index: bytes(e.body) for e in read_log(survivor.data_dir)}
    # one node of three: no quorum, no write
    with DLedgerClient([survivor.address], g.name, timeout_s=1.5) as c, pytest.raises(DLedgerError):
        c.append(b"refused")
    for n in lost:  # gone for good: their machines and disks
        grp.kill_node(n)

    done = CliRunner().invoke(app, ["group", "recover", "--dir", str(d), "--from", survivor.id])
    assert done.exit_code == 0, done.output
    assert (
        f"node {survivor.id} is now the only voter" in done.output and "leads the group again" in done.output
    )

    alone = grp.load(d)
    assert [n.id for n in alone.nodes] == [survivor.id]
    with DLedgerClient(alone.addresses, g.name, timeout_s=30) as c:
        info = c.metadata()
        assert info.voters == (survivor.id,) and info.role == "leader"
        for index, body in held.items():  # everything it held, committed then or not
            assert c.get(index).body == body, f"entry {index} lost or changed"
        assert set(p.acked) <= set(held)
        after = c.append(b"after recovery")
        assert after.index > max(held)
    spec = members.add_member(d)  # and it grows back
    members.promote_member(d, spec.id, timeout_s=60)
    final = grp.load(d)
    lead = grp.configuration(final)
    assert lead is not None and sorted(lead.voters) == sorted([survivor.id, spec.id])
    check_nothing_lost(final, p.acked)
