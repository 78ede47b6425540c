"""JSON from a sandbox, parsed only after its size and shape are bounded (pure).

`json.loads` turns bytes into objects at roughly 30x their size (a list of
empty dicts: ~60 bytes of dict per 3 bytes of text) and holds the GIL while it
does, so an unbounded body both inflates the host's memory and stalls the
event loop serving it. `check` refuses, before any object is built, a body
that is too large, nests too deep (the C decoder recurses once per level), or
holds too many values; what passes it costs at most a bounded multiple of
`max_values`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from corral.errors import CorralError

__all__ = [
    "DEFAULT_BOUNDS",
    "BodyTooLarge",
    "JsonBounds",
    "JsonRefused",
    "check",
    "loads",
]

# Possessive quantifiers: the scan is linear and never backtracks, even on an
# unterminated string.
_STRING: Final = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKETS: Final = re.compile(rb"[\[\]{}]")


class JsonRefused(CorralError, ValueError):
    """A JSON body from a sandbox was refused before it was parsed."""


class BodyTooLarge(JsonRefused):
    """The body is over its byte limit (HTTP 413)."""


@dataclass(frozen=True)
class JsonBounds:
    """What one body may cost: bytes, nesting depth, values (array items + members)."""

    max_bytes: int = 8 << 20
    max_depth: int = 128
    max_values: int = 1 << 19


DEFAULT_BOUNDS: Final = JsonBounds()


def check(raw: bytes, bounds: JsonBounds = DEFAULT_BOUNDS) -> None:
    """Raise JsonRefused unless `raw` is within `bounds` (no object is built)."""
    if len(raw) > bounds.max_bytes:
        raise BodyTooLarge(f"body of {len(raw)} bytes is over the {bounds.max_bytes}-byte limit")
    structure = _STRING.sub(b"", raw)
    # Every value but the first is preceded by a comma or follows a colon;
    # counted outside strings this bounds the objects the parser would make.
    values = structure.count(b",") + structure.count(b":") + 1
    containers = structure.count(b"[") + structure.count(b"{")
    if max(values, containers) > bounds.max_values:
        raise JsonRefused(
            f"body holds {max(values, containers)} values, over the limit of {bounds.max_values}"
        )
    depth = 0
    for m in _BRACKETS.finditer(structure):
        if m.group() in (b"[", b"{"):
            depth += 1
            if depth > bounds.max_depth:
                raise JsonRefused(f"body nests deeper than {bounds.max_depth} levels")
        else:
            depth -= 1


def loads(raw: bytes, bounds: JsonBounds = DEFAULT_BOUNDS) -> Any:
    """`json.loads(raw)` after `check`; malformed JSON raises ValueError as json does."""
    check(raw, bounds)
    try:
        return json.loads(raw)
    except RecursionError as exc:  # pragma: no cover - check() bounds depth first
        raise JsonRefused("body nests too deep") from exc
