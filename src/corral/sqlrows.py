"""Database rows into frozen records, by column name (the journal and the run stores).

The databases select columns named like the fields of a frozen dataclass
and read rows by name (`sqlite3.Row`, or a PostgreSQL row zipped with its
column names); `record()` maps one onto the other, so no caller keeps a list
of column positions in step with its SELECT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["Row", "named", "record"]

T = TypeVar("T")


class Row(Protocol):
    """A row whose columns are read by name (`sqlite3.Row`, a mapping)."""

    def __getitem__(self, key: str, /) -> Any: ...


def named(names: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    """A positional row as a mapping, its columns called `names` in order."""
    if len(names) != len(row):
        raise ValueError(f"row of {len(row)} columns for {len(names)} names")
    return dict(zip(names, row, strict=True))


def record(
    cls: type[T],
    row: Row,
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
