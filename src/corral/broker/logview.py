"""How `corral log` shows journal rows: a table, wrapped records, or plain lines (pure).

* a terminal at least `WIDE` columns wide: one table, the free-text columns
  (target, rule, reason) folding inside a guaranteed minimum width;
* a narrower terminal: one record per block, its fixed fields on the first
  line and target/rule/reason on indented lines that fold at the edge;
* not a terminal (a pipe, a file, `--follow` into `grep`): one record per line,
  `key=value` fields with no tab and no control character, each line bounded.

Every value went through `corral.display.show`: a journal row carries what
the sandbox asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.display import show, text

if TYPE_CHECKING:
    from rich.console import RenderableType

    from corral.broker.journal import JournalRow

__all__ = ["WIDE", "plain_line", "render_rows"]

#: Below this many columns the fixed columns (~70) leave target/rule/reason too little.
WIDE = 120

_COLOURS = {"allow": "green", "deny": "bold red", "observe": "cyan"}

#: Per-field bounds of a plain line: a line stays under ~400 characters.
_PLAIN_LIMITS = {"target": 120, "rule": 40, "reason": 80}


def _quoted(value: str) -> str:
    if value and not any(c in value for c in ' "='):
        return value
    # For eyes, not a round trip: show() already wrote backslash escapes.
    return '"' + value.replace('"', '\\"') + '"'


def plain_line(r: JournalRow) -> str:
    """One record as one printable line of `key=value` fields."""
    fields = (
        ("id", str(r.id)),
        ("time", r.time[11:19]),
        ("env", r.env),
        ("kind", r.kind),
        ("decision", r.decision),
        ("target", r.target),
        ("rule", r.rule or "-"),
        ("reason", r.reason),
        ("bytes", f"{r.bytes_up}/{r.bytes_down}"),
    )
    return " ".join(f"{k}={_quoted(show(v, _PLAIN_LIMITS.get(k, 40)))}" for k, v in fields)


def _table(rows: list[JournalRow]) -> RenderableType:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", expand=True)
    for column in ("id", "time", "env", "kind", "decision"):
        table.add_column(column, no_wrap=True)
    for column, least in (("target", 24), ("rule", 12), ("reason", 20)):
        table.add_column(column, overflow="fold", ratio=1, min_width=least)
    table.add_column("bytes up/down", no_wrap=True)
    for r in rows:
        # Every cell is a Text: a str cell would be parsed as rich markup.
        table.add_row(
            text(r.id),
            text(r.time[11:19]),
            text(r.env),
            text(r.kind),
            text(r.decision, style=_COLOURS.get(r.decision, "")),
            text(r.target),
            text(r.rule or ""),
            text(r.reason),
            text(f"{r.bytes_up}/{r.bytes_down}"),
        )
    return table


def _records(rows: list[JournalRow]) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = []
    for r in rows:
        head = Text(no_wrap=False, overflow="fold")
        head.append_text(text(f"#{r.id} {r.time[11:19]} {r.env} {r.kind} "))
        head.append_text(text(r.decision, style=_COLOURS.get(r.decision, "bold")))
        head.append_text(text(f"  {r.bytes_up}/{r.bytes_down} B"))
        parts.append(head)
        body = Table.grid(padding=(0, 1))
        body.add_column(width=2)
        body.add_column(no_wrap=True, style="dim", min_width=6)
        body.add_column(overflow="fold", ratio=1)
        body.add_row("", "target", text(r.target))
        if r.rule:
            body.add_row("", "rule", text(r.rule))
        body.add_row("", "reason", text(r.reason))
        parts.append(body)
    return Group(*parts)


def render_rows(rows: list[JournalRow], width: int) -> RenderableType:
    """What a terminal `width` columns wide shows for `rows`."""
    return _table(rows) if width >= WIDE else _records(rows)
