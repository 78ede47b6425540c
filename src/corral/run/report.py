"""`report.md`: what a run did, rendered from its state (pure).

Text fields may come from the sandbox (an end reason quotes the agent's
error, a run's failure quotes git about workspace names): each goes through
`corral.display.md`/`md_code`, so the file holds no HTML, link, image or
table break the agent wrote, only its text, escaped and bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.display import md, md_code
from corral.run.mission import Mission
from corral.run.rundetail import RunDetail
from corral.run.store import CheckResult, RunRecord, SessionRecord

__all__ = ["render_detail", "render_report"]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _cell(text: str) -> str:
    return md(text, 200)


def render_report(
    mission: Mission,
    run: RunRecord,
    sessions: Sequence[SessionRecord],
    checks: Mapping[int, Sequence[CheckResult]],
    *,
    allowed: int,
    denied: int,
    run_dir: str | None = None,
) -> str:
    """The Markdown report of a run."""
    log_dir = run_dir or f".corral/runs/{run.id}"
    done = [s for s in sessions if s.state == "done"]
    last = checks.get(done[-1].n, []) if done else []
    passing = sum(1 for c in last if c.passed)
    lines = [
        f"# corral run {md(run.id)}",
        "",
        f"- mission: {md(mission.name)} ({md_code(mission.path)})",
        f"- agent: {md(run.agent)}; provider: {md(run.provider)}",
        f"- state: **{md(run.state)}** - {md(run.end_reason or '', 500)}",
        f"- sessions: {len(sessions)} ({len(done)} completed) of at most {run.max_sessions}",
        f"- checks passing after the last session: {passing}/{len(last)}",
        f"- observations: {allowed} allowed, {denied} denied ({md_code(f'corral log {log_dir}')})",
        f"- run memory: kernel peak {_mib(run.peak_memory)} of the {_mib(run.memory_cap)} cap",
        f"- tokens: {sum(s.tokens for s in sessions)}",
        f"- last commit: {md_code(run.last_commit or '-')}",
        "",
        "## Sessions",
        "",
        "| # | state | ended because | agent exit | tokens | wall s | killed at end "
        "| product ready | checks | run peak | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sessions:
        ready = "-" if s.product_ready is None else ("yes" if s.product_ready else "no")
        lines.append(
            f"| {s.n} | {_cell(s.state)} | {_cell(s.end_reason or '')} | "
            f"{'-' if s.agent_exit is None else s.agent_exit} | {s.tokens} | {s.wall_s:.1f} | "
            f"{s.processes_killed} | {ready} | {s.checks_passed}/{s.checks_total} | "
            f"{_mib(s.run_peak_memory)} | {md_code((s.commit_sha or '-')[:12])} |"
        )
    for s in sessions:
        results = checks.get(s.n, [])
        if not results:
            continue
        lines += [
            "",
            f"## Checks after session {s.n}",
            "",
            "| check | result | reason | s |",
            "|---|---|---|---|",
        ]
        for c in results:
            lines.append(
                f"| {_cell(c.name)} | {'pass' if c.passed else 'FAIL'} | {_cell(c.reason)} | "
                f"{c.duration_s:.2f} |"
            )
    return "\n".join(lines) + "\n"


def render_detail(detail: RunDetail) -> str:
    """The sections on what went wrong: denied actions and processes killed at teardown."""
    lines = ["", "## Denied actions", ""]
    if detail.denied:
        lines += ["| kind | target | rule | count |", "|---|---|---|---|"]
        lines += [
            f"| {_cell(d.kind)} | {md_code(d.target, 200)} | {_cell(d.rule or '-')} | {d.count} |"
            for d in detail.denied
        ]
        if detail.denied_groups_left_off:
            lines += ["", f"and {detail.denied_groups_left_off} more (see `corral log`)"]
    else:
        lines.append("none")
    lines += ["", "## Processes killed at teardown", ""]
    if detail.killed:
        lines += ["| environment | session | count | names |", "|---|---|---|---|"]
        lines += [
            f"| {_cell(k.env)} | {_cell(k.session)} | {k.count} | "
            f"{_cell(', '.join(k.names) or '-')} |"
            for k in detail.killed
        ]
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"
