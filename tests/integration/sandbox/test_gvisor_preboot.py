"""gVisor booted before the request (gvisor.preboot): one sentry per request, the
workspace attached after boot, nothing left when the holder dies.

Host-side effects decide: files in the workspace (and their owner), runsc
processes found in /proc by their container id, state directories and cgroups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig
from corral.sandbox.cgroup import detect_layout
from corral.sandbox.gvisor import preboot
from corral.sandbox.gvisor.backend import STATE_ROOT
from corral.sandbox.spec import ExecResult, Limits, SandboxSpec
from tests.conformance.helpers import run, spec, until

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]


def _key(s: SandboxSpec) -> preboot.BootKey:
    key = preboot.boot_key(s, GVisorConfig(), "corral")
    assert key is not None
    return key


def _prebooted(s: SandboxSpec) -> ExecResult:
    preboot.prepare(_key(s))
    assert preboot._slot, "nothing was booted"
    result = run(GVisorConfig().load(), s)
    assert result.layers.get("preboot") == "booted before the request"
    assert not preboot._slot  # taken once
    return result


def _runsc_of(name: str) -> list[int]:
    """Host pids whose command line names the container `name`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if name.encode() in cmd and b"runsc" in cmd:
            found.append(int(pid))
    return found


def _cgroup_dirs(name: str, parent: str = "corral") -> list[str]:
    layout = detect_layout()
    assert layout is not None
    roots = [m for _, m in layout.v1] + ([layout.unified] if layout.unified else [])
    return [d for r in roots if os.path.isdir(d := os.path.join(r, parent, name))]


def test_the_workspace_arrives_after_boot_with_the_callers_ownership(tmp_path: Path) -> None:
    """The command writes into the workspace bound after the sandbox booted, runs
    in it as the sandbox user, exits 7 and leaves one process: the host sees the
    file (owned by the caller), the status and the count. The stage that stands
    in for the workspace's parent takes nothing (its host directory stays as
    corral made it)."""
    (tmp_path / "before").write_text("host\n")
    cmd = (
        "cat before > copy; pwd > where; id -u > uid; "
        "touch ../sibling 2>/dev/null; mkdir ../d 2>/dev/null; sleep 100 & exit 7"
    )
    s = spec(tmp_path, "/bin/sh", "-c", cmd)
    preboot.prepare(_key(s))
    stage = Path(preboot._slot[0].mount_point).parent
    running = GVisorConfig().load().start(s)
    try:
        result = running.wait(60)
        assert os.listdir(stage) == [tmp_path.name]  # the sandbox's ../ is the stage
    finally:
        running.close()
    assert result.layers.get("preboot") == "booted before the request"
    assert (result.exit, result.reason, result.processes_killed_at_end) == (7, "exited", 1)
    assert (tmp_path / "copy").read_text() == "host\n"
    assert (tmp_path / "where").read_text() == f"{tmp_path}\n"
    assert (tmp_path / "uid").read_text() == "1000\n"
    assert (tmp_path / "copy").stat().st_uid == os.getuid()
    assert not stage.exists()  # removed with the state directory


def test_the_process_limit_of_the_request_holds(tmp_path: Path) -> None:
    """Booted for a request with `--pids`, the sandbox gets the request's limit
    (the supervisor's RLIMIT_NPROC) and the sentry's refusals are counted."""
    fork = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(40):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2); os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "open('n', 'w').write(str(n))\n"
    )
    result = _prebooted(spec(tmp_path, "python3", "-I", "-c", fork, limits=Limits(pids=8)))
    assert result.exit == 0
    assert int((tmp_path / "n").read_text()) <= 8  # as on a cold start: 40 without the limit
    assert result.pids_limit_hits >= 1


