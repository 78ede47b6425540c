"""issue 10: wall clocks that stop while a run is paused, and the watchdog's other actions.

Judged from the host: the run's state record, its sessions, the run cgroup's
processes and CPU counter, a heartbeat file the agent writes.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import (
    corral,
    in_phase,
    new_id,
    run_cgroup,
    sessions,
    start_corral,
    wait_for,
    write_mission,
)

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(120)]

# The product says it started, then needs 4 s before it listens.
_SLOW_PRODUCT = "echo starting; sleep 4; exec python3 -m http.server 8000 --bind 127.0.0.1"


def _cli(tmp_path: Path, *args: str) -> Any:
    return corral(*args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)


def test_a_pause_while_the_product_starts_does_not_use_up_its_ready_timeout(
    tmp_path: Path,
) -> None:
    mission = write_mission(tmp_path / "m", product_cmd=_SLOW_PRODUCT, ready_timeout="6s")
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    out = run_dir / "sessions" / "session-1" / "product" / "stdout.log"
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(lambda: out.is_file() and b"starting" in out.read_bytes(), 60, "the product")
        paused = _cli(tmp_path, "pause", rid)
        assert paused.returncode == 0, paused.stdout + paused.stderr
        # Longer than the whole ready_timeout: a clock that counted it gives up.
        time.sleep(7.0)
        assert in_phase(run_dir, 1, "product"), sessions(run_dir)
        resumed = _cli(tmp_path, "resume", rid)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        wait_for(lambda: sessions(run_dir)[0].product_ready is not None, 30, "the probe")
        s1 = sessions(run_dir)[0]
        assert s1.product_ready is True, s1
        stopped = _cli(tmp_path, "stop", rid)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        ((start, end),) = s.pause_intervals()
        assert end is not None and end - start >= 7.0


def _watch_mission(tmp_path: Path, action: str, beats: int) -> Path:
    mission = write_mission(tmp_path / "m")
    scen = tmp_path / "m" / "scenario.yaml"
    beat = f"i=0; while [ $i -lt {beats} ]; do i=$((i+1)); echo $i > hb; sleep 0.05; done"
    scen.write_text(scen.read_text().replace("sleep 0; echo one > stage1", beat))
    # A floor above what any host has: MemAvailable is below it at once.
    mission.write_text(
        mission.read_text().replace(
            "[limits]",
            f'[watch]\nhost_memory_min_free = "1048576G"\non_breach = "{action}"\n\n[limits]',
        )
    )
    return mission


def _watch_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "journal.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT detail FROM observations WHERE kind = 'watch'").fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return [dict(json.loads(d)) for (d,) in rows]


@pytest.mark.parametrize("action", ["stop", "kill"])
def test_on_breach_stop_and_kill_end_the_run_with_nothing_left(tmp_path: Path, action: str) -> None:
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run", str(_watch_mission(tmp_path, action, beats=400)), "--plain", "--id", rid,
        "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.wait(60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (row,) = _watch_rows(run_dir)
    assert row["action"] == action and row["threshold"] == 1 << 50
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "stopped", s.run()
        assert not s.paused()
    cg = run_cgroup(rid)
    assert not cg.exists() or not cg.pids()
    # No session ran to its end: the breach came first, and nothing ran on after it.
    assert all(s.state != "done" for s in sessions(run_dir))
    assert (
        not (run_dir / "workspace" / "hb").exists()
        or int((run_dir / "workspace" / "hb").read_text() or 0) < 400
    )


def _mem_available() -> int:
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


def _beat(run_dir: Path) -> int:
    try:
        return int((run_dir / "workspace" / "hb").read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_the_watchdog_pauses_a_run_mid_session_when_the_agent_eats_host_memory(
    tmp_path: Path,
) -> None:
    # The agent pins 1.5 GiB of shmem (not reclaimable: MemAvailable drops by
    # it), then beats. The floor sits 768 MiB below what the host has now:
    # above what the run's own processes take (~400 MiB measured), so only
    # the agent's allocation crosses it, with the session running.
    mib = 1 << 20
    floor = _mem_available() - 768 * mib
    mission = write_mission(tmp_path / "m")
    scen = tmp_path / "m" / "scenario.yaml"
    beat = (
        "head -c 1536M /dev/zero > /dev/shm/hog; echo 1 > hb; "
        "i=1; while [ $i -lt 400 ]; do i=$((i+1)); echo $i > hb; sleep 0.05; done"
    )
    scen.write_text(scen.read_text().replace("sleep 0; echo one > stage1", beat))
    text = mission.read_text().replace('run_memory = "1G"', 'run_memory = "3G"')
    text = text.replace('agent = { memory = "512M"', 'agent = { memory = "2G"')
    text = text.replace(
        "[limits]", f'[watch]\nhost_memory_min_free = {floor}\non_breach = "pause"\n\n[limits]'
    )
    mission.write_text(text)
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(lambda: bool(_watch_rows(run_dir)), 60, "the watchdog's journal row")
        (row,) = _watch_rows(run_dir)
        assert row["action"] == "pause" and row["threshold"] == floor
        assert row["value"] < floor
        with Store(run_dir / "state.sqlite", readonly=True) as s:
            assert s.run().state == "paused"
        # Mid-session: the agent of session 1 was running, and is frozen now.
        assert in_phase(run_dir, 1, "agent"), sessions(run_dir)
        cg = run_cgroup(rid)
        cpu0, beat0 = cg.cgroup.usage().cpu_s, _beat(run_dir)
        time.sleep(1.0)
        assert cg.cgroup.usage().cpu_s == cpu0, "the run used CPU while paused"
        assert _beat(run_dir) == beat0 < 400
        # (Completing after resume is test_pause.py's; here the hog would
        # hold the breach, so the run is stopped.)
        stopped = _cli(tmp_path, "stop", rid)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert proc.wait(30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _beat(run_dir) == beat0
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "stopped"


def _check_paused_midway(tmp_path: Path) -> tuple[list[Any], str]:
    """Session 1's first check, paused for longer than its timeout while it runs."""
    from corral.run.environments import RunLayout
    from corral.run.pause import pause_run, thaw_run

    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    cdir = run_dir / "sessions" / "session-1" / "check-0"
    out, began = cdir / "stdout.log", cdir / "began"
    # The check's output reaches stdout.log only at its end: it marks its
    # start in its own (writable) scratch directory.
    mission = write_mission(
        tmp_path / "m", check_cmd=f"touch {began}; sleep 2; echo checked", check_timeout="3s"
    )
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(began.exists, 90, "the check")
        layout = RunLayout(run_dir)
        assert pause_run(layout)
        seen = out.read_bytes() if out.exists() else b""
        # Longer than the check's whole timeout: a clock that counted it kills the check.
        time.sleep(5.0)
        assert thaw_run(layout)
        wait_for(lambda: bool(_checks(run_dir, 1)), 60, "session 1's check results")
        stopped = _cli(tmp_path, "stop", rid)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The pause came while the check was in its `sleep`, not after it.
    assert b"checked" not in seen, seen
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        ((start, end),) = s.pause_intervals()
        assert end is not None and end - start >= 5.0
    return _checks(run_dir, 1), out.read_text()


def _checks(run_dir: Path, n: int) -> list[Any]:
    try:
        with Store(run_dir / "state.sqlite", readonly=True) as s:
            return s.checks(n)
    except Exception:
        return []


def test_a_check_paused_for_longer_than_its_timeout_passes_after_resume(tmp_path: Path) -> None:
    results, output = _check_paused_midway(tmp_path)
    fixed = next(r for r in results if r.name == "fixed")
    # Judged by the check runner's exit status as the sandbox reported it.
    assert fixed.passed, fixed
    assert fixed.reason == "passed" and "checked" in output, (fixed, output)
