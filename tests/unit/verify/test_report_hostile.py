"""`corral verify`'s renderings with hostile probe evidence (what a sandbox printed)."""

from __future__ import annotations

import io
import re

from markdown_it import MarkdownIt
from rich.console import Console

from corral.verify.model import ProbeResult
from corral.verify.report import Report, render, to_markdown
from tests.unit.verify.test_report import make_report, probe

EVIDENCE = (
    "[/x] [link=file:///etc/passwd]x[/link] \x1b]8;;file:///etc/passwd\x1b\\osc\x1b[2J\r"
    "\u202e <script>alert(1)</script> </table> | [x](javascript:alert(1)) ![i](http://x/i)"
)


def _report() -> Report:
    return make_report([ProbeResult(probe("a"), "allowed", "unexpected", EVIDENCE, 0.1, {})])


def test_render_shows_evidence_literally() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=300, force_terminal=True, color_system="truecolor")
    render(_report(), console)
    out = buf.getvalue()
    assert re.search(r"\x1b(?!\[[0-9;]*m)", out) is None, "a non-SGR escape reached the terminal"
    assert "\r" not in out and "\u202e" not in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "[/x] [link=file:///etc/passwd]x[/link] \\x1b]8;;" in plain


def test_markdown_evidence_is_inert() -> None:
    source = to_markdown(_report())
    assert "<script>" not in source and "\x1b" not in source
    html = MarkdownIt("commonmark").enable("table").render(source)
    assert "<script" not in html and "<a " not in html and "<img" not in html
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", html, re.S) if "javascript" in r)
    assert row.count("<td") == 7
