"""What the dashboard shows, read from run directories with every size capped.

A run directory holds text the agent and its product control (session
summaries, check output, journal targets, the workspace's history), so each
read here is capped before it is read: SQL `substr()` keeps SQLite from
handing long values to Python, files are read to a byte limit, rows to a
count, and the diff stops git at a byte cap. Pure readers; nothing here
writes to a run.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from corral.errors import CorralError
from corral.run.environments import RunLayout

if TYPE_CHECKING:
    from corral.broker.livepolicy import Proposal

__all__ = [
    "CheckView",
    "JournalView",
    "RunSummary",
    "SessionView",
    "journal_rows",
    "list_run_summaries",
    "live_proposals",
    "read_capped",
    "run_layout",
    "run_summary",
    "session_checks",
    "session_diff",
    "session_views",
]

MAX_RUNS: Final = 500
MAX_TEXT: Final = 4_000
MAX_OUTPUT: Final = 16_000
MAX_PROMPT: Final = 32_000
MAX_DIFF: Final = 256_000
MAX_TARGET: Final = 1_000
MAX_JOURNAL_ROWS: Final = 400
MAX_SESSIONS: Final = 200
#: Journal rows read to group proposals from (the newest ones), and proposals shown.
MAX_PROPOSAL_ROWS: Final = 20_000
MAX_PROPOSALS: Final = 50


def _clip(value: object, limit: int) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars, cut)"


@contextmanager
def _ro(path: Path) -> Iterator[sqlite3.Connection]:
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise CorralError(f"cannot open {path.name}: {exc}") from exc
    try:
        yield conn
    except sqlite3.Error as exc:
        raise CorralError(f"cannot read {path.name}: {exc}") from exc
    finally:
        conn.close()


def read_capped(path: Path, limit: int) -> str:
    """At most `limit` bytes of a file as text ('' when it cannot be read)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", errors="replace")
    return text + "… (cut)" if len(data) > limit else text


@dataclass(frozen=True, slots=True)
class RunSummary:
    id: str
    state: str
    active: bool
    agent: str
    sessions: int
    max_sessions: int
    checks_passed: int
    checks_total: int
    started: str
    peak_memory: int
    memory_cap: int
    end_reason: str


@dataclass(frozen=True, slots=True)
class SessionView:
    n: int
    state: str
    phase: str
    started: str
    ended: str
    end_reason: str
    commit: str
    tokens: int
    checks_passed: int
    checks_total: int
    summary: str
    run_peak_memory: int


@dataclass(frozen=True, slots=True)
class CheckView:
    name: str
    passed: bool
    reason: str
    exit: int | None
    duration_s: float
    output: str


@dataclass(frozen=True, slots=True)
class JournalView:
    id: int
    time: str
    session: str
    env: str
    kind: str
    target: str
    decision: str
    rule: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "time": self.time,
            "session": self.session,
            "env": self.env,
            "kind": self.kind,
            "target": self.target,
            "decision": self.decision,
            "rule": self.rule,
            "reason": self.reason,
        }


def run_layout(runs_dir: Path, run_id: str) -> RunLayout | None:
    """The run `run_id` directly under `runs_dir`; None for any other name."""
    if not run_id or run_id.startswith(".") or "/" in run_id or "\x00" in run_id:
        return None
    from corral.run.rundisk import ensure_mounted

    root = runs_dir / run_id
    if not root.is_dir():
        return None
    try:
        ensure_mounted(root)
    except (CorralError, OSError):
        return None
    if not (root / "state.sqlite").is_file():
        return None
    return RunLayout(root.absolute())


