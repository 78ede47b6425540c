"""Verdicts per requirement and the three renderings of a suite run (pure).

`judge_requirements` folds probe results into one verdict per requirement:
failed when any probe's verdict is unexpected; not tested when a probe is
broken, when some probes could not run, or when none ran; met only when every
probe for it ran and matched its expectation. `to_json` follows docs/design.md
section 6 (plus extra keys), `to_markdown` and `render` show the same data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.display import md, text
from corral.verify.model import MANDATORY, REQUIREMENTS, ProbeResult, ReqStatus, Skipped

__all__ = [
    "Report",
    "RequirementVerdict",
    "judge_requirements",
    "render",
    "summary_line",
    "to_json",
    "to_markdown",
]


@dataclass(frozen=True, slots=True)
class RequirementVerdict:
    id: str
    name: str
    status: ReqStatus
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    backend: str
    env: str
    started: str
    wall_s: float
    results: tuple[ProbeResult, ...]
    skipped: tuple[Skipped, ...]
    requirements: tuple[RequirementVerdict, ...]
    notes: tuple[str, ...] = ()
    python: str = ""

    @property
    def allowed(self) -> int:
        return sum(1 for r in self.results if r.observed == "allowed")

    @property
    def denied(self) -> int:
        return sum(1 for r in self.results if r.observed == "denied")

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if r.observed == "error")

    @property
    def unexpected(self) -> int:
        return sum(1 for r in self.results if r.verdict == "unexpected")

    @property
    def broken(self) -> int:
        return sum(1 for r in self.results if r.verdict == "broken-probe")

    @property
    def exit_code(self) -> int:
        """0 only when no mandatory requirement failed."""
        return (
            1 if any(v.status == "failed" and v.id in MANDATORY for v in self.requirements) else 0
        )


def _ids(items: Iterable[ProbeResult | Skipped], limit: int = 6) -> str:
    ids = [i.probe.id for i in items]
    more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def _reasons(items: Iterable[Skipped]) -> str:
    seen: list[str] = []
    for s in items:
        if s.reason not in seen:
            seen.append(s.reason)
    return "; ".join(seen)


def judge_requirements(
    results: Iterable[ProbeResult], skipped: Iterable[Skipped], not_applicable: Mapping[str, str]
) -> tuple[RequirementVerdict, ...]:
    """One verdict per requirement M1..M15, U1..U9 (see the module docstring)."""
    results, skipped = list(results), list(skipped)
    out = []
    for rid, name in REQUIREMENTS.items():
        if rid in not_applicable:
            out.append(RequirementVerdict(rid, name, "not-applicable", not_applicable[rid]))
            continue
        rs = [r for r in results if r.probe.requirement == rid]
        untested = [s for s in skipped if s.probe.requirement == rid and s.status == "not-tested"]
        na = [s for s in skipped if s.probe.requirement == rid and s.status == "not-applicable"]
        bad = [r for r in rs if r.verdict == "unexpected"]
        broken = [r for r in rs if r.verdict == "broken-probe"]
        status: ReqStatus
        if bad:
            status, reason = "failed", f"{len(bad)} of {len(rs)} probes unexpected: {_ids(bad)}"
        elif broken:
            status, reason = "not-tested", f"{len(broken)} broken probes: {_ids(broken)}"
        elif not rs and untested:
            status, reason = "not-tested", _reasons(untested)
        elif not rs and na:
            status, reason = "not-applicable", _reasons(na)
        elif not rs:
            status, reason = "not-tested", "no probe for it was selected"
        elif untested:
            status = "not-tested"
            reason = (
                f"partially: {len(rs)} probes ok, {len(untested)} not tested ({_reasons(untested)})"
            )
        else:
            status, reason = (
                "met",
                f"{len(rs)} probes ok" + (f", {len(na)} not applicable here" if na else ""),
            )
        out.append(RequirementVerdict(rid, name, status, reason))
    return tuple(out)


def summary_line(report: Report) -> str:
    """`N observations: A allowed, D denied, U unexpected` (+ errors/broken when any)."""
    line = (
        f"{len(report.results)} observations: {report.allowed} allowed, {report.denied} denied, "
        f"{report.unexpected} unexpected"
    )
    extra = []
    if report.errors:
        extra.append(f"{report.errors} errors")
    if report.broken:
        extra.append(f"{report.broken} broken probes")
    if report.skipped:
        extra.append(f"{len(report.skipped)} not run")
    return line + (f" ({', '.join(extra)})" if extra else "")


_STATUS_TEXT = {
    "met": "met",
    "failed": "FAILED",
    "not-applicable": "not applicable",
    "not-tested": "not tested",
}


def _req_line(v: RequirementVerdict) -> str:
    return f"{v.id} {v.name}: {_STATUS_TEXT[v.status]} — {v.reason}"


def to_json(report: Report) -> dict[str, Any]:
    """The whole report, each probe's raw evidence included (docs/design.md section 6)."""
    return {
        "backend": report.backend,
        "env": report.env,
        "started": report.started,
        "wall_s": round(report.wall_s, 2),
        "summary": {
            "observations": len(report.results),
            "allowed": report.allowed,
            "denied": report.denied,
            "unexpected": report.unexpected,
            "errors": report.errors,
            "broken_probes": report.broken,
            "not_run": len(report.skipped),
        },
        "requirements": {v.id: v.status for v in report.requirements},
        "requirement_reasons": {v.id: v.reason for v in report.requirements},
        "probes": [
            {
                "id": r.probe.id,
                "category": r.probe.category,
                "requirement": r.probe.requirement,
                "description": r.probe.description,
                "expected": r.probe.expected,
                "observed": r.observed,
                "verdict": r.verdict,
                "evidence": r.evidence,
                "wall_s": round(r.wall_s, 3),
                "raw": dict(r.raw),
            }
            for r in report.results
        ],
        "not_run": [
            {
                "id": s.probe.id,
                "category": s.probe.category,
                "requirement": s.probe.requirement,
                "description": s.probe.description,
                "status": s.status,
                "reason": s.reason,
            }
            for s in report.skipped
        ],
        "notes": list(report.notes),
        "exit": report.exit_code,
    }


