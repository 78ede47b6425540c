"""The in-sandbox init's pure helpers (it runs without json, so it encodes by hand)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral._payload import init


@pytest.mark.parametrize("value", ['a"b\\c\n\x01', "é☃", "plain", "", 0, -3, 125, True, False])
def test_jvalue_round_trips(value: object) -> None:
    assert json.loads(init._jvalue(value)) == value


def test_report_writes_one_json_line() -> None:
    r, w = os.pipe()
    try:
        init._report(w, {"event": "exit", "code": 3, "message": 'x "y"\n'})
        line = os.read(r, 4096)
    finally:
        os.close(r)
        os.close(w)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"event": "exit", "code": 3, "message": 'x "y"\n'}


def test_which(tmp_path: Path) -> None:
    exe = tmp_path / "tool"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (tmp_path / "plain").write_text("")
    assert init._which("tool", f"/nonexistent:{tmp_path}") == str(exe)
    assert init._which("plain", str(tmp_path)) is None
    assert init._which(str(exe), "") == str(exe)
    assert init._which("missing", str(tmp_path)) is None


def test_usage_error_refuses() -> None:
    assert init.main(["3"]) == init.EXIT_REFUSED
