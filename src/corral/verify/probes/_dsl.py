"""Small helpers shared by the probe modules (pure)."""

from __future__ import annotations

import textwrap

__all__ = ["code"]


def code(text: str) -> str:
    """Normalise an indented probe snippet."""
    return textwrap.dedent(text).strip() + "\n"
