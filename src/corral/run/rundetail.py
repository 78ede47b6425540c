"""What went wrong in a run, for report.md and `corral status RUN` (reads, never writes).

- the failed checks of the last session that ran its checks, with their
  reason lines (already bounded and escaped by `corral.run.verdict`);
- the denied actions from the journal, grouped by (kind, target, rule) and
  counted, the `TOP_DENIED` most frequent first;
- the processes killed at teardown, per environment and session, with the
  names the host read from /proc (`ExecResult.killed_names`).

Targets, rules and process names were chosen by a sandbox: every string is
cut in SQL before it is read (a row can hold megabytes) and escaped with
`corral.display.show` here; renderers escape again for their medium.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.display import show
from corral.run.store import CheckResult

__all__ = ["TOP_DENIED", "DeniedAction", "KilledAtTeardown", "RunDetail", "run_detail"]

#: Denied (kind, target, rule) groups listed; the rest is counted.
TOP_DENIED = 10
#: Process names listed per environment and session.
MAX_NAMES = 16
_CUT = 300


@dataclass(frozen=True, slots=True)
class DeniedAction:
    kind: str
    target: str
    rule: str
    count: int


@dataclass(frozen=True, slots=True)
class KilledAtTeardown:
    env: str
    session: str
    count: int
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RunDetail:
    failed_checks: tuple[tuple[str, str], ...] = ()
    denied: tuple[DeniedAction, ...] = ()
    denied_groups_left_off: int = 0
    killed: tuple[KilledAtTeardown, ...] = ()

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "failed_checks": [{"name": n, "reason": r} for n, r in self.failed_checks],
            "denied_actions": [
                {"kind": d.kind, "target": d.target, "rule": d.rule, "count": d.count}
                for d in self.denied
            ],
            "denied_groups_left_off": self.denied_groups_left_off,
            "killed_at_teardown": [
                {"env": k.env, "session": k.session, "count": k.count, "names": list(k.names)}
                for k in self.killed
            ],
        }


def _names(detail: str) -> tuple[str, ...]:
    try:
        doc = json.loads(detail)
    except ValueError:
        return ()
    raw = doc.get("names") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        return ()
    return tuple(show(n, 40) for n in raw[:MAX_NAMES] if isinstance(n, str))


def _journal(path: Path, run_id: str) -> tuple[list[DeniedAction], int, list[KilledAtTeardown]]:
    if not path.is_file():
        return [], 0, []
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            groups = conn.execute(
                "SELECT substr(kind, 1, ?), substr(target, 1, ?), substr(coalesce(rule, ''), 1, ?),"
                " COUNT(*) AS n FROM observations WHERE run = ? AND decision = 'deny'"
                " AND kind != 'process_event' GROUP BY kind, target, rule"
                " ORDER BY n DESC, MIN(id) LIMIT ?",
                (_CUT, _CUT, _CUT, run_id, TOP_DENIED + 1),
            ).fetchall()
            total = conn.execute(
                "SELECT COUNT(*) FROM (SELECT 1 FROM observations WHERE run = ? AND"
                " decision = 'deny' AND kind != 'process_event' GROUP BY kind, target, rule)",
                (run_id,),
            ).fetchone()[0]
            kills = conn.execute(
                "SELECT substr(env, 1, 40), substr(coalesce(session, '-'), 1, 40),"
                " substr(detail, 1, 4096) FROM observations WHERE run = ? AND"
                " kind = 'process_event' AND target = 'killed_at_teardown' ORDER BY id LIMIT 200",
                (run_id,),
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return [], 0, []
    denied = [
        DeniedAction(show(k, 40), show(t, 200), show(r, 80), int(n))
        for k, t, r, n in groups[:TOP_DENIED]
    ]
    killed: list[KilledAtTeardown] = []
    for env, session, detail in kills:
        try:
            count = int(json.loads(detail).get("count", 0))
        except (ValueError, AttributeError, TypeError):
            count = 0
        killed.append(KilledAtTeardown(show(env, 40), show(session, 40), count, _names(detail)))
    return denied, max(0, int(total) - len(denied)), killed


def run_detail(
    journal: Path, run_id: str, last_checks: list[CheckResult] | tuple[CheckResult, ...]
) -> RunDetail:
    """The detail of run `run_id` (its journal; the last session's check results)."""
    denied, left_off, killed = _journal(journal, run_id)
    failed = tuple((show(c.name, 120), show(c.reason, 200)) for c in last_checks if not c.passed)
    return RunDetail(failed, tuple(denied), left_off, tuple(killed))
