"""Parsing of human sizes and durations (pure)."""

from __future__ import annotations

import math
import re

from corral.errors import UsageError

__all__ = ["format_size", "parse_cpus", "parse_duration", "parse_size"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*$", re.IGNORECASE)
_DUR_MULT = {"ms": 0.001, "": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(text: str) -> int:
    """'512M', '2G', '1.5GiB', '4096' -> bytes. Binary multiples (K = 1024).

    Raises UsageError on anything else, including zero.
    """
    if text.strip().startswith("-"):
        raise UsageError(f"size must be positive: {text!r}")
    m = _SIZE_RE.match(text)
    if m is None:
        raise UsageError(f"invalid size {text!r} (examples: 512M, 2G, 1073741824)")
    value = float(m.group(1)) * _SIZE_MULT[m.group(2).lower()]
    if m.group(3) and not m.group(2) and m.group(3).lower() != "b":
        raise UsageError(f"invalid size {text!r}")
    n = int(value)
    if n <= 0:
        raise UsageError(f"size must be positive: {text!r}")
    return n


def parse_duration(text: str) -> float:
    """'600', '30s', '1.5m', '2h', '250ms' -> seconds (> 0)."""
    m = _DUR_RE.match(text)
    if m is None:
        raise UsageError(f"invalid duration {text!r} (examples: 30, 30s, 10m, 1h, 500ms)")
    value = float(m.group(1)) * _DUR_MULT[m.group(2).lower()]
    if value <= 0 or not math.isfinite(value):
        raise UsageError(f"duration must be positive: {text!r}")
    return value


def parse_cpus(text: str, available: int | None = None) -> float:
    """'0.5', '2' -> CPUs (> 0, at most 1024, and at most `available` when given)."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"invalid CPU count {text!r} (examples: 0.5, 1, 2)") from None
    if not (0 < value <= 1024) or not math.isfinite(value):
        raise UsageError(f"CPU count must be in (0, 1024]: {text!r}")
    if available is not None and value > available:
        # A quota above the host's CPUs limits nothing: refused rather than ignored.
        raise UsageError(f"CPU count {text} is more than the {available} CPUs this host has")
    return value


def format_size(n: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return f"{n}"
