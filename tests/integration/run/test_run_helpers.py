"""corral's own per-run work runs in the run cgroup, charged by the kernel (issue 10).

The synthetic provider and report rendering are helper processes in the
run's `helpers-<name>` cgroups. The attacks and what the host observes:

* a sandboxed agent posts JSON bombs to the provider route: the provider
  helper's kernel peak counter grows by what it buffered, the coordinator's
  own high-water mark (VmHWM) does not;
* report rendering (matplotlib over the run's samples) is mapped into the
  report helper, never into the coordinator, and its kernel peak is recorded;
* kill -9 of the provider helper ends the run `failed` with a journaled
  reason (no hang); kill -9 of the coordinator leaves no helper process;
* a helper that cannot join the run cgroup is refused before it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from corral.errors import HelperError
from corral.run.helpers import ProviderHelper
from corral.run.store import Store
from tests.integration.run.helpers import (
    corral,
    env_with,
    in_phase,
    journal_events,
    new_id,
    run_cgroup,
    start_corral,
    vm_hwm,
    wait_for,
    write_mission,
)

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.timeout(120),
]

MiB = 1 << 20
_MAIN = "corral.run.helper_main"

BOMB = """import os, time, urllib.error, urllib.request
open("armed", "w").write("1")
time.sleep(1.5)
url = os.environ["CORRAL_PROVIDER_URL"].rstrip("/") + "/v1/messages"
out = []
for _ in range(3):
    # Under the provider's 8 MiB byte limit, so it is read (and scanned) whole.
    body = b'{"model":"m","max_tokens":8,"messages":[' + b"{}," * (5 << 19) + b"{}]}"
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        out.append(str(urllib.request.urlopen(req, timeout=60).status))
    except urllib.error.HTTPError as exc:
        out.append(str(exc.code))
    except OSError as exc:
        out.append("error:" + type(exc).__name__)
open("bomb-status", "w").write(" ".join(out))
"""

BOMB_SCENARIO = """name: bomb
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{write_file: {path: bomb.py, content: BOMB_JSON}}]
      - calls: [{shell: "python3 bomb.py"}]
      - say: "done"
"""


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _peak_file(rid: str, name: str) -> Path:
    cg = run_cgroup(rid)
    d = cg.cgroup.dirs.get("memory")
    if d is not None:
        return Path(d, f"helpers-{name}", "memory.max_usage_in_bytes")
    return Path(cg.cgroup.dirs["unified"], f"helpers-{name}", "memory.peak")


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _helpers_of(rid: str) -> list[psutil.Process]:
    """Every process on the host whose cgroup is one of the run's helper groups."""
    out = []
    for p in psutil.process_iter():
        try:
            text = Path(f"/proc/{p.pid}/cgroup").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if f"/corral/run-{rid}/helpers-" in text:
            out.append(p)
    return out


def _run(
    tmp_path: Path, scenario: str | None, **knobs: float | str
) -> tuple[str, Path, subprocess.Popen[bytes]]:
    knobs.setdefault("max_sessions", 1)
    mission = write_mission(tmp_path / "m", **knobs)  # type: ignore[arg-type]
    if scenario is not None:
        (tmp_path / "m" / "scenario.yaml").write_text(scenario)
    rid = new_id()
    runs = tmp_path / "runs"
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    return rid, runs / rid, proc