def run_summary(layout: RunLayout) -> RunSummary:
    from corral.run.store import RunLock

    with _ro(layout.state) as db:
        r = db.execute(
            "SELECT id, state, substr(agent,1,200), max_sessions, created, peak_memory,"
            " memory_cap, substr(coalesce(end_reason,''),1,?) FROM run",
            (MAX_TEXT,),
        ).fetchone()
        if r is None:
            raise CorralError(f"run {layout.run_id} has no state yet")
        n = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        last = db.execute(
            "SELECT checks_passed, checks_total FROM sessions WHERE checks_total > 0"
            " ORDER BY n DESC LIMIT 1"
        ).fetchone()
    active = RunLock.is_held(layout.root)
    state = str(r[1])
    if state == "running" and not active:
        state = "interrupted"
    return RunSummary(
        id=layout.run_id,
        state=state,
        active=active,
        agent=str(r[2]),
        sessions=int(n),
        max_sessions=int(r[3]),
        checks_passed=int(last[0]) if last else 0,
        checks_total=int(last[1]) if last else 0,
        started=str(r[4]),
        peak_memory=int(r[5]),
        memory_cap=int(r[6]),
        end_reason=_clip(r[7], MAX_TEXT),
    )


def list_run_summaries(runs_dir: Path) -> list[RunSummary]:
    """Every readable run under `runs_dir`, newest first (at most MAX_RUNS).

    Found as `corral status` finds them (`list_runs`, which mounts a run's
    disk image when it has one and it is not mounted).
    """
    from corral.run.control import list_runs

    try:
        layouts = list_runs(runs_dir)
    except (CorralError, OSError):
        return []
    out: list[RunSummary] = []
    for layout in reversed(layouts[-MAX_RUNS:]):
        try:
            out.append(run_summary(layout))
        except CorralError:
            continue
    return out


def session_views(layout: RunLayout) -> list[SessionView]:
    with _ro(layout.state) as db:
        rows = db.execute(
            "SELECT n, state, phase, started, coalesce(ended,''),"
            " substr(coalesce(end_reason,''),1,?), coalesce(commit_sha,''), tokens,"
            " checks_passed, checks_total, substr(summary,1,?), run_peak_memory"
            " FROM sessions ORDER BY n LIMIT ?",
            (MAX_TEXT, MAX_TEXT, MAX_SESSIONS),
        ).fetchall()
    return [
        SessionView(
            n=int(r[0]),
            state=str(r[1]),
            phase=str(r[2]),
            started=str(r[3]),
            ended=str(r[4]),
            end_reason=str(r[5]),
            commit=str(r[6])[:64],
            tokens=int(r[7]),
            checks_passed=int(r[8]),
            checks_total=int(r[9]),
            summary=str(r[10]),
            run_peak_memory=int(r[11]),
        )
        for r in rows
    ]


def session_checks(layout: RunLayout, n: int) -> list[CheckView]:
    with _ro(layout.state) as db:
        rows = db.execute(
            "SELECT substr(name,1,200), passed, substr(reason,1,?), exit, duration_s,"
            " substr(output,1,?) FROM checks WHERE session = ? ORDER BY name LIMIT 200",
            (MAX_TEXT, MAX_OUTPUT, n),
        ).fetchall()
    return [CheckView(str(r[0]), bool(r[1]), str(r[2]), r[3], float(r[4]), str(r[5])) for r in rows]


def session_prompt(layout: RunLayout, n: int) -> str:
    return read_capped(layout.session_dir(n) / "prompt.md", MAX_PROMPT)


def session_diff(layout: RunLayout, sessions: list[SessionView], n: int) -> str:
    """The workspace's diff from the commit before session `n` to session `n`'s commit."""
    from corral.hostgit import GitError, TrustedRepo

    commits = {s.n: s.commit for s in sessions}
    head = commits.get(n, "")
    if not head:
        return ""
    base = next((commits[k] for k in sorted(commits, reverse=True) if k < n and commits[k]), "")
    if not base:
        with _ro(layout.state) as db:
            row = db.execute("SELECT coalesce(base_commit,'') FROM run").fetchone()
        base = str(row[0]) if row else ""
    if not base or not all(c in "0123456789abcdef" for c in base + head):
        return ""
    repo = TrustedRepo(layout.git_dir, layout.workspace)
    try:
        data, cut = repo.diff_capped(base, head, MAX_DIFF)
    except GitError as exc:
        return f"(no diff: {_clip(exc, MAX_TEXT)})"
    text = data.decode("utf-8", errors="replace")
    return text + f"\n… (diff cut at {MAX_DIFF} bytes)" if cut else text