def test_each_request_gets_a_fresh_sentry(tmp_path: Path) -> None:
    """The first request leaves a file in the sandbox's /tmp and a process behind;
    the second (booted after the first ended) sees neither, and the first's
    runsc processes, state directory and cgroup are gone."""
    first = _prebooted(
        spec(tmp_path, "/bin/sh", "-c", "echo x > /tmp/left-over; setsid sleep 1000 & exit 0")
    )
    assert first.processes_killed_at_end == 1
    check = (
        "test -e /tmp/left-over && echo seen > seen; ps -e 2>/dev/null | grep -c sleep > n; true"
    )
    second = _prebooted(spec(tmp_path, "/bin/sh", "-c", check))
    assert second.exit == 0
    assert not (tmp_path / "seen").exists()
    assert (tmp_path / "n").read_text().strip() == "0"


def test_a_preboot_for_another_request_is_discarded(tmp_path: Path) -> None:
    """Booted for workspace A, the request for B starts cold; A's sandbox is torn
    down (no runsc process, no state directory, no cgroup) and A is untouched."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    preboot.prepare(_key(spec(a, "true")))
    assert preboot._slot
    parked = preboot._slot[0]
    name = parked.name
    assert _runsc_of(name)
    result = run(GVisorConfig().load(), spec(b, "/bin/sh", "-c", "echo b > f"))
    assert result.exit == 0
    assert "preboot" not in result.layers
    assert (b / "f").read_text() == "b\n"
    assert os.listdir(a) == []
    assert _runsc_of(name) == []
    assert not os.path.exists(os.path.join(STATE_ROOT, name))
    assert _cgroup_dirs(name) == []


def test_other_limits_change_nothing_but_a_process_limit_needs_its_own_boot(
    tmp_path: Path,
) -> None:
    """Memory and CPU limits are written into the parked sandbox's cgroup; a
    process limit changes the boot (the sentry's fork log), so that request
    starts cold."""
    s = spec(tmp_path, "true", limits=Limits(memory_bytes=512 << 20, cpus=1.0))
    assert _prebooted(s).exit == 0
    with_pids = spec(tmp_path, "true", limits=Limits(pids=50))
    assert preboot.boot_key(with_pids, GVisorConfig(), "corral") != _key(s)


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from corral.sandbox.gvisor import preboot
    key = preboot.BootKey(
        sys.argv[1], "/home/corral", "corral", "exec", False, None, None, sys.argv[2]
    )
    preboot.prepare(key)
    if sys.argv[3] == "parked" and not (preboot._slot and preboot._slot[0].ready()):
        preboot._slot.clear()
    print(preboot._slot[0].name if preboot._slot else "-", flush=True)
    time.sleep(1000)
    """
)


@pytest.fixture
def parent() -> Iterator[str]:
    """A cgroup parent of this test's own: no other corral's start sweeps below it
    (a sweep kills a dead owner's sandbox, and would hide a teardown that failed)."""
    name = f"corral-t-{os.urandom(4).hex()}"
    yield name
    layout = detect_layout()
    assert layout is not None
    for root in [m for _, m in layout.v1] + ([layout.unified] if layout.unified else []):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(os.path.join(root, name))


@pytest.mark.parametrize("when", ["booting", "parked"])
def test_kill_9_of_the_holder_leaves_no_runsc_and_the_next_start_sweeps(
    tmp_path: Path, parent: str, when: str
) -> None:
    """A process holding a pre-booted sandbox (still booting, or parked) is
    SIGKILLed: every runsc process of that sandbox dies with it (PDEATHSIG ends
    `unshare`; the supervisor also ends on its stdin's EOF, or on the broken
    pipe of its ready line), and the next start removes its state directory
    and cgroup."""
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(ws), parent, when],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as holder:
        assert holder.stdout is not None
        name = holder.stdout.readline().strip()
        assert name != "-"
        assert _runsc_of(name)
        os.kill(holder.pid, signal.SIGKILL)
    until(lambda: _runsc_of(name) == [], "the pre-booted sandbox's runsc processes end", 10.0)
    assert _cgroup_dirs(name, parent)  # nothing but a start sweeps it
    running = GVisorConfig().load().start(spec(ws, "true"), parent_cgroup=parent)
    try:
        assert running.wait(60).exit == 0
    finally:
        running.close()
    assert not os.path.exists(os.path.join(STATE_ROOT, name))
    assert _cgroup_dirs(name, parent) == []
    assert os.listdir(ws) == []
