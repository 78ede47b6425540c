"""A small TOML writer for the config documents corral generates (pure).

Python ships a TOML reader (`tomllib`) but no writer. Corral only writes
documents it builds itself: nested tables of strings, integers, floats,
booleans and lists, so this is enough. Output is deterministic (keys in the
order given) so that golden tests can compare it byte for byte, and every
document round-trips through `tomllib.loads`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from corral.errors import ConfigError

__all__ = ["dumps", "key", "value"]

# fullmatch, not `^…$`: `$` also matches before a trailing newline, which
# would write the key "a\n" bare and break the document.
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def key(name: str) -> str:
    """A key, bare when TOML allows it, else a quoted string."""
    return name if _BARE.fullmatch(name) else _string(name)


def _string(text: str) -> str:
    # JSON's escapes are a subset of TOML's basic-string escapes; DEL is the one
    # control character JSON leaves raw and TOML forbids.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def value(obj: Any) -> str:
    """One TOML value: scalars, arrays, and mappings as inline tables."""
    if isinstance(obj, bool):
        return "true" if obj else "false"
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ConfigError(f"cannot write {obj!r} to TOML")
        return repr(obj)
    if isinstance(obj, str):
        return _string(obj)
    if isinstance(obj, Mapping):
        inner = ", ".join(f"{key(str(k))} = {value(v)}" for k, v in obj.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(obj, Sequence):
        return "[" + ", ".join(value(v) for v in obj) + "]"
    raise ConfigError(f"cannot write a {type(obj).__name__} to TOML")


def dumps(doc: Mapping[str, Any]) -> str:
    """`doc` as a TOML document; nested mappings become `[tables]`, None values are left out."""
    lines: list[str] = []
    _table(doc, (), lines)
    return "\n".join(lines).strip("\n") + "\n"


def _table(doc: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    tables: list[tuple[str, Mapping[str, Any]]] = []
    body: list[str] = []
    for k, v in doc.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((str(k), v))
        else:
            body.append(f"{key(str(k))} = {value(v)}")
    if path and (body or not tables):
        lines.append("")
        lines.append("[" + ".".join(key(p) for p in path) + "]")
    lines.extend(body)
    for name, sub in tables:
        _table(sub, (*path, name), lines)
