"""`corral` commands of the sandbox area."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this area's commands to the corral app."""
