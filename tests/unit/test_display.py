"""corral.display: sandbox values shown as data (properties over arbitrary input)."""

from __future__ import annotations

import html as htmllib
import io
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from rich.console import Console
from rich.table import Table

from corral.display import md, md_code, show, text

_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}

#: Strings biased towards what attacks use: markup, escapes, bidi, surrogates.
_ATOMS = st.sampled_from(
    [
        "[link=file:///etc/passwd]x[/link]",
        "[/x]",
        "[bold red]",
        "\x1b]8;;http://evil/\x1b\\",
        "\x1b[2J",
        "\x9b31m",
        "\r",
        "\n",
        "\u202e",
        "\u2066",
        "\u200b",
        "\ufeff",
        "\udcff",
        "\ud800",
        "<script>",
        "</table>",
        "|",
        "`",
        "```",
        "[x](javascript:alert(1))",
        "![img](http://x.example/i.png)",
        "http://x.example/",
        "&amp;",
        ":smile:",
        "\\",
    ]
)
_HOSTILE = st.lists(st.one_of(_ATOMS, st.text(max_size=20)), max_size=30).map("".join)


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


@settings(max_examples=400)
@given(_HOSTILE, st.integers(min_value=1, max_value=400))
def test_show_is_printable_single_line_and_bounded(value: str, limit: int) -> None:
    out = show(value, limit)
    assert not any(_unsafe(ch) for ch in out), repr(out)
    assert "\n" not in out
    assert len(out) <= limit + len(f"\u2026 (+{len(value)} chars)")


@given(st.binary(max_size=200))
def test_show_bytes_is_printable(value: bytes) -> None:
    out = show(value)
    assert not any(_unsafe(ch) for ch in out)
    out.encode("utf-8")  # no lone surrogate survives: printing cannot raise


@given(_HOSTILE)
def test_show_multiline_keeps_only_newlines(value: str) -> None:
    out = show(value, 10_000, multiline=True)
    assert not any(_unsafe(ch) and ch != "\n" for ch in out)


def test_show_escapes_are_visible() -> None:
    assert show("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert show("\u202eexe.txt") == "\\u202eexe.txt"
    assert show(b"bad\xff.txt") == "bad\\xff.txt"
    assert show("new\nline\r") == "new\\nline\\r"
    assert show("x" * 100_000, 50) == "x" * 50 + "\u2026 (+99950 chars)"


@settings(max_examples=200)
@given(_HOSTILE)
def test_rich_text_never_parses_markup_or_emits_escapes(value: str) -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=True, color_system="truecolor")
    table = Table("cell")
    table.add_row(text(value))
    console.print(table)
    console.print(text(value))
    out = buf.getvalue()
    # rich's own styling only: SGR sequences (ESC [ ... m). No OSC (links), no other CSI.
    stripped = out.replace("\x1b[0m", "")
    for seq in stripped.split("\x1b")[1:]:
        assert seq.startswith("["), repr(seq[:20])
        head = seq[1:].split("m", 1)[0]
        assert all(c.isdigit() or c == ";" for c in head), repr(seq[:20])
    assert "\x9b" not in out and "\r" not in out
    assert "\u202e" not in out


def _rendered_html(source: str) -> str:
    # CommonMark with raw HTML on, plus GFM tables (linkify needs a package we lack).
    return str(MarkdownIt("commonmark").enable("table").render(source))


@settings(max_examples=300)
@given(_HOSTILE)
def test_md_cell_renders_as_plain_text(value: str) -> None:
    cell = md(value)
    assert "\n" not in cell
    source = f"| h |\n|---|\n| {cell} |\n"
    html = _rendered_html(source)
    assert "<a " not in html and "<img" not in html and "<script" not in html
    assert "<code" not in html and "<em" not in html and "<strong" not in html
    # One cell: no `|` in the value split the row.
    assert html.count("<td") == 1
    # And the reader sees the value itself, as text.
    cell_html = html.split("<td>", 1)[1].split("</td>", 1)[0]
    assert htmllib.unescape(cell_html).strip() == show(value).strip()


@settings(max_examples=300)
@given(_HOSTILE)
def test_md_code_is_one_code_span(value: str) -> None:
    cell = md_code(value)
    html = _rendered_html(f"| h |\n|---|\n| {cell} |\n")
    assert html.count("<td") == 1
    assert html.count("<code>") == 1
    assert "<a " not in html and "<img" not in html and "<script" not in html


def test_md_examples() -> None:
    assert md("<script>") == "&lt;script&gt;"
    assert md("[x](javascript:y)") == "\\[x\\](javascript\\:y)"
    assert md("must fail (run)") == "must fail (run)"
    assert md("www.x.example") == "www\\.x.example"
    assert md("a|b") == "a\\|b"
    assert md_code("a`b") == "`` a`b ``"
