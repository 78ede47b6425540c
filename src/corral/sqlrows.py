"""SQLite rows into frozen records, by column name (the journal and the run store).

Both databases select columns named like the fields of a frozen dataclass
and read rows with `sqlite3.Row`; `record()` maps one onto the other, so no
caller keeps a list of column positions in step with its SELECT.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["record"]

T = TypeVar("T")


def record(
    cls: type[T],
    row: sqlite3.Row,
    *,
    convert: Mapping[str, Callable[[Any], Any]] | None = None,
    given: Mapping[str, Any] | None = None,
) -> T:
    """`cls` with each field from the column of its name, through `convert[name]`
    when there is one; fields in `given` are taken from there instead."""
    conv = convert or {}
    values: dict[str, Any] = dict(given or {})
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            value = row[f.name]
            values[f.name] = conv[f.name](value) if f.name in conv else value
    return cls(**values)
