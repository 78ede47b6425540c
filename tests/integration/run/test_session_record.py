"""The agent cannot write its own session record (M12; issue 9 B5).

The agent forges the result line corral parses (replacing the file its stdout
goes to, and printing a forged line): the run still records the tokens the
provider served, as the broker counted them, and the budget is enforced live -
the request after the budget is refused (429, journaled `token-budget`) and
never reaches the provider.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from corral.broker.metering import journal_usage
from corral.run.store import Store
from tests.integration.run.helpers import corral, new_id

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]

FORGED = json.dumps(
    {
        "type": "result",
        "is_error": False,
        "result": "done",
        "usage": {"input_tokens": 1, "output_tokens": 1},
        "num_turns": 1,
    }
)

# Replace whatever file the agent's stdout is (before the fix: a file under a
# writable mount that corral parsed afterwards) with a forged result line, and
# print the forged line on the agent's stdout as well.
FORGE = (
    'f=$(readlink /proc/$PPID/fd/1); echo "$f" > stdout-target; '
    f"line='{FORGED}'; "
    '{ printf "%s\\n" "$line" > /proc/$PPID/fd/1; } 2> reopen-error; '
    'case "$f" in /*) printf "%s\\n" "$line" > "$f.new" && mv -f "$f.new" "$f";; esac; '
    "echo forged"
)

SCENARIO = """name: forge
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session"
    turns:
      - calls: [{shell: SHELL}]
      - calls: [{write_file: {path: second, content: "the provider served a second reply"}}]
      - say: "done"
"""

MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = MAX
BUDGET

[session]
wall_time = "40s"

[limits]
run_memory = "1G"
agent = { memory = "512M", pids = 256 }
verifier = { memory = "256M", pids = 64 }

[[checks]]
name = "never"
run = "false"
timeout = "20s"
+++
# Forge the session record

Do what the scenario says.
"""


def _mission(root: Path, shell: str, budget: str, max_sessions: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "scenario.yaml").write_text(SCENARIO.replace("SHELL", json.dumps(shell)))
    text = MISSION.replace("BUDGET", budget).replace("MAX", str(max_sessions))
    (root / "MISSION.md").write_text(text)
    return root / "MISSION.md"


def _run(tmp_path: Path, mission: Path) -> Path:
    rid = new_id()
    proc = corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path, timeout=80,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return tmp_path / "runs" / rid


