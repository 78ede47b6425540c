"""How `corral status` shows runs: a table, wrapped records, or plain lines (pure).

The same three shapes as `corral log` (`corral.broker.logview`): a table on a
terminal at least `WIDE` columns wide, one block a run below that, and one
`key=value` line a run when the output is not a terminal. Run state is read
back from files a crashed or hostile run may have left: every value goes
through `corral.display.show`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.display import show, text

if TYPE_CHECKING:
    from rich.console import RenderableType

    from corral.run.control import RunStatus

__all__ = ["WIDE", "detail_lines", "plain_line", "render_statuses"]

WIDE = 120

_REASON_LIMIT = 120


def _started(created: str) -> str:
    # ISO 8601 in UTC as the store writes it: `2026-12-01T10:21:07.123+00:00`.
    return f"{created[:16]}Z" if len(created) >= 16 else created


def _fields(st: RunStatus) -> list[tuple[str, str]]:
    d = st.to_json_dict()
    return [
        ("run", d["id"]),
        ("agent", st.run.agent),
        ("started", _started(st.run.created)),
        ("state", d["state"]),
        ("session", f"{d['session']}/{d['max_sessions']}"),
        ("checks", f"{d['checks_passed']}/{d['checks_total']}"),
        ("allowed", str(st.allowed)),
        ("denied", str(st.denied)),
        ("memory", f"{st.run.peak_memory >> 20}/{st.run.memory_cap >> 20} MiB"),
        ("ended", st.run.end_reason or ""),
    ]


def _quoted(value: str) -> str:
    if value and not any(c in value for c in ' "='):
        return value
    return '"' + value.replace('"', '\\"') + '"'


def plain_line(st: RunStatus) -> str:
    """One run as one printable line of `key=value` fields."""
    return " ".join(
        f"{k}={_quoted(show(v, _REASON_LIMIT if k == 'ended' else 80))}"
        for k, v in _fields(st)
        if k != "ended" or v
    )


def _table(statuses: list[RunStatus]) -> RenderableType:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    table.add_column("run", overflow="fold", min_width=12)
    for col in ("agent", "started", "state", "session", "checks", "allowed", "denied"):
        table.add_column(col, no_wrap=True)
    table.add_column("memory peak/cap", no_wrap=True)
    table.add_column("ended because", overflow="fold", min_width=20, ratio=1)
    for st in statuses:
        # Text cells: a str cell is rich markup.
        table.add_row(*(text(v, limit=_REASON_LIMIT) for _, v in _fields(st)))
    return table


def _records(statuses: list[RunStatus]) -> RenderableType:
    from rich.console import Group
    from rich.table import Table

    parts: list[RenderableType] = []
    for st in statuses:
        f = dict(_fields(st))
        head = text(f["run"], style="bold")
        head.no_wrap, head.overflow, head.end = False, "fold", "\n"
        parts.append(head)
        body = Table.grid(padding=(0, 1))
        body.add_column(width=2)
        body.add_column(no_wrap=True, style="dim", min_width=7)
        body.add_column(overflow="fold", ratio=1)
        body.add_row("", "state", text(f"{f['state']}  (agent {f['agent']})"))
        body.add_row("", "started", text(f["started"]))
        body.add_row(
            "",
            "progress",
            text(
                f"session {f['session']}, checks {f['checks']}, "
                f"allowed {f['allowed']}, denied {f['denied']}, memory {f['memory']}"
            ),
        )
        if f["ended"]:
            body.add_row("", "ended", text(f["ended"], limit=_REASON_LIMIT))
        parts.append(body)
    return Group(*parts)


def render_statuses(statuses: list[RunStatus], width: int) -> RenderableType:
    """What a terminal `width` columns wide shows for `statuses`."""
    return _table(statuses) if width >= WIDE else _records(statuses)


def detail_lines(st: RunStatus) -> list[str]:
    """One run's failed checks, denied actions and processes killed at teardown, as lines.

    The values are escaped already (`corral.run.rundetail`); each line is cut
    again so no field can make it wrap into something that looks like another.
    """
    d = st.detail
    if d is None:
        return []
    out = [f"failed check {show(n, 80)}: {show(r, _REASON_LIMIT)}" for n, r in d.failed_checks]
    out += [
        f"denied {a.count}x {show(a.kind, 40)} {show(a.target, 120)}"
        + (f" (rule {show(a.rule, 60)})" if a.rule else "")
        for a in d.denied
    ]
    if d.denied_groups_left_off:
        out.append(f"denied: {d.denied_groups_left_off} more kinds of action (corral log)")
    out += [
        f"killed at teardown: {k.count} in {show(k.env, 20)} session {show(k.session, 20)}"
        + (f": {show(', '.join(k.names), 200)}" if k.names else "")
        for k in d.killed
    ]
    return out
