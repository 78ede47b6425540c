"""A run whose agent leaves hostile names and hostile text (issue 9, items 7 and 8).

Session 1's agent (the script agent, driven by its scenario) creates files
whose names are not UTF-8, hold a newline, start with `-` or carry rich
markup; then it appends a forged `result` line to its own stdout, so its
error text — markup, HTML, Markdown links, terminal escapes — becomes the
session's end reason, and kills itself. The coordinator is SIGKILLed during
session 2's agent; `corral resume` restores the workspace from corral's
commit of session 1 (those names) and session 3 finishes the run. Everything is judged
on the host: the commits' trees, the restored workspace, the exit statuses
and the bytes `corral status` prints, and report.md's Markdown source.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from corral.hostgit import TrustedRepo
from corral.run.store import RunLock, Store
from tests.integration.run.helpers import (
    corral,
    in_phase,
    new_id,
    start_corral,
    wait_for,
    write_mission,
)

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(120)]

NAMES: tuple[bytes, ...] = (b"bad\xff.txt", b"new\nline", b"-rf", b"[red]x[link=file:]y")

#: What the agent says when it fails: markup, HTML, Markdown links, terminal
#: escapes. The script agent repeats a provider error's body in its result,
#: so a fault with this body makes it the session's end reason. (An agent's
#: child cannot write into the agent's own stdout: the pipe belongs to corral
#: and /proc/PID/fd reopening and pidfd_getfd are refused.)
HOSTILE = (
    "[/x] [link=file:///etc/passwd]x[/link] <script>alert(1)</script> </table> | pass |"
    " [x](javascript:alert(1)) ![img](http://x.example/i.png)"
    " \x1b]8;;file:///etc/passwd\x1b\\osc \x1b[2J \r \u202e end"
)

SCENARIO = """name: hostile
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls:
          - shell: "printf x > \\"$(printf 'bad\\\\377.txt')\\""
          - shell: "printf x > \\"$(printf 'new\\\\nline')\\""
          - shell: "printf x > ./-rf; printf x > '[red]x[link=file:]y'"
      - say: "unreachable"
        fault: {status: 500, body: HOSTILE_BODY}
  - prompt: "(?m)^Session 2 of"
    turns:
      - calls: [{shell: "sleep 60"}]
      - say: "slept"
  - prompt: "(?m)^Session [3-9] of"
    turns:
      - calls: [{write_file: {path: fixed, content: "yes"}}]
      - say: "fixed"
"""


def _tree(run_dir: Path, commit: str) -> set[bytes]:
    repo = TrustedRepo(run_dir / "git", run_dir / "workspace")
    out = repo.git("ls-tree", "-r", "-z", "--name-only", commit)
    return {p for p in out.split(b"\0") if p}


def _run_state(run_dir: Path) -> tuple[str, str | None]:
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        return s.run().state, s.run().end_reason


def _status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(COLUMNS="300", FORCE_COLOR="1")
    return corral("status", *args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=env)


def test_hostile_names_and_agent_text_survive_commit_resume_status_report(
    tmp_path: Path,
) -> None:
    mission = write_mission(tmp_path / "m")
    (tmp_path / "m" / "scenario.yaml").write_text(
        SCENARIO.replace("HOSTILE_BODY", json.dumps(HOSTILE))
    )
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    try:
        wait_for(
            lambda: in_phase(run_dir, 2, "agent") or proc.poll() is not None,
            90,
            "session 2's agent phase",
        )
        assert proc.poll() is None, f"the run ended early: {_run_state(run_dir)}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not RunLock.is_held(run_dir), 5, "the run lock to be free")
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        s1 = s.sessions()[0]
    assert s1.commit_sha, "corral did not commit session 1's workspace"
    assert set(NAMES) <= _tree(run_dir, s1.commit_sha)

    result = corral("resume", rid, "--plain", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        run = s.run()
        ss = s.sessions()
    assert run.state == "passed"
    assert [x.state for x in ss] == ["done", "interrupted", "done"]
    # The resumed workspace was restored from corral's commit: every name, as bytes.
    ws = os.fsencode(run_dir / "workspace")
    assert set(NAMES) <= set(os.listdir(ws))
    for name in NAMES:
        with open(os.path.join(ws, name), "rb") as fh:
            assert fh.read() == b"x"
    assert run.last_commit and set(NAMES) <= _tree(run_dir, run.last_commit)

    # The agent's error text is the session's end reason, raw in the state...
    assert ss[0].end_reason is not None
    assert ss[0].end_reason.startswith("agent failed: provider error")
    assert HOSTILE[:60] in ss[0].end_reason
    # ...and inert in report.md's Markdown source.
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    for raw in ("<script>", "</table>", "](javascript:", "![img](", "\x1b", "\r", "\u202e"):
        assert raw not in report, raw
    assert r"\[/x\] \[link=file\:///etc/passwd\]x\[/link\] &lt;script&gt;" in report

    status = _status(tmp_path)
    assert status.returncode == 0, status.stderr
    assert re.search(r"\x1b(?!\[[0-9;]*m)", status.stdout) is None
    status_json = _status(tmp_path, "--json")
    assert status_json.returncode == 0 and status_json.stdout.isascii()
    assert json.loads(status_json.stdout.splitlines()[0])["id"] == rid
