"""`corral` commands of the broker area: `corral log`; live policy (run/live_cli.py)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import RenderableType

    from corral.broker.journal import JournalRow

__all__ = ["journal_path", "register", "render_table"]


def journal_path(target: Path) -> Path:
    """A journal file, or the `journal.sqlite` of a run directory."""
    if target.is_dir():
        return target / "journal.sqlite"
    return target


def render_table(rows: list[JournalRow]) -> RenderableType:
    """The wide-terminal table `corral log` prints (pure)."""
    from corral.broker.logview import WIDE, render_rows

    return render_rows(rows, WIDE)


def _journal_of(ref: str, runs_dir: Path | None) -> Path:
    """A journal file, a run directory, or a run id/prefix (found like `corral status`)."""
    given = Path(ref)
    if given.exists() or "/" in ref or ref.endswith(".sqlite"):
        return journal_path(given)
    from corral.run.control import find_run
    from corral.run.runsdir import resolve_runs_dir

    return find_run(ref, resolve_runs_dir(runs_dir)).journal


def register(app: typer.Typer) -> None:
    """Add this area's commands to the corral app."""
    from corral.run import live_cli

    live_cli.register(app)

    @app.command("log")
    def log(  # noqa: PLR0917
        file: Annotated[
            str, typer.Argument(metavar="RUN", help="run id, run directory or journal file")
        ],
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
        runs_dir: Annotated[
            Path | None, typer.Option("--runs-dir", help="where runs live (as corral status)")
        ] = None,
    ) -> None:
        """Print the observations of a journal."""
        from rich.console import Console

        from corral.broker.journal import read_rows
        from corral.broker.logview import plain_line, render_rows
        from corral.display import show
        from corral.errors import JournalError, UsageError

        try:
            path = _journal_of(file, runs_dir)
        except UsageError as exc:
            typer.echo(f"corral log: {show(exc, 2000)}", err=True)
            raise typer.Exit(2) from exc
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
                elif not console.is_terminal:
                    # Piped: no table, whose width would be guessed; one line a record.
                    for row in rows:
                        sys.stdout.write(plain_line(row) + "\n")
                    sys.stdout.flush()
                elif rows or not follow:
                    console.print(render_rows(rows, console.width))
                if not follow:
                    return
                time.sleep(0.25)
        except JournalError as exc:
            typer.echo(f"corral log: {show(exc, 2000)}", err=True)
            raise typer.Exit(1) from exc
        except KeyboardInterrupt:
            return
