"""Manifests -> YAML text through a safe dumper: values are always data, never syntax."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

__all__ = ["dump_manifests"]


class _Dumper(yaml.SafeDumper):
    """No anchors or aliases: every object reads on its own, as `kubectl` shows it."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_manifests(manifests: Iterable[dict[str, Any]]) -> str:
    """A multi-document YAML stream; every string is quoted or escaped as the dumper sees fit."""
    return yaml.dump_all(
        list(manifests),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=False,
        width=100,
    )
