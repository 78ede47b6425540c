"""Kubernetes names from mission text (pure): DNS-1123 labels, never raw input.

A mission's name, check names and paths are the user's (or a generated
mission's) text; none reaches a `metadata.name`, a label or a selector
unsanitized, so no mission can name another run's objects or break a
selector. Free text goes to annotations, whose values are data to the API.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["dns_label", "run_id_for"]

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


def dns_label(text: str, max_len: int = 63) -> str:
    """`text` as an RFC 1123 label: [a-z0-9-], starts and ends alphanumeric, at most `max_len`.

    A lossy result carries a digest of the original, so two different
    hostile names do not collapse into one object name.
    """
    slug = _NOT_LABEL.sub("-", text.lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)
    if slug != text or len(slug) > max_len:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        slug = f"{slug[: max_len - 9].strip('-')}-{digest}".strip("-")
    if not slug[:1].isalpha():
        slug = ("x" + slug)[:max_len].rstrip("-")
    return slug


def run_id_for(mission_name: str, mission_text: str) -> str:
    """A deterministic run id for a rendering: the mission's name and a digest of its text."""
    digest = hashlib.sha256(mission_text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{dns_label(mission_name, 40)}-{digest}"