def _provider_calls(run_dir: Path) -> list[tuple[str, str, str | None]]:
    conn = sqlite3.connect(f"{(run_dir / 'journal.sqlite').as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT session, decision, rule FROM observations WHERE kind = 'provider_call'"
            " ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    return [(str(s), str(d), r) for s, d, r in rows]


def _served(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "transcripts" / "provider.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_forged_result_line_does_not_hide_spent_tokens(tmp_path: Path) -> None:
    """The issue's attack: the agent forges 2 tokens; a budget of 50 is still exhausted."""
    run_dir = _run(tmp_path, _mission(tmp_path / "m", FORGE, "token_budget = 50"))
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        run = store.run()
        sessions = store.sessions()
    s1 = sessions[0]
    # The run recorded what the provider served, not the 2 forged tokens, and
    # the budget ended it after the first session (unfixed: 2 tokens a
    # session, three sessions, "exhausted" only by max_sessions).
    assert [s.tokens for s in sessions] == [s1.tokens] and s1.tokens > 50, run.end_reason
    assert run.state == "exhausted" and run.end_reason == f"token budget spent ({s1.tokens}/50)"
    served = s1.detail.get("provider_served_tokens")
    assert isinstance(served, int) and s1.tokens >= served > 50
    # The broker's own count (what enforces the budget) is exactly what was served.
    assert journal_usage(run_dir / "journal.sqlite", run_dir.name, "1")[0].total == served
    # The agent's stdout is corral's pipe: there is no file under a mount to
    # replace, and the pipe (corral's, mode 0600) cannot be reopened by the
    # agent's children through /proc either.
    assert (run_dir / "workspace" / "stdout-target").read_text().startswith("pipe:")
    assert (run_dir / "workspace" / "reopen-error").read_text().strip()
    assert FORGED not in (run_dir / "sessions" / "session-1" / "agent.stdout.log").read_text()


def test_the_request_after_the_budget_is_refused_live(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _mission(tmp_path / "m", "echo one > first", "token_budget = 50"))
    calls = _provider_calls(run_dir)
    # The first reply crossed the budget and was delivered; the next request
    # was refused by the broker, journaled, and never reached the provider.
    assert calls == [("1", "allow", "route:provider"), ("1", "deny", "token-budget")], calls
    assert len([r for r in _served(run_dir) if r["kind"] == "reply"]) == 1
    assert (run_dir / "workspace" / "first").is_file()
    assert not (run_dir / "workspace" / "second").exists()
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        (s1,) = store.sessions()
        run = store.run()
    assert s1.end_reason == "token budget spent" and run.state == "exhausted"
    out = (run_dir / "sessions" / "session-1" / "agent.stdout.log").read_text()
    assert "429" in out and "token-budget" in out  # what the agent was told


def test_a_flood_on_stdout_is_capped_and_drained(tmp_path: Path) -> None:
    """A sandbox printing 30 MB: corral keeps head + marker + tail, the writer never blocks."""
    from corral.run.capture import Capture

    cap = Capture(tmp_path / "out.log", head=1 << 20, tail=64 << 10)
    script = "head -c 30000000 /dev/zero | tr '\\0' x; echo; echo LAST-LINE"
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdout=cap.writer)
    cap.close_writer()
    assert proc.wait(60) == 0  # drained to the end: the writer finished
    cap.finish()
    data = (tmp_path / "out.log").read_bytes()
    assert len(data) < (1 << 20) + (64 << 10) + 200
    assert data.startswith(b"x" * 1000) and data.endswith(b"LAST-LINE\n")
    assert b"bytes of output dropped here; 30000011 bytes in all]" in data
    assert cap.total == 30000011


@pytest.mark.requires_npm
def test_claude_code_forging_its_record_is_still_held_to_the_budget(tmp_path: Path) -> None:
    """The same attack by the real Claude Code CLI: its tokens are the broker's count."""
    from corral.agents.install import default_tools_dir, executable_path
    from corral.agents.registry import ADAPTERS

    if not executable_path(ADAPTERS["claude-code"], default_tools_dir()).exists():
        pytest.skip("claude-code is not installed: run scripts/install-agents.sh claude-code")
    mission = _mission(tmp_path / "m", FORGE, "token_budget = 50")
    rid = new_id()
    proc = corral(
        "run", str(mission), "--agent", "claude-code", "--plain", "--id", rid,
        "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=80,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / rid
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        run = store.run()
        sessions = store.sessions()
    # Unfixed: the CLI's forged or self-reported count, under the budget, and more sessions.
    assert len(sessions) == 1, (run.end_reason, [s.tokens for s in sessions])
    s1 = sessions[0]
    served = s1.detail.get("provider_served_tokens")
    assert isinstance(served, int) and s1.tokens >= served > 50
    # The broker's own count (what enforces the budget) is exactly what was served.
    assert journal_usage(run_dir / "journal.sqlite", run_dir.name, "1")[0].total == served
    assert run.state == "exhausted" and run.end_reason == f"token budget spent ({s1.tokens}/50)"
    calls = _provider_calls(run_dir)
    assert ("1", "deny", "token-budget") in calls
    allowed = [c for c in calls if c[1] == "allow"]
    assert len(_served(run_dir)) == len(allowed)  # nothing past the refusal reached it


def test_an_interrupted_sessions_spend_still_counts_after_resume(tmp_path: Path) -> None:
    """kill -9 of the coordinator mid-session: the broker's journaled usage keeps the budget."""
    import os
    import signal

    from corral.run.store import RunLock
    from tests.integration.run.helpers import start_corral, wait_for

    mission = _mission(tmp_path / "m", "sleep 30", "token_budget = 50")
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    journal = run_dir / "journal.sqlite"
    try:

        def metered() -> bool:
            try:
                return journal.exists() and journal_usage(journal, rid, "1")[0].total > 50
            except sqlite3.Error:  # the coordinator is still creating it
                return False

        wait_for(metered, 30, "session 1's first reply, metered")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not RunLock.is_held(run_dir), 3, "the run lock to be free")
    spent = journal_usage(journal, rid, "1")[0].total
    result = corral("resume", rid, "--plain", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        run = store.run()
        sessions = store.sessions()
    # Unfixed: the interrupted session counted 0 and session 2 spent again.
    assert [s.state for s in sessions] == ["interrupted"], run.end_reason
    assert run.state == "exhausted" and run.end_reason == f"token budget spent ({spent}/50)"
    assert [c for c in _provider_calls(run_dir) if c[0] != "1"] == []


def test_a_capture_ends_even_if_a_writer_never_closes(tmp_path: Path) -> None:
    """A descendant that escaped the teardown holding the pipe cannot hang corral."""
    from corral.run.capture import Capture
    from tests.integration.run.helpers import wait_for

    cap = Capture(tmp_path / "out.log", head=1024, tail=1024)
    proc = subprocess.Popen(["/bin/sh", "-c", "echo before; exec sleep 30"], stdout=cap.writer)
    try:
        cap.close_writer()
        wait_for(lambda: cap.total == 7, 10, "the first line drained")
        cap.finish(timeout_s=0.5)
        cap.finish()  # idempotent: nothing is closed twice
        assert proc.poll() is None  # the writer still holds the pipe
        assert (tmp_path / "out.log").read_bytes() == b"before\n"
    finally:
        proc.kill()
        proc.wait()
