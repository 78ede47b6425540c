"""One line per finished category for `corral verify` on a terminal (pure).

The progress bar is transient; these lines stay above it, so a long run
shows which categories are done and how they went while the rest runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

__all__ = ["CategoryTally"]


class CategoryTally:
    """Counts finished probes per category; says when a category is complete."""

    def __init__(self, categories: Iterable[str]) -> None:
        self._total: Counter[str] = Counter(categories)
        self._done: Counter[str] = Counter()
        self._outcomes: dict[str, Counter[str]] = {c: Counter() for c in self._total}

    def add(self, category: str, outcome: str) -> str | None:
        """Record one probe of `category`; the category's line once its last probe is in."""
        if category not in self._total:
            return None
        self._done[category] += 1
        self._outcomes[category][outcome] += 1
        if self._done[category] != self._total[category]:
            return None
        parts = ", ".join(f"{n} {o}" for o, n in sorted(self._outcomes[category].items()))
        finished = sum(1 for c in self._total if self._done[c] == self._total[c])
        return (
            f"{category}: {self._total[category]} probes done ({parts}); "
            f"{finished}/{len(self._total)} categories"
        )
