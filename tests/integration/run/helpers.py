"""Shared helpers for the run integration tests: a configurable mission, CLI calls, probes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from corral.run.runcg import RunCgroup
from corral.run.store import SessionRecord, Store

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"

SCENARIO = """name: crash
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{shell: "sleep AGENT_SLEEP; echo one > stage1"}]
      - say: "stage one written"
  - prompt: "(?m)^Session [2-9] of"
    turns:
      - calls: [{write_file: {path: fixed, content: "yes"}}]
      - say: "fixed"
"""

MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = MAX_SESSIONS

[session]
wall_time = "40s"

[limits]
run_memory = "1G"
agent = { memory = "512M", pids = 256 }
product = { memory = "128M", pids = 64 }
verifier = { memory = "256M", pids = 64 }

[product]
command = "PRODUCT_CMD"
port = 8000
ready_timeout = "READY_TIMEOUT"

[[checks]]
name = "fixed"
run = "CHECK_CMD"
timeout = "CHECK_TIMEOUT"

[[checks]]
name = "served"
http = "GET /fixed"
expect_body = "yes"
timeout = "10s"
+++
# A file called `fixed`

Create a file `fixed` containing `yes`.
"""

SERVE = "exec python3 -m http.server 8000 --bind 127.0.0.1"


def write_mission(
    root: Path,
    *,
    agent_sleep: float = 0,
    product_sleep: float = 0,
    check_sleep: float = 0,
    max_sessions: int = 4,
    product_cmd: str | None = None,
    check_cmd: str | None = None,
    check_timeout: str = "40s",
    ready_timeout: str = "40s",
) -> Path:
    """A mission whose session 1 fails the checks and session 2 passes them."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "scenario.yaml").write_text(SCENARIO.replace("AGENT_SLEEP", str(agent_sleep)))
    product = product_cmd or (
        f"if [ -f fixed ]; then {SERVE}; else sleep {product_sleep}; {SERVE}; fi"
    )
    check = check_cmd or f"test -f fixed || sleep {check_sleep}; test -f fixed"
    text = (
        MISSION.replace("MAX_SESSIONS", str(max_sessions))
        .replace("PRODUCT_CMD", product)
        .replace("CHECK_CMD", check)
        .replace("CHECK_TIMEOUT", check_timeout)
        .replace("READY_TIMEOUT", ready_timeout)
    )
    (root / "MISSION.md").write_text(text)
    return root / "MISSION.md"


#: Run ids created by the current test (the conftest sweeps their cgroups afterwards).
CREATED: list[str] = []


def new_id() -> str:
    rid = f"t{uuid.uuid4().hex[:10]}"
    CREATED.append(rid)
    return rid


def corral_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "corral", *args]


def corral(
    *args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        corral_argv(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def start_corral(*args: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        corral_argv(*args),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def sessions(run_dir: Path) -> list[SessionRecord]:
    if not (run_dir / "state.sqlite").exists():
        return []
    try:
        with Store(run_dir / "state.sqlite", readonly=True) as s:
            return s.sessions()
    except Exception:
        return []


def in_phase(run_dir: Path, n: int, phase: str) -> bool:
    ss = [s for s in sessions(run_dir) if s.n == n]
    return bool(ss) and ss[0].state == "running" and ss[0].phase == phase


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def journal_ok(path: Path) -> bool:
    conn = sqlite3.connect(path)
    try:
        return bool(conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
    finally:
        conn.close()


def journal_events(path: Path, event: str) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT session, reason FROM observations WHERE kind = 'process_event'"
            " AND target LIKE ?",
            (f"{event}%",),
        ).fetchall()
    finally:
        conn.close()
    return [(str(a), str(b)) for a, b in rows]


def run_cgroup(run_id: str) -> RunCgroup:
    cg = RunCgroup.detect(run_id)
    assert cg is not None
    return cg


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def vm_hwm(pid: int) -> int:
    """A process's peak resident memory (VmHWM) in bytes, from the kernel; 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
