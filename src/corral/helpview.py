"""`corral exec --help` in the layout typer gives every other command.

`corral exec` parses with argparse (it starts once per sandboxed command and
must not import typer); only when help is asked for is rich imported here to
draw the same panels: a usage line, the description, an Options box.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["print_argparse_help"]


def _rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        shorts = [s for s in action.option_strings if not s.startswith("--")]
        if action.nargs == 0:
            metavar = ""
        elif action.metavar is not None:
            metavar = str(action.metavar)
        else:
            metavar = "<text>"
        text = action.help or ""
        if action.choices is not None and not isinstance(action.metavar, str):
            text = f"{text} ({' | '.join(map(str, action.choices))})".strip()
        if isinstance(action, argparse._AppendAction):
            text += " [repeatable]"
        if action.dest == "help":
            text = "Show this message and exit."
        rows.append((", ".join(longs), ", ".join(shorts), metavar, text))
    # typer lists --help last.
    return sorted(rows, key=lambda r: r[0] == "--help")


def print_argparse_help(parser: argparse.ArgumentParser, usage: str) -> None:
    """Print `parser`'s help as typer would (rich panels) on stdout."""
    from rich import box
    from rich.console import Console, Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column(style="bold green", no_wrap=True)
    grid.add_column(style="bold yellow", no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for longs, shorts, metavar, text in _rows(parser):
        grid.add_row(Text(longs), Text(shorts), Text(metavar), Text(text))
    console = Console(file=sys.stdout)
    console.print(
        Group(
            Padding(Text.assemble(("Usage: ", "yellow"), (usage, "bold")), (1, 1, 0, 1)),
            Padding(Text(parser.description or ""), (1, 1)),
            Panel(grid, title="Options", title_align="left", border_style="dim", box=box.ROUNDED),
        )
    )
