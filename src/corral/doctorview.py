"""How `corral doctor` shows its layers: one line a layer, what to do under a missing one (pure).

On a terminal a layer that works takes one line (its detail cut at the edge;
`--json` has all of it); a missing layer gets its whole reason and what to do,
folded at the edge. Not on a terminal, the same lines are printed in full
without styling. Reasons can quote what a probed binary printed (an agent
CLI's version): every value goes through `corral.display.show`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from corral.display import show, text

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["plain_lines", "render_layers"]


def plain_lines(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The layers as unstyled lines: `ok|MISSING LAYER REASON`, then `  -> HINT`."""
    width = max((len(show(r["layer"], 40)) for r in rows), default=0)
    out: list[str] = []
    for r in rows:
        mark = "ok     " if r["available"] else "MISSING"
        out.append(f"{mark} {show(r['layer'], 40):<{width}}  {show(r['reason'], 400)}")
        if not r["available"] and r["hint"]:
            out.append(f"        -> {show(r['hint'], 400)}")
    return out


def render_layers(rows: Sequence[Mapping[str, object]]) -> RenderableType:
    """The layers for a terminal: a borderless grid that fits any width."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, width=7)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    for r in rows:
        reason = text(r["reason"], limit=400)
        if r["available"]:
            reason.no_wrap, reason.overflow = True, "ellipsis"
            grid.add_row(text("ok", style="green"), text(r["layer"]), reason)
            continue
        reason.overflow = "fold"
        grid.add_row(text("MISSING", style="bold red"), text(r["layer"]), reason)
        if r["hint"]:
            hint = text(f"-> {show(r['hint'], 400)}", style="yellow")
            hint.overflow = "fold"
            grid.add_row("", "", hint)
    return grid
