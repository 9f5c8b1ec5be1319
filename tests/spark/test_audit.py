"""The Spark audit end to end: a clean group passes; every seeded fault of issue 7 is detected and named.

Groups are written with the real writers (``tests/spark/builder.py``) into tmp directories; one Spark session
(``conftest.spark``) serves every test in this file.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

import pytest

from spark.audit import EXIT_INPUT, EXIT_OK, EXIT_VIOLATIONS, main, run_audit
from spark.layout import AuditInputError
from spark.report import PASS, SKIP
from storage import codec
from tests.spark import builder as b

TERMS = [(1, 20), (2, 30), (4, 15)]  # 68 entries (a no-op opens each term), 5 segments of 4 KiB


def _fingerprint(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() + f":{p.stat().st_mtime_ns}"
    return out


def _raw_acks(path: Path, written: b.Written, upto: int, skip: tuple[int, ...] = ()) -> Path:
    with open(path, "w") as f:
        for e in written.entries[: upto + 1]:
            if e.body and e.index not in skip:
                f.write(json.dumps({"index": e.index, "pos": e.pos, "body_crc": zlib.crc32(e.body)}) + "\n")
    return path


def _msg_acks(
    path: Path, written: b.Written, upto: int, extra: list[dict] | None = None, skip_ids: tuple[str, ...] = ()
) -> Path:
    with open(path, "w") as f:
        for e in written.entries[: upto + 1]:
            if e.msg is not None and e.msg.msg_id not in skip_ids:
                m = e.msg
                rec = {
                    "msg_id": m.msg_id,
                    "topic": m.topic,
                    "queue_id": m.queue_id,
                    "queue_offset": _queue_offset(written, e.index),
                    "commitlog_offset": e.pos + codec.HEADER_SIZE,
                }
                f.write(json.dumps(rec) + "\n")
        for rec in extra or []:
            f.write(json.dumps(rec) + "\n")
    return path


def _queue_offset(written: b.Written, index: int) -> int:
    from broker_adapter.core import message

    return message.decode(written.entries[index].body).queue_offset


def test_clean_group_passes_reads_only_and_writes_reports(spark, tmp_path, capsys):
    items = b.raw_items(TERMS)
    nodes = b.build_group(tmp_path / "group", items, commit=60)
    acks = _raw_acks(tmp_path / "acks.jsonl", nodes[0], upto=60)
    before = _fingerprint(tmp_path / "group")
    rc = main([str(tmp_path / "group"), "--ack-log", str(acks), "--report", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert rc == EXIT_OK, out
    assert _fingerprint(tmp_path / "group") == before  # the audit never writes a node's files
    doc = json.loads((tmp_path / "report" / "audit.json").read_text())
    assert doc["ok"] is True and doc["commit_index"] == 60
    status = {c["name"]: c["status"] for c in doc["checks"]}
    assert status == {"integrity": PASS, "agreement": PASS, "broker": SKIP, "delivery": PASS}
    assert [n["entries"] for n in doc["nodes"]] == [68, 68, 68]
    assert doc["terms"]["n1"] == {"1": 21, "2": 31, "4": 16}
    page = (tmp_path / "report" / "audit.html").read_text()
    assert "<svg" in page and "PASS" in page
    assert "audit PASS" in out


def _check(doc: dict, name: str) -> dict:
    return next(c for c in doc["checks"] if c["name"] == name)


def test_seeded_log_faults_are_detected_and_named(spark, tmp_path, capsys):
    """Five nodes, four faults, each on its own node: a flipped body byte (n2), an entry removed from the middle
    (n3), two entries swapped (n4), a diverging committed entry (n1). n0 is clean."""
    items = b.raw_items(TERMS)
    laid = b.lay_out(items)
    other = b.lay_out(items)
    diverge = 45
    other[diverge].body = bytes(
        x ^ 0x5A for x in other[diverge].body
    )  # same length: later positions unchanged
    g = tmp_path / "g"
    nodes = [b.write_node(g / f"n{k}", other if k == 1 else laid, commit=60) for k in range(5)]
    b.flip_body_byte(nodes[2], 10)
    removed = b.interior_entry(nodes[3], 30)  # not the first or last entry of its segment
    b.remove_entry(nodes[3], removed)
    swapped = b.same_segment_pair(nodes[4], 40)
    b.swap_entries(nodes[4], swapped)

    assert main([str(g), "--report", str(tmp_path / "report")]) == EXIT_VIOLATIONS
    assert "audit FAIL" in capsys.readouterr().out
    doc = json.loads((tmp_path / "report" / "audit.json").read_text())
    integrity = _check(doc, "integrity")
    by_node: dict[str, list[dict]] = {}
    for v in integrity["samples"]:
        by_node.setdefault(v["node"], []).append(v)
    assert set(by_node) == {"n2", "n3", "n4"}  # n1's log is self-consistent: only the comparison finds it

    (flip,) = by_node["n2"]
    assert (flip["rule"], flip["index"], flip["offset"]) == ("body_crc", 10, nodes[2].entries[10].pos)
    assert flip["file"].endswith("n2/data/00000000000000000000")

    n3 = {v["rule"] for v in by_node["n3"]}
    assert {"index_continuity", "pos_mismatch", "chain_crc"} <= n3
    gap = next(v for v in by_node["n3"] if v["rule"] == "index_continuity")
    assert gap["index"] == removed + 1 and gap["offset"] == nodes[3].entries[removed].pos % b.SEGMENT_SIZE
    assert f"expected {removed}" in gap["detail"]

    assert {"index_continuity", "pos_mismatch", "chain_crc"} <= {v["rule"] for v in by_node["n4"]}
    first = next(v for v in by_node["n4"] if v["rule"] == "index_continuity")
    assert first["index"] == swapped + 1  # found where entry `swapped` should be

    agreement = _check(doc, "agreement")
    assert set(agreement["violations"]) == {
        "divergence"
    }  # a removed entry on one node of five is no quorum loss
    v = agreement["samples"][0]
    assert (v["rule"], v["node"], v["index"]) == ("divergence", "n1", diverge)
    assert "n0/n2/n3/n4" in v["detail"]
    assert v["file"].endswith(f"n1/data/{laid[diverge].pos - laid[diverge].pos % b.SEGMENT_SIZE:020d}")

    # The same difference beyond the commit index is an uncommitted tail: reported, not failed.
    for k in range(5):
        b.write_meta_commit(g / f"n{k}", 40)
    r = run_audit(spark, [str(g)])
    agreement = r.check("agreement")
    assert r.commit_index == 40
    assert agreement.status == PASS and agreement.warnings["uncommitted_divergence"] >= 1


def test_commit_index_from_majority_when_meta_has_none(spark, tmp_path):
    items = b.raw_items(TERMS)
    laid = b.lay_out(items)
    for n in range(3):
        b.write_node(tmp_path / f"n{n}", laid[: 50 + 5 * n], commit=None)  # 50, 55, 60 entries
    r = run_audit(spark, [str(tmp_path)])
    assert r.ok
    assert r.commit_index == 54  # the highest index two of three nodes hold with agreeing chain_crc
    assert "majority" in r.commit_source


def test_clean_broker_group_with_ack_log_passes(spark, tmp_path):
    items = b.message_items(1, 5)
    nodes = b.build_group(tmp_path / "g", items, commit=len(items) - 3)
    acks = _msg_acks(tmp_path / "acks.jsonl", nodes[0], upto=len(items) - 3)
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    assert r.ok, r.rules()
    assert r.check("broker").checked == 3 * (len(items) - 3)  # every node's units of committed messages
    assert r.check("delivery").checked == len(items) - 3  # ack log records


def test_seeded_broker_faults_are_detected_and_named(spark, tmp_path):
    """A ConsumeQueue unit at a wrong position (n1), a message acknowledged but absent, a duplicated message,
    and a committed message no producer acknowledged."""
    items = b.message_items(1, 4)
    retry = items[4]  # a producer retry: the same message (same id) stored again
    items.append(b.Item(1, msg=retry.msg))
    nodes = b.build_group(tmp_path / "g", items, commit=len(items) - 1)
    elsewhere = nodes[1].entries[5].pos + codec.HEADER_SIZE
    b.point_unit_elsewhere(nodes[1], "orders", 1, 2, elsewhere)
    ghost = {
        "msg_id": "orders-0-99",
        "topic": "orders",
        "queue_id": 0,
        "queue_offset": 99,
        "commitlog_offset": 7,
    }
    unsent = items[9].msg.msg_id
    acks = _msg_acks(
        tmp_path / "acks.jsonl", nodes[0], upto=len(items) - 2, extra=[ghost], skip_ids=(unsent,)
    )
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    assert r.check("integrity").status == PASS and r.check("agreement").status == PASS

    broker = r.check("broker")
    assert broker.violations == {"unit_mismatch": 1}  # queue offsets stay dense: the retry got the next one
    v = broker.samples[0]
    assert v.node == "n1" and v.file.endswith("n1/consumequeue/orders/1") and v.offset == 2 * 20
    assert "orders/1 offset 2" in v.detail and f"points at {elsewhere}" in v.detail

    delivery = r.check("delivery")
    assert delivery.violations == {"acked_missing": 1, "duplicate": 1, "unsent": 1}
    named = {v.rule: v for v in delivery.samples}
    assert "orders-0-99" in named["acked_missing"].detail
    assert named["duplicate"].index == len(items) - 1 and retry.msg.msg_id in named["duplicate"].detail
    assert "2 times" in named["duplicate"].detail
    assert named["unsent"].index == 9 and unsent in named["unsent"].detail


def test_committed_entry_no_producer_sent(spark, tmp_path):
    nodes = b.build_group(tmp_path / "g", b.raw_items(TERMS), commit=60)
    acks = _raw_acks(tmp_path / "acks.jsonl", nodes[0], upto=60, skip=(33,))
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    delivery = r.check("delivery")
    assert delivery.violations == {"unsent": 1} and delivery.samples[0].index == 33


def test_raw_entry_on_a_broker_group_is_judged_only_by_an_ack_log_of_raw_appends(spark, tmp_path):
    """The append ``dledger kill-leader`` times a failover with is no message: the producers' ack log of
    messages does not call it unsent. An ack log that records raw appends judges it like any raw entry."""
    items = b.message_items(1, 3)
    items.insert(5, b.Item(1, b"after-kill-n0-1"))
    nodes = b.build_group(tmp_path / "g", items, commit=len(items) - 1)
    acks = _msg_acks(tmp_path / "acks.jsonl", nodes[0], upto=len(items) - 1)
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    assert r.ok, r.rules()
    assert any(n.startswith("1 committed raw entries") for n in r.check("delivery").notes)

    with open(acks, "a") as f:
        f.write(json.dumps({"body_crc": 1, "acked": False}) + "\n")  # a raw append of unknown outcome
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    delivery = r.check("delivery")
    assert delivery.violations == {"unsent": 1} and delivery.samples[0].index == 5


def test_unusable_input_exits_2(spark, tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == EXIT_INPUT
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == EXIT_INPUT
    assert "not a node directory" in capsys.readouterr().err
    b.build_group(tmp_path / "g", b.raw_items([(1, 5)]), commit=3)
    assert main([str(tmp_path / "g"), "--ack-log", str(tmp_path / "missing.jsonl")]) == EXIT_INPUT
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 1, "pos": 0, "body_crc": 5}\n{"index": "one"}\n')
    assert main([str(tmp_path / "g"), "--ack-log", str(bad)]) == EXIT_INPUT
    assert "ack log" in capsys.readouterr().err
    incomplete = tmp_path / "incomplete.jsonl"
    incomplete.write_text('{"index": 1}\n')
    with pytest.raises(AuditInputError, match="neither a raw append"):
        run_audit(spark, [str(tmp_path / "g")], str(incomplete))


def test_spark_submit_runs_the_job_and_names_a_term_divergence(tmp_path):
    """``spark-submit spark/audit_job.py`` (its own driver JVM, as on a cluster) fails a group where one node's
    committed entries carry another term (same bodies and positions, other leaders), and names the first."""
    import subprocess
    import sys

    submit = Path(sys.executable).parent / "spark-submit"
    job = Path(__file__).resolve().parents[2] / "spark" / "audit_job.py"
    g = tmp_path / "g"
    laid = b.lay_out(b.raw_items(TERMS))
    other = b.lay_out(b.raw_items([(1, 20), (3, 30), (4, 15)]))  # n1: term 3 where the others have term 2
    for k in range(3):
        b.write_node(g / f"n{k}", other if k == 1 else laid, commit=60)

    def audit(*dirs: Path) -> tuple[int, dict]:
        report = tmp_path / "report"
        cmd = [str(submit), "--master", "local[1]", str(job), *map(str, dirs), "--report", str(report)]
        # spark-submit finds its Spark home and workers with the python on PATH: the project's venv.
        env = {**os.environ, "PATH": f"{submit.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode in (EXIT_OK, EXIT_VIOLATIONS), r.stdout + r.stderr[-4000:]
        return r.returncode, json.loads((report / "audit.json").read_text())

    rc, doc = audit(g / "n0", g / "n1", g / "n2")
    assert rc == EXIT_VIOLATIONS
    agreement = _check(doc, "agreement")
    assert agreement["violations"].get("divergence", 0) > 0, agreement
    first = agreement["samples"][0]
    assert first["index"] == 21 and "n1" in first["detail"], first


@pytest.mark.integration
def test_a_broker_group_compacted_by_retention_passes(spark, tmp_path):
    """Retention (docs/broker.md) compacts every node's log and deletes ConsumeQueue files at the front: the
    queues then start past 0 and the remaining units of the first file point before the log's start. That is
    not a fault: the audit passes and says how many units point at deleted messages."""
    from broker_adapter.client import Producer
    from dledger import group as grp
    from tests.broker.test_retention_group import start
    from tests.rocketmq.conftest import create_topic

    g = start(tmp_path / "g", f"retention_bytes = {128 << 10}", snapshot_entries=100_000)
    try:
        create_topic(g, "ret", 2)
        with Producer(g.addresses) as p:
            for _ in range(20):
                p.send_batch("ret", [b"r" * 600] * 50)
    finally:
        grp.stop_group(g)
    r = run_audit(spark, [str(tmp_path / "g")], None)
    assert r.ok, r.rules()
    assert any("point before their node's compacted log start" in n for n in r.check("broker").notes)