def _md(text: str, limit: int = 2000) -> str:
    # Evidence is what a probe's sandbox printed: inert Markdown, bounded.
    return md(text, limit)


def to_markdown(report: Report) -> str:
    lines = [
        f"# corral verify — backend `{report.backend}` (env `{report.env}`)",
        "",
        f"Started {report.started}, {report.wall_s:.1f} s. {summary_line(report)}.",
        "",
        "## Requirements",
        "",
        "| id | requirement | verdict | why |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {v.id} | {v.name} | {_STATUS_TEXT[v.status]} | {_md(v.reason)} |"
        for v in report.requirements
    ]
    lines += [
        "",
        "## Probes",
        "",
        "| probe | category | req | expected | observed | verdict | evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.probe.id} | {r.probe.category} | {r.probe.requirement} | {r.probe.expected} "
        f"| {r.observed} | "
        f"{r.verdict} | {_md(r.evidence, 300)} |"
        for r in report.results
    ]
    if report.skipped:
        lines += ["", "## Not run", "", "| probe | req | status | reason |", "|---|---|---|---|"]
        lines += [
            f"| {s.probe.id} | {s.probe.requirement} | {s.status} | {_md(s.reason)} |"
            for s in report.skipped
        ]
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {_md(n)}" for n in report.notes]
    return "\n".join(lines) + "\n"


_VERDICT_STYLE = {"ok": "green", "unexpected": "bold red", "broken-probe": "yellow"}
_STATUS_STYLE = {
    "met": "green",
    "failed": "bold red",
    "not-applicable": "dim",
    "not-tested": "yellow",
}


def render(report: Report, console: Console) -> None:
    """The human view: table, summary, problems with evidence, requirement lines."""
    table = Table(
        title=f"corral verify — backend {report.backend} (env {report.env})", show_lines=False
    )
    for col in ("probe", "category", "req", "expected", "observed", "verdict"):
        table.add_column(col, no_wrap=col != "probe")
    for r in report.results:
        style = _VERDICT_STYLE[r.verdict]
        table.add_row(
            text(r.probe.id),
            text(r.probe.category),
            text(r.probe.requirement),
            text(r.probe.expected),
            text(r.observed),
            text(r.verdict, style=style),
        )
    console.print(table)
    console.print(summary_line(report) + f" in {report.wall_s:.1f} s")
    problems = [r for r in report.results if r.verdict != "ok"]
    if problems:
        console.print("\n[bold]Not as expected[/]")
        for r in problems:
            console.print(
                Text(f"  {r.probe.id} ({r.probe.requirement}, {r.verdict}): ")
                + text(r.evidence, limit=300),
                highlight=False,
            )
    console.print("\n[bold]Requirements[/]")
    for v in report.requirements:
        console.print(text(_req_line(v), style=_STATUS_STYLE[v.status], limit=2000))
    for n in report.notes:
        console.print(text(n, style="dim", limit=2000))
