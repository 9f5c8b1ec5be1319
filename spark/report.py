"""The audit's findings and how they are shown: a terminal table, a JSON report, a small HTML report with a chart.

A check passes when it found no violation. Warnings (a torn uncommitted tail, uncommitted tails that differ,
messages not dispatched yet) are reported with counts but do not fail the audit: Raft allows them. Every
violation sample names the node, the file, the byte offset and the log index where it was found.

The chart is an SVG drawn here (no plotting dependency): entries per term per node, one bar per node in each term,
so a leader change shows as a new group of bars and a divergent tail as a bar only some nodes have.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

PASS: Final = "pass"
FAIL: Final = "fail"
SKIP: Final = "skip"


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    rule: str
    node: str | None
    file: str | None
    offset: int | None
    index: int | None
    detail: str

    def where(self) -> str:
        parts = []
        if self.node is not None:
            parts.append(f"node {self.node}")
        if self.file is not None:
            parts.append(f"file {self.file}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.index is not None:
            parts.append(f"index {self.index}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    title: str
    status: str
    checked: int
    checked_what: str
    violations: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    samples: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())


@dataclass(frozen=True, slots=True)
class NodeSummary:
    name: str
    root: str
    segments: int
    entries: int
    first_index: int | None
    last_index: int | None
    commit_index: int | None
    commit_key: str | None


@dataclass(frozen=True, slots=True)
class AuditReport:
    nodes: tuple[NodeSummary, ...]
    commit_index: int
    commit_source: str
    checks: tuple[CheckResult, ...]
    terms: dict[str, dict[int, int]]
    timings: dict[str, float]
    master: str

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def check(self, name: str) -> CheckResult:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def rules(self) -> set[str]:
        """Every rule with at least one violation, as ``check.rule``."""
        return {f"{c.name}.{r}" for c in self.checks for r, n in c.violations.items() if n}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["terms"] = {node: {str(t): n for t, n in terms.items()} for node, terms in self.terms.items()}
        return d


def render_table(report: AuditReport, console: Console) -> None:
    nodes = Table(title="Nodes", title_justify="left")
    for col in ("node", "segments", "entries", "first", "last", "commit (meta)"):
        nodes.add_column(col, justify="right" if col != "node" else "left")
    for n in report.nodes:
        nodes.add_row(
            n.name,
            str(n.segments),
            f"{n.entries:,}",
            _opt(n.first_index),
            _opt(n.last_index),
            _opt(n.commit_index),
        )
    console.print(nodes)
    console.print(f"group commit index: {report.commit_index} ({report.commit_source})")
    table = Table(title="Audit", title_justify="left")
    for col in ("check", "status", "checked", "violations", "warnings", "first violation"):
        table.add_column(col)
    style = {PASS: "green", FAIL: "bold red", SKIP: "yellow"}
    for c in report.checks:
        first = c.samples[0] if c.samples else None
        table.add_row(
            c.title,
            f"[{style[c.status]}]{c.status.upper()}[/]",
            f"{c.checked:,} {c.checked_what}",
            ", ".join(f"{r} {n:,}" for r, n in c.violations.items()) or "0",
            ", ".join(f"{r} {n:,}" for r, n in c.warnings.items()) or "0",
            f"{first.rule}: {first.where()}" if first else "",
        )
    console.print(table)
    for c in report.checks:
        for v in c.samples:
            console.print(f"  [red]{c.name}.{v.rule}[/] {v.where()}: {v.detail}", highlight=False)
        for note in c.notes:
            console.print(f"  [dim]{c.name}: {note}[/]", highlight=False)
    verdict = "[green]PASS[/]: every check passed" if report.ok else "[bold red]FAIL[/]: violations found"
    console.print(f"audit {verdict}")


def _opt(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def terms_svg(terms: dict[str, dict[int, int]], width: int = 720, height: int = 260) -> str:
    """A grouped bar chart: for every term, one bar per node with the entries of that term."""
    nodes = list(terms)
    all_terms = sorted({t for per in terms.values() for t in per})
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]
    left, bottom, top = 60, 40, 20
    plot_w, plot_h = width - left - 20, height - bottom - top
    peak = max([n for per in terms.values() for n in per.values()] + [1])
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>',
        f'<text x="{left - 6}" y="{top + 4}" text-anchor="end">{peak:,}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end">0</text>',
        f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">term</text>',
    ]
    if all_terms and nodes:
        group_w = plot_w / len(all_terms)
        bar_w = max(1.0, group_w * 0.8 / len(nodes))
        for g, term in enumerate(all_terms):
            gx = left + g * group_w + group_w * 0.1
            for k, node in enumerate(nodes):
                n = terms[node].get(term, 0)
                h = plot_h * n / peak
                out.append(
                    f'<rect x="{gx + k * bar_w:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w:.1f}" '
                    f'height="{h:.1f}" fill="{colors[k % len(colors)]}"><title>{html.escape(node)}, term {term}: '
                    f"{n:,} entries</title></rect>"
                )
            out.append(
                f'<text x="{left + g * group_w + group_w / 2:.1f}" y="{top + plot_h + 14}" '
                f'text-anchor="middle">{term}</text>'
            )
    for k, node in enumerate(nodes):
        x = left + 10 + k * 120
        out.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{colors[k % len(colors)]}"/>')
        out.append(f'<text x="{x + 14}" y="13">{html.escape(node)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def render_html(report: AuditReport) -> str:
    e = html.escape
    verdict = "PASS: every check passed" if report.ok else "FAIL: violations found"
    rows = []
    for c in report.checks:
        viol = ", ".join(f"{r} {n:,}" for r, n in c.violations.items()) or "0"
        warn = ", ".join(f"{r} {n:,}" for r, n in c.warnings.items()) or "0"
        rows.append(
            f'<tr class="{c.status}"><td>{e(c.title)}</td><td>{c.status.upper()}</td>'
            f"<td>{c.checked:,} {e(c.checked_what)}</td><td>{e(viol)}</td><td>{e(warn)}</td></tr>"
        )
    details = []
    for c in report.checks:
        for v in c.samples:
            details.append(f"<li><b>{e(c.name)}.{e(v.rule)}</b> {e(v.where())}: {e(v.detail)}</li>")
        for note in c.notes:
            details.append(f'<li class="note">{e(c.name)}: {e(note)}</li>')
    node_rows = "".join(
        f"<tr><td>{e(n.name)}</td><td>{n.segments}</td><td>{n.entries:,}</td><td>{_opt(n.first_index)}</td>"
        f"<td>{_opt(n.last_index)}</td><td>{_opt(n.commit_index)}</td></tr>"
        for n in report.nodes
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>dledger audit</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; margin-bottom: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; }} tr.fail td {{ background: #fdd; }}
tr.pass td {{ background: #dfd; }} tr.skip td {{ background: #ffd; }} li.note {{ color: #666; }}
</style></head><body>
<h1>dledger audit: {e(verdict)}</h1>
<p>Group commit index {report.commit_index} ({e(report.commit_source)}); Spark master {e(report.master)}.</p>
<h2>Nodes</h2>
<table><tr><th>node</th><th>segments</th><th>entries</th><th>first</th><th>last</th><th>commit (meta)</th></tr>
{node_rows}</table>
<h2>Checks</h2>
<table><tr><th>check</th><th>status</th><th>checked</th><th>violations</th><th>warnings</th></tr>
{"".join(rows)}</table>
<h2>Entries per term per node</h2>
{terms_svg(report.terms)}
<h2>Details</h2>
<ul>{"".join(details) or "<li>none</li>"}</ul>
</body></html>
"""


def write_reports(report: AuditReport, directory: str | Path) -> tuple[Path, Path]:
    """Write ``audit.json`` and ``audit.html`` (with the chart also as ``terms.svg``) into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    json_path = d / "audit.json"
    json_path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True))
    (d / "terms.svg").write_text(terms_svg(report.terms))
    html_path = d / "audit.html"
    html_path.write_text(render_html(report))
    return json_path, html_path
