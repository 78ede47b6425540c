"""`corral verify`'s per-category progress lines (pure)."""

from __future__ import annotations

from corral.verify.tally import CategoryTally


def test_a_line_when_each_category_completes() -> None:
    tally = CategoryTally(["files", "network", "files"])
    assert tally.add("files", "ok") is None
    assert tally.add("network", "unexpected") == (
        "network: 1 probes done (1 unexpected); 1/2 categories"
    )
    assert tally.add("files", "not-tested") == (
        "files: 2 probes done (1 not-tested, 1 ok); 2/2 categories"
    )
    assert tally.add("privilege", "ok") is None
