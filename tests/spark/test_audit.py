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
from spark.report import FAIL, PASS, SKIP
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


def _msg_acks(path: Path, written: b.Written, upto: int, extra: list[dict] | None = None) -> Path:
    with open(path, "w") as f:
        for e in written.entries[: upto + 1]:
            if e.msg is not None:
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
    from broker_adapter import message

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


def test_flipped_body_byte_on_one_follower(spark, tmp_path):
    nodes = b.build_group(tmp_path, b.raw_items(TERMS), commit=60)
    b.flip_body_byte(nodes[2], 10)
    r = run_audit(spark, [str(tmp_path / f"n{k}") for k in range(3)])
    assert not r.ok
    integrity = r.check("integrity")
    assert integrity.violations == {"body_crc": 1}
    v = integrity.samples[0]
    assert (v.rule, v.node, v.index) == ("body_crc", "n2", 10)
    assert v.file.endswith("n2/data/00000000000000000000") and v.offset == nodes[2].entries[10].pos
    assert r.check("agreement").status == PASS  # the headers still agree: only the bytes on n2 are bad


def test_entry_removed_from_the_middle(spark, tmp_path):
    nodes = b.build_group(tmp_path, b.raw_items(TERMS), commit=60)
    k = b.interior_entry(nodes[1], 30)  # not the first or last entry of its segment
    b.remove_entry(nodes[1], k)
    r = run_audit(spark, [str(tmp_path)])
    integrity = r.check("integrity")
    assert integrity.status == FAIL
    assert {"index_continuity", "pos_mismatch", "chain_crc"} <= set(integrity.violations)
    gap = next(v for v in integrity.samples if v.rule == "index_continuity")
    assert (gap.node, gap.index) == ("n1", k + 1)
    assert gap.offset == nodes[1].entries[k].pos % b.SEGMENT_SIZE
    assert f"expected {k}" in gap.detail
    # Two nodes of three still hold index k: committed, but not under-replicated.
    assert r.check("agreement").status == PASS


def test_two_entries_swapped(spark, tmp_path):
    nodes = b.build_group(tmp_path, b.raw_items(TERMS), commit=60)
    a = b.same_segment_pair(nodes[0], 40)
    b.swap_entries(nodes[0], a)
    r = run_audit(spark, [str(tmp_path)])
    integrity = r.check("integrity")
    assert integrity.status == FAIL
    assert {"index_continuity", "pos_mismatch", "chain_crc"} <= set(integrity.violations)
    first = next(v for v in integrity.samples if v.rule == "index_continuity")
    assert (first.node, first.index) == ("n0", a + 1)  # found where entry a should be
    assert {v.node for v in integrity.samples} == {"n0"}


def test_diverging_committed_entry_is_named_and_uncommitted_tails_may_differ(spark, tmp_path):
    items = b.raw_items(TERMS)
    laid = b.lay_out(items)
    other = b.lay_out(items)
    k = 45
    other[k].body = bytes(x ^ 0x5A for x in other[k].body)  # same length: every later pos is unchanged
    for n in range(2):
        b.write_node(tmp_path / "g" / f"n{n}", laid, commit=60)
    b.write_node(tmp_path / "g" / "n2", other, commit=60)
    r = run_audit(spark, [str(tmp_path / "g")])
    assert r.check("integrity").status == PASS  # n2's log is self-consistent: only a comparison finds it
    agreement = r.check("agreement")
    assert agreement.violations["divergence"] >= 1
    v = agreement.samples[0]
    assert (v.rule, v.node, v.index) == ("divergence", "n2", k)
    assert "n0/n1" in v.detail and v.file.endswith("n2/data/" + f"{laid[k].pos - laid[k].pos % 4096:020d}")
    # The same difference beyond the commit index is an uncommitted tail: reported, not failed.
    for n in range(3):
        b.write_meta_commit(tmp_path / "g" / f"n{n}", 40)
    r = run_audit(spark, [str(tmp_path / "g")])
    agreement = r.check("agreement")
    assert agreement.status == PASS and agreement.warnings["uncommitted_divergence"] >= 1
    assert r.commit_index == 40


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


def test_consumequeue_unit_at_wrong_position(spark, tmp_path):
    items = b.message_items(1, 5)
    nodes = b.build_group(tmp_path, items, commit=len(items) - 3)
    elsewhere = nodes[1].entries[5].pos + codec.HEADER_SIZE
    b.point_unit_elsewhere(nodes[1], "orders", 1, 2, elsewhere)
    r = run_audit(spark, [str(tmp_path)])
    broker = r.check("broker")
    assert broker.violations == {"unit_mismatch": 1}
    v = broker.samples[0]
    assert v.node == "n1" and v.file.endswith("n1/consumequeue/orders/1") and v.offset == 2 * 20
    assert "orders/1 offset 2" in v.detail and f"points at {elsewhere}" in v.detail
    assert r.check("integrity").status == PASS and r.check("agreement").status == PASS


def test_acknowledged_message_absent(spark, tmp_path):
    items = b.message_items(1, 3)
    nodes = b.build_group(tmp_path / "g", items, commit=len(items) - 1)
    ghost = {
        "msg_id": "orders-0-99",
        "topic": "orders",
        "queue_id": 0,
        "queue_offset": 99,
        "commitlog_offset": 7,
    }
    acks = _msg_acks(tmp_path / "acks.jsonl", nodes[0], upto=len(items) - 1, extra=[ghost])
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    delivery = r.check("delivery")
    assert delivery.violations == {"acked_missing": 1}
    assert "orders-0-99" in delivery.samples[0].detail
    assert r.rules() == {"delivery.acked_missing"}


def test_duplicated_message(spark, tmp_path):
    items = b.message_items(1, 3)
    retry = items[4]  # a producer retry: the same message (same id) stored again
    items.append(b.Item(1, msg=retry.msg))
    nodes = b.build_group(tmp_path / "g", items, commit=len(items) - 1)
    acks = _msg_acks(tmp_path / "acks.jsonl", nodes[0], upto=len(items) - 2)
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    delivery = r.check("delivery")
    assert delivery.violations == {"duplicate": 1}
    v = delivery.samples[0]
    assert v.index == len(items) - 1 and retry.msg.msg_id in v.detail and "2 times" in v.detail
    assert r.check("broker").status == PASS  # queue offsets are dense: only the ids show the duplicate


def test_committed_entry_no_producer_sent(spark, tmp_path):
    nodes = b.build_group(tmp_path / "g", b.raw_items(TERMS), commit=60)
    acks = _raw_acks(tmp_path / "acks.jsonl", nodes[0], upto=60, skip=(33,))
    r = run_audit(spark, [str(tmp_path / "g")], str(acks))
    delivery = r.check("delivery")
    assert delivery.violations == {"unsent": 1} and delivery.samples[0].index == 33


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


def test_violations_exit_1(spark, tmp_path, capsys):
    nodes = b.build_group(tmp_path, b.raw_items([(1, 10)]), commit=8)
    b.flip_body_byte(nodes[0], 3)
    assert main([str(tmp_path)]) == EXIT_VIOLATIONS
    assert "integrity.body_crc" in capsys.readouterr().out
