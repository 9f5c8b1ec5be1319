"""The audit's read-only pieces without Spark: the segment scan, the meta reader, the node listing, the reports."""

from __future__ import annotations

import json
import struct

import pytest

from broker_adapter.core import commands, formats, message
from spark.broker import BODY_COMMAND, BODY_MESSAGE, BODY_RAW, message_fields
from spark.layout import AuditInputError, discover
from spark.meta import decode_int, read_meta
from spark.report import AuditReport, CheckResult, NodeSummary, Violation, render_html, terms_svg
from spark.segment import SegmentTask, scan_segment
from storage import codec
from tests.spark import builder as b


def _scan(w: b.Written, seg_no: int, last: bool | None = None) -> tuple[dict, list]:
    files = sorted((w.root / "data").iterdir())
    files = [f for f in files if f.name.isdigit()]
    index = tuple(sorted((int(p.name), str(p)) for p in (w.root / "index").iterdir()))
    path = files[seg_no]
    chunks: list = []
    task = SegmentTask(
        0, str(path), int(path.name), seg_no == len(files) - 1 if last is None else last, index
    )
    return scan_segment(task, chunks.append, chunk_rows=7), chunks


def test_clean_segments_scan_to_columns_with_nothing_flagged(tmp_path):
    w = b.write_node(tmp_path / "n0", b.lay_out(b.raw_items([(1, 10), (3, 12)])), commit=20)
    seen = []
    for k in range(len([f for f in (w.root / "data").iterdir() if f.name.isdigit()])):
        summary, chunks = _scan(w, k)
        assert summary["counts"] == {} and summary["samples"] == []
        assert summary["tail"] in ("blank", "end")
        for c in chunks:
            assert len(c) <= 7
            seen.extend(zip(c.index.tolist(), c.pos.tolist(), c.term.tolist(), strict=True))
    assert seen == [(e.index, e.pos, e.term) for e in w.entries]


def test_scan_leaves_the_file_unchanged(tmp_path):
    w = b.write_node(tmp_path / "n0", b.lay_out(b.raw_items([(1, 10)])), commit=5)
    path = next(f for f in (w.root / "data").iterdir() if f.name.isdigit())
    path.chmod(0o444)
    before = path.read_bytes()
    summary, _ = _scan(w, 0)
    assert summary["entries"] == 11 and path.read_bytes() == before


def test_torn_tail_in_last_segment_is_a_warning_and_bad_frame_elsewhere_a_violation(tmp_path):
    w = b.write_node(tmp_path / "n0", b.lay_out(b.raw_items([(1, 30)])), commit=5)
    files = sorted(f for f in (w.root / "data").iterdir() if f.name.isdigit())
    assert len(files) >= 2
    with open(files[-1], "ab") as f:
        f.write(struct.pack(">ii", 1, 4000) + b"\x07" * 30)  # a header cut by a crash
    summary, _ = _scan(w, len(files) - 1)
    assert summary["tail"] == "torn" and set(summary["counts"]) == {"torn_tail"}
    data = bytearray(files[0].read_bytes())
    e = w.entries[3]
    data[e.pos : e.pos + 4] = struct.pack(">i", 9)  # bad magic mid-log
    files[0].write_bytes(bytes(data))
    summary, _ = _scan(w, 0)
    assert summary["counts"] == {"bad_magic": 1} and summary["samples"][0]["offset"] == e.pos
    assert summary["entries"] == 3  # the walk stops at the damage


def test_index_unit_that_disagrees_with_its_header_is_named(tmp_path):
    w = b.write_node(tmp_path / "n0", b.lay_out(b.raw_items([(2, 8)])), commit=5)
    index_file = sorted((w.root / "index").iterdir())[0]
    data = bytearray(index_file.read_bytes())
    struct.pack_into(">q", data, 4 * 32 + 24, 99)  # unit of index 4: term 99
    index_file.write_bytes(bytes(data))
    summary, _ = _scan(w, 0)
    assert summary["counts"] == {"index_unit": 1}
    v = summary["samples"][0]
    assert v["index"] == 4 and "term 99" in v["detail"] and v["offset"] == w.entries[4].pos


def test_message_fields_and_body_kinds(tmp_path):
    items = b.message_items(3, 2, topics=("t",), queues=1)
    items.append(b.Item(3, commands.encode(commands.CreateTopic("t", 1))))
    w = b.write_node(tmp_path / "n0", b.lay_out(items), commit=None, queues=False)
    summary, chunks = _scan(w, 0)
    kinds = [k for c in chunks for k in c.body_kind.tolist()]
    assert kinds == [BODY_RAW, BODY_MESSAGE, BODY_MESSAGE, BODY_COMMAND]
    assert summary["messages"] == 2 and summary["counts"] == {}
    m = message_fields(w.entries[2].body)
    assert (m.topic, m.queue_id, m.queue_offset, m.msg_id) == ("t", 0, 1, "t-0-1")
    assert m.physical_offset == w.entries[2].pos + codec.HEADER_SIZE
    assert m.tags_code == message.tags_code("tag1")
    with pytest.raises(formats.MessageFormatError, match="TOTALSIZE"):
        message_fields(w.entries[2].body + b"x")


