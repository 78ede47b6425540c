"""`corral log` shows what a sandbox asked for as data (issue 9, item 7).

A sandbox chooses its request targets. Sent through the real broker,
`http://x.example/[/x]` used to make `corral log --denied` die with rich's
MarkupError (the denials were never shown) and `[link=file:///etc/passwd]`
became a terminal hyperlink. Values the broker's parser refuses on the wire
(ESC, CR, bidi overrides, C1) are written straight into the journal here, as
any journal writer may record them. The test runs the real `corral log` on
the host and reads its bytes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.broker.actions import HttpRequest, Identity, Observation
from corral.broker.config import BrokerConfig
from corral.broker.journal import Journal, read_rows

from .testlib import launch, raw_exchange

pytestmark = pytest.mark.timeout(60)

MARKUP = ("/[/x]", "/[link=file:///etc/passwd]x[/link]", "/[blink]spoofed[/]")
ESCAPES = (
    "/\x1b]8;;file:///etc/passwd\x1b\\click\x1b]8;;\x1b\\",
    "/\x1b[2J\x1b[Hcleared",
    "/ok\rdeny",
    "/\u202etxt.exe\u202c\u2066\u2069",
    "/\x9b31mcsi",
    "/zero\u200bwidth",
    "/" + "A" * 100_000,
)
#: rich's own styling: SGR only. Anything else (OSC 8 links, ED, cursor moves) came from data.
_NON_SGR = re.compile(r"\x1b(?!\[[0-9;]*m)")
_FORBIDDEN = ("\r", "\x9b", "\u202e", "\u202c", "\u2066", "\u2069", "\u200b", "\x07")


@pytest.fixture(scope="module")
def hostile_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    journal = tmp_path_factory.mktemp("log") / "journal.sqlite"
    broker = launch(BrokerConfig.model_validate({"rules": [], "system_dns": False}), journal)
    try:
        for path in MARKUP:
            reply, _ = raw_exchange(
                broker.port,
                f"GET http://x.example{path} HTTP/1.1\r\nHost: x.example\r\n\r\n".encode(),
            )
            assert reply.startswith(b"HTTP/1.1 403"), reply[:80]
        deadline = time.monotonic() + 10
        while len([r for r in read_rows(journal) if "x.example" in r.target]) < len(MARKUP):
            assert time.monotonic() < deadline, "the broker did not journal the denials"
            time.sleep(0.05)
    finally:
        broker.process.stop()
    who = Identity(run="r1", session="s1", env="agent")
    with Journal(journal) as j:
        for path in ESCAPES:
            j.append(
                Observation.of(
                    HttpRequest(host="x.example", port=80, method="GET", path=path),
                    who,
                    decision="deny",
                    rule="default-deny",
                    reason=f"no rule admits GET x.example:80{path}",
                )
            )
    return journal


def _log(journal: Path, *args: str, force_color: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["COLUMNS"] = "400"
    if force_color:
        env["FORCE_COLOR"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "corral", "log", str(journal), *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        env=env,
        timeout=60,
        check=False,
    )


def _assert_inert(out: str, max_line: int = 400) -> None:
    assert not _NON_SGR.search(out), repr(_NON_SGR.search(out))
    for ch in _FORBIDDEN:
        assert ch not in out, f"raw {ch!r} reached the terminal"
    visible = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert max(len(line) for line in visible.splitlines()) <= max_line  # COLUMNS=400


@pytest.mark.parametrize("args", [(), ("--denied",)], ids=["table", "denied"])
@pytest.mark.parametrize("force_color", [False, True], ids=["pipe", "terminal"])
def test_table_shows_markup_and_escapes_literally(
    hostile_journal: Path, args: tuple[str, ...], force_color: bool
) -> None:
    result = _log(hostile_journal, *args, force_color=force_color)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    _assert_inert(out)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    for path in MARKUP:
        assert f"http://x.example:80{path}" in plain, path
    assert "\\x1b]8;;file:///etc/passwd\\x1b\\click" in plain
    assert "\\x1b[2J\\x1b[Hcleared" in plain
    assert "ok\\rdeny" in plain
    assert "\\u202etxt.exe" in plain
    assert "\\x9b31mcsi" in plain
    assert "chars)" in plain  # the 100 kB target is cut, with a count
    assert len(out) < 40_000


def test_json_keeps_the_raw_value_escaped_by_json(hostile_journal: Path) -> None:
    result = _log(hostile_journal, "--json", "--denied")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.isascii()
    assert "\x1b" not in result.stdout
    targets = [json.loads(line)["target"] for line in result.stdout.splitlines()]
    for path in (*MARKUP, *ESCAPES):
        assert f"GET http://x.example:80{path}" in targets


def test_follow_shows_the_same_table(hostile_journal: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "out"
    env = dict(os.environ, COLUMNS="400")
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "log", str(hostile_journal), "--denied", "-f"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while b"chars)" not in out_path.read_bytes():
                assert proc.poll() is None, out_path.read_bytes()[-2000:]
                assert time.monotonic() < deadline, "corral log -f printed no table"
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(10)
    text = out_path.read_bytes().decode("utf-8", "surrogateescape")
    _assert_inert(text)
    assert "[/x]" in text and "MarkupError" not in text
