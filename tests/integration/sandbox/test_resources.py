"""M7: memory (swap included), pids and CPU limits hold, judged by kernel counters."""

from __future__ import annotations

import pytest

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox]

LIMIT = 256 * 1024 * 1024


def test_memory_hog_is_killed_at_the_limit(corral_exec: ExecFn) -> None:
    out = corral_exec(
        "python3", "-c", "x = bytearray(2 * 1024**3); print('survived')", opts=("--memory", "256M")
    )
    assert out.code == 137, out.stderr
    assert out.summary["reason"] == "oom"
    assert "survived" not in out.stdout
    peak = out.summary["peak_memory_bytes"]
    assert isinstance(peak, int) and 0 < peak <= LIMIT


def test_many_small_processes_share_one_memory_limit(corral_exec: ExecFn) -> None:
    # Each child stays far below any per-process limit; together they exceed
    # the sandbox's. RLIMIT_AS could not catch this; the cgroup does.
    # Each child holds its memory until every child has allocated (or died):
    # a pipe's EOF, not a sleep, so a slow host cannot let the first ones exit
    # before the last ones allocate.
    code = (
        "import os\n"
        "ready_r, ready_w = os.pipe()\n"
        "hold_r, hold_w = os.pipe()\n"
        "kids = []\n"
        "for i in range(8):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.close(ready_r); os.close(hold_w)\n"
        "        b = bytearray(64 * 1024**2)\n"
        "        for j in range(0, len(b), 4096): b[j] = 1\n"
        "        os.write(ready_w, b'x'); os.close(ready_w)\n"
        "        os.read(hold_r, 1); os._exit(0)\n"
        "    kids.append(pid)\n"
        "os.close(ready_w); os.close(hold_r)\n"
        "while os.read(ready_r, 64): pass\n"
        "os.close(hold_w)\n"
        "for k in kids: os.waitpid(k, 0)\n"
        "print('all done')\n"
    )
    out = corral_exec("python3", "-c", code, opts=("--memory", "256M"), timeout=60)
    peak = out.summary["peak_memory_bytes"]
    assert isinstance(peak, int) and peak <= LIMIT
    oom = out.summary["oom_kills"]
    assert isinstance(oom, int) and oom >= 1


def test_fork_bomb_stops_at_pids_limit(corral_exec: ExecFn) -> None:
    bomb = (
        # Counted, not timed: a loaded host forks slower, never fewer times.
        "import os, time\n"
        "n = 0\n"
        "for _ in range(256):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print('forked', n, flush=True)\n"
    )
    out = corral_exec("python3", "-c", bomb, opts=("--pids", "64", "--timeout", "20"))
    assert out.code == 0, out.stderr
    forked = int(out.stdout.split()[-1])
    assert 0 < forked < 64
    hits = out.summary["pids_limit_hits"]
    assert isinstance(hits, int) and hits >= 1
    killed = out.summary["processes_killed_at_end"]
    assert isinstance(killed, int) and killed >= forked


def test_cpu_quota_holds_two_busy_loops_to_half_a_core(corral_exec: ExecFn) -> None:
    spin = (
        "import os, time\n"
        "def spin():\n"
        "    t = time.monotonic()\n"
        "    while time.monotonic() - t < 3: pass\n"
        "if os.fork() == 0:\n"
        "    spin(); os._exit(0)\n"
        "spin(); os.wait()\n"
    )
    out = corral_exec("python3", "-c", spin, opts=("--cpus", "0.5"))
    assert out.code == 0, out.stderr
    cpu = out.summary["cpu_s"]
    wall = out.summary["wall_s"]
    assert isinstance(cpu, float) and isinstance(wall, float)
    # Two loops unthrottled would use ~2 CPU-seconds per second; the quota
    # must hold them near 0.5. The lower bound only shows they ran (a busy
    # host may give them less than their quota).
    assert 0.1 <= cpu / wall <= 0.7, (cpu, wall)


def test_wall_clock_limit(corral_exec: ExecFn) -> None:
    out = corral_exec("sleep", "30", opts=("--timeout", "1"))
    assert out.code == 124
    wall = out.summary["wall_s"]
    # Far below the command's 30 s, whatever a loaded host adds around the kill.
    assert isinstance(wall, float) and wall < 20
