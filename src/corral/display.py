"""Show sandbox data as data (pure; no rich import until `text()` is called).

Anything a sandbox produced — a request target, a file name, an agent's
final message, a probe's evidence — reaches a terminal or a Markdown file
only through this module:

* `show(value)` makes a bounded, printable string: control characters (C0,
  DEL, C1), format characters (bidi overrides and isolates, zero-width
  characters, BOM), line/paragraph separators and lone surrogates become
  visible escapes (`\\x1b`, `\\u202e`, `\\xff` for an undecodable byte), and a
  value longer than `limit` ends in an ellipsis and the count of what was cut;
* `text(value)` wraps that in a `rich.text.Text`, which rich never parses
  for markup (`[link=...]` stays literal);
* `md(value)` / `md_code(value)` make it inert Markdown for report files:
  HTML-significant characters as entities, Markdown punctuation backslash-escaped
  (a table cell's `|` included), or a code span whose fence is longer than any
  backtick run inside.

Round trips are not a goal: the output is for eyes, the raw value stays in
the journal/state (and in `--json` output, where json escapes it).
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["DEFAULT_LIMIT", "md", "md_code", "show", "text"]

#: Characters of escaped output before a value is cut (one table cell, one line).
DEFAULT_LIMIT = 300

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

#: Printable in category terms but able to hide or reorder text on a terminal.
_ALSO_ESCAPED = frozenset("\u115f\u1160\u3164\uffa0\u2800\ufffc")


def _escape(ch: str, keep_newlines: bool) -> str | None:
    """The visible escape of `ch`, or None when `ch` may be shown as it is."""
    if ch == "\n" and keep_newlines:
        return None
    o = ord(ch)
    if 0x20 <= o < 0x7F:
        return None
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    cat = unicodedata.category(ch)
    if cat in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") or ch in _ALSO_ESCAPED:
        if o < 0x100:
            return f"\\x{o:02x}"
        if o < 0x10000:
            return f"\\u{o:04x}"
        return f"\\U{o:08x}"
    return None


def _as_text(value: object) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return value
    return str(value)


def show(value: object, limit: int = DEFAULT_LIMIT, *, multiline: bool = False) -> str:
    """`value` (str, bytes or anything with a str) as a bounded, printable string.

    The result holds no C0/C1 control, DEL, format, separator, private-use,
    unassigned or surrogate code point (with `multiline`, `\\n` is kept) and
    has at most `limit` characters plus a short `… (+N chars)` suffix.
    """
    raw = _as_text(value)
    out: list[str] = []
    used = 0
    for i, ch in enumerate(raw):
        piece = _escape(ch, multiline) or ch
        if used + len(piece) > limit:
            out.append(f"\u2026 (+{len(raw) - i} chars)")
            break
        out.append(piece)
        used += len(piece)
    return "".join(out)


def text(value: object, style: str = "", limit: int = DEFAULT_LIMIT) -> Text:
    """`show(value)` as a rich Text: rich renders it as it is, never as markup."""
    from rich.text import Text

    return Text(show(value, limit), style=style, end="")


#: Characters that start Markdown syntax anywhere in a line (CommonMark inlines,
#: GFM tables, strikethrough, math extensions, `scheme:`/`user@` autolinks).
#: Line-start syntax (`#`, `-`, `1.`) cannot occur: values never start a line.
_MD_PUNCT = frozenset("\\`*_[]|~$:@#")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """`show(value)` as inert Markdown text, safe mid-line and in a table cell.

    `<`, `>` and `&` become entities (no HTML, no `<...>` autolink, no entity
    reference survives); emphasis, code, link/image brackets, cell breaks and
    autolink triggers (`:`, `@`, the dot of `www.`) are backslash-escaped.
    """
    out: list[str] = []
    shown = show(value, limit)
    for i, ch in enumerate(shown):
        if ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_PUNCT or (ch == "." and shown[max(0, i - 3) : i].lower() == "www"):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def md_code(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """`show(value)` as a Markdown code span (literal text), safe in a table cell."""
    body = show(value, limit)
    longest = run = 0
    for ch in body:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    # A GFM table splits cells at `|` even inside code spans; `\|` is the escape
    # it honours there. Spaces keep a leading/trailing backtick off the fence.
    return f"{fence} {body.replace('|', chr(92) + '|')} {fence}"
