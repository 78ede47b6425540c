"""Manifests -> YAML text through a safe dumper: values are always data, never syntax."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

__all__ = ["dump_manifests"]


def dump_manifests(manifests: Iterable[dict[str, Any]]) -> str:
    """A multi-document YAML stream; every string is quoted or escaped as the dumper sees fit."""
    return yaml.safe_dump_all(
        list(manifests), sort_keys=False, default_flow_style=False, allow_unicode=False, width=100
    )
