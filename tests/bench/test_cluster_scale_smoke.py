"""bench.cluster_scale runs end to end on a one-group cluster and prints its table (figures are not checked)."""

from __future__ import annotations

from bench import cluster_scale


def test_cluster_scale_prints_a_row_per_size(tmp_path, capsys):
    cluster_scale.main(["--groups", "1", "--seconds", "0.5", "--callers", "4", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("1 ")]
    assert rows and float(rows[0][1]) > 0, out
