"""The prompt of each agent session, built from the mission and what happened so far (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.run.mission import Mission
from corral.run.store import CheckResult, SessionRecord

__all__ = ["build_prompt"]

_OUTPUT_TAIL = 1500


def _check_line(c: CheckResult) -> str:
    out = c.output.strip()
    tail = f"\n    output: {out[-_OUTPUT_TAIL:]}" if out else ""
    return f"  - {c.name}: {c.reason}{tail}"


def build_prompt(
    mission: Mission,
    n: int,
    previous: Sequence[SessionRecord],
    last_checks: Sequence[CheckResult],
) -> str:
    """Session `n`'s prompt: the product, the acceptance checks, earlier results, failures.

    The first line, `Session N of M.`, lets a scripted provider tell sessions apart.
    """
    s = mission.settings
    lines = [f"Session {n} of {s.max_sessions}.", "", "# The product", "", mission.description]
    lines += ["", "# Acceptance checks (run by corral after this session, not by you)", ""]
    for c in s.checks:
        if c.browser is not None:
            what = "a browser test of the product's pages (the mission's script)"
        else:
            what = f"`{c.run}`" if c.run is not None else f"HTTP {c.http} -> {c.expect_status}"
        lines.append(f"- {c.name}: {what}")
    if s.product is not None:
        lines += [
            "",
            f"The product is started from the workspace with `{s.product.command}` and must "
            f"listen on 127.0.0.1:{s.product.port}"
            + (
                f" (ready when GET {s.product.ready_path} answers)."
                if s.product.ready_path
                else "."
            ),
        ]
    if previous:
        lines += ["", "# Previous sessions", ""]
        for p in previous:
            checks = f"{p.checks_passed}/{p.checks_total} checks passed" if p.checks_total else ""
            lines.append(
                f"- session {p.n}: {p.state}, {p.end_reason or ''}"
                + (f"; {checks}" if checks else "")
                + (f"; agent said: {p.summary[:300]}" if p.summary else "")
            )
    failed = [c for c in last_checks if not c.passed]
    if failed:
        lines += ["", "# Checks that failed after the last session", ""]
        lines += [_check_line(c) for c in failed]
    lines += [
        "",
        "Work in the current directory (the workspace). Corral records the workspace when "
        "this session ends; make the failing checks pass.",
    ]
    return "\n".join(lines) + "\n"
