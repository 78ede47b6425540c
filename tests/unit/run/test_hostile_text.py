"""Agent-controlled text in report.md and the progress displays stays text (issue 9, item 7).

An agent controls its error message, and the coordinator quotes it as the
session's end reason ("agent failed: ..."), in the run's end reason and in
progress lines. These render that text the way corral does and check the
rendering: Markdown through a CommonMark+tables parser (raw HTML enabled,
as many viewers have it), rich output byte for byte.
"""

from __future__ import annotations

import io
import re
import threading
import time

from markdown_it import MarkdownIt
from rich.console import Console

from corral.run.progress import LiveProgress, PlainProgress
from corral.run.report import render_report
from corral.run.store import CheckResult, RunRecord
from tests.unit.run.test_core import MISSION, _session

HOSTILE = (
    "agent failed: <script>alert(1)</script></table></td> | forged | pass |"
    " [x](javascript:alert(1)) ![img](http://x.example/i.png) <img src=x onerror=alert(1)>"
    " **bold** `code` http://x.example/auto www.x.example <http://x.example/a>"
    " &lt;entity&gt; [link=file:///etc/passwd]x[/link] [/x]"
    " \x1b]8;;file:///etc/passwd\x1b\\osc\x1b[2J\r\u202e\n## heading\n| a | b |"
)


def _run(end_reason: str) -> RunRecord:
    return RunRecord(
        id="demo-1",
        mission="demo",
        state="failed",
        agent="script",
        provider="synthetic:x",
        max_sessions=3,
        created="t",
        updated="t",
        coordinator_pid=None,
        stop_requested=False,
        end_reason=end_reason,
        memory_cap=1 << 30,
        peak_memory=50 << 20,
        base_commit="a",
        last_commit="b`c",
    )


def _report() -> str:
    return render_report(
        MISSION,
        _run(f"corral error: {HOSTILE}"),
        [_session(1, end_reason=HOSTILE, state="done")],
        {1: [CheckResult("unit", False, "exit 1", 1, 0.1, HOSTILE)]},
        allowed=1,
        denied=2,
    )


def test_report_md_source_has_agent_text_escaped() -> None:
    text = _report()
    for raw in ("<script>", "</table>", "<img", "](javascript:", "![img](", "\x1b", "\r"):
        assert raw not in text, raw
    assert "&lt;script&gt;" in text
    assert "\\[x\\](javascript\\:alert(1))" in text
    assert r"\\x1b\]8;;file\:///etc/passwd\\x1b" in text
    # The session row is still one row of the declared 11 cells.
    row = next(line for line in text.splitlines() if line.startswith("| 1 | done |"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 12


def test_report_md_renders_agent_text_as_text() -> None:
    html = MarkdownIt("commonmark").enable("table").render(_report())
    for tag in ("<script", "<a ", "<img", "<em", "<strong>bold", "<code>code", "<h2>heading"):
        assert tag not in html, tag
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "[x](javascript:alert(1))" in html  # shown to the reader, literally
    assert "\\x1b]8;;file:///etc/passwd\\x1b" in html
    # Every row of the sessions table has its 11 cells; no agent `|` made more.
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        assert row.count("<td") in (0, 11, 4), row[:200]


def test_plain_progress_lines_are_escaped_and_bounded() -> None:
    out = io.StringIO()
    p = PlainProgress(out)
    p.line(f"session 1: {HOSTILE * 50}")
    p.update(session=1, phase="commit", activity=HOSTILE, state="failed")
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    lines = text.splitlines()
    assert len(lines) == 2 and all(len(line) < 700 for line in lines)
    assert "[link=file:///etc/passwd]x[/link]" in text


def test_live_panel_shows_markup_literally() -> None:
    live = LiveProgress.__new__(LiveProgress)  # the panel without starting a Live display
    live._state = {
        "run": "[/x]",
        "session": 1,
        "max_sessions": "[link=file:///etc/passwd]3[/link]",
        "phase": "agent",
        "activity": HOSTILE,
        "state": "[/]",
        "allowed": "[/a]",
        "denied": 2,
    }
    live._started = time.monotonic()
    live._lock = threading.Lock()
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=True, color_system="truecolor")
    console.print(live._render())
    out = buf.getvalue()
    assert re.search(r"\x1b(?!\[[0-9;]*m)", out) is None, "a non-SGR escape reached the terminal"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "[/x]" in plain and "[link=file:///etc/passwd]3[/link]" in plain
    assert "\\x1b]8;;" in plain and "\r" not in plain