def journal_rows(
    layout: RunLayout, *, decision: str = "all", after_id: int = 0, limit: int = MAX_JOURNAL_ROWS
) -> list[JournalView]:
    """Journal observations, denied first, each field capped; `decision`: all|allow|deny."""
    if not layout.journal.is_file():
        return []
    where = ["id > ?"]
    args: list[Any] = [after_id]
    if decision in ("allow", "deny"):
        where.append("decision = ?")
        args.append(decision)
    sql = (
        "SELECT id, time, coalesce(session,''), substr(env,1,40), substr(kind,1,40),"
        f" substr(target,1,{MAX_TARGET + 1}), decision, substr(coalesce(rule,''),1,200),"
        f" substr(reason,1,{MAX_TARGET + 1}) FROM observations WHERE {' AND '.join(where)}"
        " ORDER BY decision = 'deny' DESC, id LIMIT ?"
    )
    args.append(min(limit, MAX_JOURNAL_ROWS))
    with _ro(layout.journal) as db:
        rows = db.execute(sql, args).fetchall()
    return [
        JournalView(
            id=int(r[0]),
            time=str(r[1])[:40],
            session=str(r[2])[:40],
            env=str(r[3]),
            kind=str(r[4]),
            target=_clip(r[5], MAX_TARGET),
            decision=str(r[6]),
            rule=str(r[7]),
            reason=_clip(r[8], MAX_TARGET),
        )
        for r in rows
    ]


def journal_max_id(layout: RunLayout) -> int:
    if not layout.journal.is_file():
        return 0
    with _ro(layout.journal) as db:
        row = db.execute("SELECT coalesce(max(id), 0) FROM observations").fetchone()
    return int(row[0])


def has_samples(layout: RunLayout) -> bool:
    try:
        return (layout.root / "footprint.jsonl").stat().st_size > 0
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class _ProposalRow:
    """The fields `livepolicy.proposals` reads, each already capped."""

    id: int
    time: str
    session: str | None
    kind: str
    target: str
    decision: str
    rule: str | None
    detail: dict[str, Any]


def live_proposals(layout: RunLayout) -> list[Proposal]:
    """The run's live-policy proposals (`corral proposals`), from its newest journal rows.

    Only the rows a proposal can come from are read (proposable denials, and
    the `policy` rows naming rules already added), at most
    `MAX_PROPOSAL_ROWS`; a target longer than `livepolicy` parses is cut one
    past its limit, so it still proposes nothing.
    """
    import json

    from corral.broker.livepolicy import PROPOSABLE_RULES, proposals

    if not layout.journal.is_file():
        return []
    marks = ",".join("?" for _ in PROPOSABLE_RULES)
    sql = (
        "SELECT id, substr(time,1,40), substr(session,1,80), kind, substr(target,1,2049),"
        " decision, rule, CASE WHEN kind = 'policy' THEN substr(detail,1,4096) ELSE '{}' END"
        " FROM observations WHERE (decision = 'deny' AND kind IN ('net_connect','http_request')"
        f" AND rule IN ({marks})) OR (kind = 'policy' AND decision = 'observe')"
        " ORDER BY id DESC LIMIT ?"
    )
    with _ro(layout.journal) as db:
        got = db.execute(sql, [*sorted(PROPOSABLE_RULES), MAX_PROPOSAL_ROWS]).fetchall()
    rows = []
    for r in reversed(got):
        try:
            detail = json.loads(r[7])
        except ValueError:
            detail = {}
        rows.append(
            _ProposalRow(
                id=int(r[0]),
                time=str(r[1]),
                session=None if r[2] is None else str(r[2]),
                kind=str(r[3]),
                target=str(r[4]),
                decision=str(r[5]),
                rule=None if r[6] is None else str(r[6]),
                detail=detail if isinstance(detail, dict) else {},
            )
        )
    return proposals(rows)[:MAX_PROPOSALS]
