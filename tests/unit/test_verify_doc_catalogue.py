"""docs/verify.md names every registered probe, so the catalogue cannot drift.

An id counts as documented when docs/verify.md mentions it in backticks,
literally or by a pattern: `prefix-*` (any tail) or `a-b-x|y` (the last
segment's alternatives). A pattern needs a literal prefix ending in a
segment (`proc-*`), so a bare `*` documents nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from corral.verify.probes import all_probes

DOC = Path(__file__).resolve().parents[2] / "docs" / "verify.md"
_SPAN = re.compile(r"`([^`\n]+)`")
_TOKEN = re.compile(r"[a-z0-9*|-]+")


def _patterns(text: str) -> list[re.Pattern[str]]:
    out: list[re.Pattern[str]] = []
    for span in _SPAN.findall(text):
        for token in _TOKEN.findall(span):
            first, *alts = token.split("|")
            words = [first]
            head = first.rsplit("-", 1)[0]
            words += [f"{head}-{alt}" if "-" not in alt else alt for alt in alts]
            for word in words:
                literal = word.split("*", 1)[0]
                if "*" in word and "-" not in literal:
                    continue
                body = ".*".join(re.escape(part) for part in word.split("*"))
                out.append(re.compile(rf"{body}\Z"))
    return out


def undocumented(text: str, ids: list[str]) -> list[str]:
    pats = _patterns(text)
    return [i for i in ids if not any(p.match(i) for p in pats)]


def test_every_registered_probe_id_is_in_verify_md() -> None:
    ids = [p.id for p in all_probes()]
    missing = undocumented(DOC.read_text(encoding="utf-8"), ids)
    assert missing == [], f"probe ids not named in docs/verify.md: {missing}"


def test_patterns_match_only_what_they_say() -> None:
    text = "`files-read-*` and `audit-journal-landlock|seccomp` and `*` and `ne*`"
    ids = ["files-read-ssh", "audit-journal-seccomp", "audit-journal-oom", "net-dns-udp"]
    assert undocumented(text, ids) == ["audit-journal-oom", "net-dns-udp"]