def test_wrong_physical_offset_is_a_broker_finding(tmp_path):
    items = b.message_items(1, 1, topics=("t",), queues=1)
    laid = b.lay_out(items)
    raw = bytearray(laid[1].body)
    message.patch_placement(raw, 0, 12345)
    laid[1].body = bytes(raw)
    w = b.write_node(tmp_path / "n0", laid, commit=None, queues=False)
    summary, _ = _scan(w, 0)
    assert summary["counts"] == {"physical_offset": 1}
    assert summary["samples"][0]["check"] == "broker" and "12345" in summary["samples"][0]["detail"]


def test_meta_is_read_only_and_commit_key_decoded(tmp_path):
    w = b.write_node(tmp_path / "n0", b.lay_out(b.raw_items([(1, 3)])), commit=2)
    before = {p.name: p.read_bytes() for p in (w.root / "meta").iterdir()}
    meta = read_meta(str(w.root / "meta"))
    assert meta.commit_index == 2 and meta.commit_key == "kv/commit_index"
    assert {p.name: p.read_bytes() for p in (w.root / "meta").iterdir()} == before
    assert read_meta(str(tmp_path / "none")).commit_index is None
    assert decode_int(b"12345678") == 12345678  # ASCII digits win over an 8-byte binary reading
    assert decode_int(struct.pack(">q", 7)) == 7
    assert decode_int(b'{"index": 9}') == 9


def test_discover_expands_a_group_and_rejects_bad_input(tmp_path):
    for k in range(2):
        b.write_node(tmp_path / "g" / f"n{k}", b.lay_out(b.raw_items([(1, 3)])), commit=2)
    (tmp_path / "g" / "n0" / "data" / "notes.txt").write_text("x")
    layouts = discover([str(tmp_path / "g")])
    assert [lay.name for lay in layouts] == ["n0", "n1"]
    assert layouts[0].ignored and layouts[0].start is not None and layouts[0].start.first_index == 0
    assert not any(p.endswith("start.json") for p in layouts[1].ignored)
    with pytest.raises(AuditInputError, match="no such directory"):
        discover([str(tmp_path / "missing")])
    with pytest.raises(AuditInputError, match="given twice"):
        discover([str(tmp_path / "g" / "n0"), str(tmp_path / "g" / "n0")])
    (tmp_path / "g" / "n1" / "data" / "start.json").write_text("{")
    with pytest.raises(AuditInputError, match="start record"):
        discover([str(tmp_path / "g")])


def test_html_report_draws_entries_per_term_per_node():
    svg = terms_svg({"n0": {1: 10, 2: 5}, "n1": {1: 10, 3: 2}})
    assert svg.count("<rect") == 2 * 3 + 2  # a bar per node per term, plus the legend
    assert ">3</text>" in svg and "n1, term 3: 2 entries" in svg
    check = CheckResult(
        "integrity",
        "1. per-node integrity",
        "fail",
        10,
        "entries",
        {"body_crc": 1},
        {},
        (Violation("integrity", "body_crc", "n1", "/x/data/0", 96, 3, "bad <body>"),),
    )
    report = AuditReport(
        (NodeSummary("n0", "/x", 1, 10, 0, 9, 8, "kv/commit_index"),),
        8,
        "meta",
        (check,),
        {"n0": {1: 10}},
        {},
        "local[2]",
    )
    page = render_html(report)
    assert "FAIL" in page and "bad &lt;body&gt;" in page and "<svg" in page
    assert json.loads(json.dumps(report.to_json()))["ok"] is False


def test_written_fixture_matches_formats(tmp_path):
    """The test writer goes through FileLogStore: its files are what a node writes."""
    w = b.write_node(tmp_path / "n0", b.lay_out(b.raw_items([(1, 40)])), commit=10)
    files = sorted(f for f in (w.root / "data").iterdir() if f.name.isdigit())
    assert [int(f.name) for f in files] == [k * b.SEGMENT_SIZE for k in range(len(files))]
    for f in files[:-1]:
        data = f.read_bytes()
        assert len(data) == b.SEGMENT_SIZE


def test_dledger_audit_command_forwards_to_the_audit(tmp_path):
    import typer
    from typer.testing import CliRunner

    from spark.cli import register

    app = typer.Typer()
    app.command("noop")(lambda: None)  # a second command, so "audit" is a subcommand as in dledger
    register(app)
    runner = CliRunner()
    result = runner.invoke(app, ["audit", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such directory" in result.output
    result = runner.invoke(app, ["audit", "--help"])
    assert result.exit_code == 0 and "--ack-log" in result.output
