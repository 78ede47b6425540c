"""`corral` commands of the broker area: `corral log`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from corral.broker.journal import JournalRow

__all__ = ["journal_path", "register", "render_table"]

_COLOURS = {"allow": "green", "deny": "bold red", "observe": "cyan"}


def journal_path(target: Path) -> Path:
    """A journal file, or the `journal.sqlite` of a run directory."""
    if target.is_dir():
        return target / "journal.sqlite"
    return target


def render_table(rows: list[JournalRow]) -> Table:
    """The rich table `corral log` prints (pure)."""
    from rich.table import Table

    from corral.display import text

    table = Table(show_header=True, header_style="bold", expand=False)
    for column in ("id", "time", "env", "kind", "decision"):
        table.add_column(column, no_wrap=True)
    for column in ("target", "rule", "reason"):
        table.add_column(column, overflow="fold", ratio=1)
    table.add_column("bytes up/down", no_wrap=True)
    for r in rows:
        # Every cell is a Text: a journal row carries what the sandbox asked
        # for, and a str cell would be parsed as rich markup.
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


def register(app: typer.Typer) -> None:
    """Add this area's commands to the corral app."""

    @app.command("log")
    def log(
        file: Annotated[Path, typer.Argument(help="journal file or run directory")],
        denied: Annotated[bool, typer.Option("--denied", help="only denials")] = False,
        kind: Annotated[
            str | None, typer.Option("--kind", help="only this kind, e.g. http_request")
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="one JSON object per line (docs/design.md 6a)")
        ] = False,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="keep printing new rows")
        ] = False,
    ) -> None:
        """Print the observations of a journal."""
        from rich.console import Console

        from corral.broker.journal import read_rows
        from corral.errors import JournalError

        path = journal_path(file)
        console = Console()
        last = 0
        try:
            while True:
                rows = read_rows(path, denied_only=denied, kind=kind, after_id=last)
                if rows:
                    last = rows[-1].id
                if as_json:
                    for row in rows:
                        # ASCII-only JSON: a C1 control, a bidi override or a lone
                        # surrogate in a value reaches the terminal as a \u escape.
                        sys.stdout.write(json.dumps(row.to_json_dict()) + "\n")
                    sys.stdout.flush()
                elif rows or not follow:
                    console.print(render_table(rows))
                if not follow:
                    return
                time.sleep(0.25)
        except JournalError as exc:
            from corral.display import show

            typer.echo(f"corral log: {show(exc, 2000)}", err=True)
            raise typer.Exit(1) from exc
        except KeyboardInterrupt:
            return