def _finish(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_json_bombs_are_charged_to_the_run_not_to_the_coordinator(tmp_path: Path) -> None:
    rid, run_dir, proc = _run(
        tmp_path, BOMB_SCENARIO.replace("BOMB_JSON", json.dumps(BOMB)), check_timeout="5s"
    )
    armed = run_dir / "workspace" / "armed"
    seen = False
    base_coord = base_provider = provider_peak = coord_peak = 0
    try:
        while proc.poll() is None:
            # Both are kernel high-water marks: the last value read is the peak so far.
            coord_peak = max(coord_peak, vm_hwm(proc.pid))
            if not seen and armed.exists():
                # Before the first bomb (the agent sleeps after arming).
                seen = True
                base_coord = vm_hwm(proc.pid)
                base_provider = _read_int(_peak_file(rid, "provider"))
            if seen:
                provider_peak = max(provider_peak, _read_int(_peak_file(rid, "provider")))
            time.sleep(0.05)
    finally:
        _finish(proc, 1)
    grew, coord_grew = provider_peak - base_provider, coord_peak - base_coord
    print(
        f"provider helper peak {base_provider / MiB:.1f} -> {provider_peak / MiB:.1f} MiB; "
        f"coordinator VmHWM {base_coord / MiB:.1f} -> {coord_peak / MiB:.1f} MiB"
    )
    # Refused by the value bound, before any object is built.
    assert (run_dir / "workspace" / "bomb-status").read_text() == "400 400 400"
    assert base_provider > 0, "the provider helper was never in its run cgroup"
    # The provider read each 7.5 MiB body (and copied it to scan it) before refusing it:
    # the kernel charged that to the run's provider helper...
    assert grew >= 6 * MiB, f"provider helper peak grew {grew / MiB:.1f} MiB"
    # ...and the coordinator never held it.
    assert coord_grew < 4 * MiB, f"coordinator VmHWM grew {coord_grew / MiB:.1f} MiB"


REPORT_SCENARIO = """name: report
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{shell: "sleep 1"}]
      - say: "SUMMARY"
"""

#: Markup the agent says, which the report quotes: rendered in the helper.
HOSTILE_SUMMARY = ("<img src=x onerror=alert(1)> [x](javascript:alert(1)) | --- |\\n" * 30)[:1900]


def test_report_rendering_runs_in_the_run_cgroup(tmp_path: Path) -> None:
    scenario = REPORT_SCENARIO.replace('"SUMMARY"', json.dumps(HOSTILE_SUMMARY))
    _rid, run_dir, proc = _run(tmp_path, scenario, check_timeout="5s")
    coord_mapped_matplotlib = False
    try:
        while proc.poll() is None:
            if "matplotlib" in _maps(proc.pid):
                coord_mapped_matplotlib = True
            time.sleep(0.05)
    finally:
        _finish(proc, 1)
    report = (run_dir / "report.md").read_text()
    assert "footprint.svg" in report and (run_dir / "footprint.svg").stat().st_size > 1000
    assert "<img" not in report and "](javascript" not in report
    assert not coord_mapped_matplotlib, "the coordinator loaded matplotlib itself"
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        peaks = [d for _, _, kind, d in s.events() if kind == "helper_peaks"]
    assert peaks, "no helper peaks recorded"
    print(f"helper peaks {peaks[-1]}")
    # matplotlib's import and an SVG render, counted by the kernel in the run.
    assert peaks[-1]["report"] >= 20 * MiB, peaks


AGENT_SLEEPS = """name: slow
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{shell: "sleep 30; touch slept"}]
      - say: "done"
"""


def test_provider_helper_death_fails_the_run_with_a_journaled_reason(tmp_path: Path) -> None:
    rid, run_dir, proc = _run(tmp_path, AGENT_SLEEPS)
    try:
        wait_for(lambda: in_phase(run_dir, 1, "agent"), 30, "session 1's agent")
        wait_for(lambda: bool(_helpers_of(rid)), 30, "the provider helper")
        # The mission has a product: its forward helper runs too.
        (helper,) = [h for h in _helpers_of(rid) if h.cmdline()[2:4] == [_MAIN, "provider"]]
        helper.send_signal(signal.SIGKILL)
        proc.wait(90)
    finally:
        _finish(proc, 1)
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        run = s.run()
    assert run.state == "failed", (run.state, run.end_reason)
    assert "provider helper died (signal 9)" in (run.end_reason or "")
    # The session was ended when the helper died: the agent never got past its sleep.
    assert not (run_dir / "workspace" / "slept").exists()
    rows = journal_events(run_dir / "journal.sqlite", "helper_died")
    assert rows and "provider helper died" in rows[0][1], rows


def test_sigkill_of_the_coordinator_leaves_no_helper(tmp_path: Path) -> None:
    rid, _run_dir, proc = _run(tmp_path, AGENT_SLEEPS)
    try:
        wait_for(lambda: bool(_helpers_of(rid)), 30, "the provider helper")
        helpers = _helpers_of(rid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not _helpers_of(rid), 5, "the helpers to die with the coordinator")
        for h in helpers:
            assert not h.is_running() or h.status() == psutil.STATUS_ZOMBIE
    finally:
        _finish(proc, 1)
        run_cgroup(rid).sweep()


def test_a_helper_that_cannot_join_the_run_cgroup_is_refused(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(AGENT_SLEEPS)
    marker = tmp_path / "ran"
    for procs, why in (
        ((), "no run cgroup to join"),
        ((str(tmp_path / "no" / "cgroup.procs"),), "could not join"),
    ):
        helper = ProviderHelper(scenario, marker, procs, tmp_path / "helper.log")
        with pytest.raises(
            HelperError, match=f"layer run cgroup: the provider helper (has )?{why}"
        ):
            helper.start(timeout_s=20)
        helper.stop()
    # The provider never ran (it would have opened its transcript).
    assert not marker.exists()


GIT_SPY = """#!/bin/sh
skip=0; sub=
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; elif [ "$a" = -c ]; then skip=1; else sub=$a; break; fi
done
echo "$sub $(grep -E ':memory:|^0::' /proc/self/cgroup | tr '\\n' ' ')" >> LOG
exec REAL "$@"
"""


def test_the_workspace_reset_at_recovery_is_charged_to_the_run(tmp_path: Path) -> None:
    # Killed once session 1's work is committed: recovery resets the workspace to it.
    rid, run_dir, proc = _run(tmp_path, None, max_sessions=2, product_sleep=30)
    try:
        wait_for(lambda: in_phase(run_dir, 1, "product"), 30, "session 1's product")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _finish(proc, 1)
    # Every git the resumed coordinator runs goes through a spy that records its cgroup.
    spy_dir, log = tmp_path / "spy", tmp_path / "git.log"
    spy_dir.mkdir()
    real = shutil.which("git")
    assert real is not None
    (spy_dir / "git").write_text(GIT_SPY.replace("LOG", str(log)).replace("REAL", real))
    (spy_dir / "git").chmod(0o755)
    env = env_with(PATH=f"{spy_dir}:{os.environ['PATH']}")
    corral(
        "resume",
        rid,
        "--plain",
        "--runs-dir",
        str(run_dir.parent),
        cwd=tmp_path,
        env=env,
        timeout=90,
    )
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.sessions()[0].state == "interrupted"
    calls = log.read_text().splitlines()
    # The reset (ls-tree, then archive of the last commit) ran first, before any session.
    subs = [c.split()[0] for c in calls]
    before_commit = subs[: subs.index("write-tree")] if "write-tree" in subs else subs
    assert "archive" in before_commit, subs
    outside = [c for c in calls if f"/corral/run-{rid}/helpers" not in c]
    assert not outside, outside
