"""The watchdog against the kernel's cap, in numbers (issue 10).

Prints, on this host:

- run peak by kernel counter vs cap: a process allocating past a run cgroup's
  `memory` cap; the kernel's peak counter never exceeds the cap (it acts in the
  page fault, before the allocation succeeds: latency 0, overshoot 0);
- watchdog detection latency p50/p99, from the allocation that crosses a
  threshold to the freeze: the watchdog's own loop (`take_sample` every
  100 ms, then `RunCgroup.freeze`) with the threshold on the run cgroup's
  memory, since on a shared host MemAvailable moves with everyone's work;
  and how far past the threshold the run got before it was frozen;
- pause and resume latency (`freeze()`/`thaw()` of a cgroup of busy processes);
- the watchdog's overhead: CPU time per sample and per second at 10 Hz.

    .venv/bin/python bench/footprint.py [--runs 15]

Needs root and a cgroup hierarchy; creates and removes `corral/run-bench…`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

from corral.run.runcg import RunCgroup
from corral.run.watchdog import pressure_source, take_sample
from corral.sandbox.cgroup import Cgroup, detect_layout
from corral.sandbox.spec import Limits

MiB = 1 << 20

# Allocates 4 MiB (touched) every 10 ms; after each allocation, the first time
# its cgroup's usage is past the threshold, prints that moment (CLOCK_MONOTONIC).
_ALLOCATOR = r"""
import os, sys, time
usage, threshold = sys.argv[1], int(sys.argv[2])
chunks = []
told = False
while True:
    chunks.append(bytearray(4 << 20))
    if not told and int(open(usage).read()) > threshold:
        print(time.monotonic(), flush=True)
        told = True
    time.sleep(0.01)
"""


def _run_cgroup() -> RunCgroup:
    layout = detect_layout()
    if layout is None:
        raise SystemExit("no cgroup hierarchy")
    return RunCgroup(layout, f"bench{secrets.token_hex(4)}")


def _usage_file(cg: Cgroup) -> str:
    if "memory" in cg.dirs:
        return os.path.join(cg.dirs["memory"], "memory.usage_in_bytes")
    return os.path.join(cg.dirs["unified"], "memory.current")


def _start_in(cg: Cgroup, argv: list[str]) -> subprocess.Popen[str]:
    # Attached right after the fork: the interpreter's start-up takes far
    # longer than this, so every allocation below is charged to `cg`.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    cg.attach_pid(proc.pid)
    return proc


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def kernel_cap(cap: int) -> tuple[int, int, int]:
    """(peak, cap, exit) of a process allocating past a run cgroup's cap."""
    rc = _run_cgroup()
    rc.create(cap)
    try:
        child = Cgroup.create(rc.layout, f"{rc.relpath}/agent-1-{secrets.token_hex(3)}", Limits())
        proc = _start_in(
            child, [sys.executable, "-c", _ALLOCATOR, _usage_file(child), str(1 << 62)]
        )
        proc.wait(60)
        return rc.peak_memory(), cap, proc.returncode
    finally:
        rc.sweep()


def watchdog_once(threshold: int, interval: float) -> tuple[float, int]:
    """(seconds from the crossing allocation to frozen, bytes past the threshold when frozen)."""
    rc = _run_cgroup()
    rc.create(1 << 30)
    try:
        child = Cgroup.create(rc.layout, f"{rc.relpath}/agent-1-{secrets.token_hex(3)}", Limits())
        psi = pressure_source(rc)
        proc = _start_in(
            child, [sys.executable, "-c", _ALLOCATOR, _usage_file(rc.cgroup), str(threshold)]
        )
        # The watchdog's loop, its predicate on the run's memory.
        while True:
            sample = take_sample(rc, psi)
            if sample.envs["run"].memory_bytes > threshold:
                rc.freeze()
                frozen = time.monotonic()
                break
            time.sleep(interval)
        at_freeze = int(Path(_usage_file(rc.cgroup)).read_text())
        rc.thaw()
        assert proc.stdout is not None
        crossed = float(proc.stdout.readline())
        proc.kill()
        proc.wait()
        return frozen - crossed, at_freeze - threshold
    finally:
        rc.sweep()


def pause_resume(n_procs: int = 8) -> tuple[float, float]:
    rc = _run_cgroup()
    rc.create(1 << 30)
    try:
        child = Cgroup.create(rc.layout, f"{rc.relpath}/agent-1-{secrets.token_hex(3)}", Limits())
        procs = [
            _start_in(child, [sys.executable, "-c", "while True: pass"]) for _ in range(n_procs)
        ]
        time.sleep(0.3)
        t0 = time.monotonic()
        rc.freeze()
        t1 = time.monotonic()
        rc.thaw()
        t2 = time.monotonic()
        for p in procs:
            p.kill()
            p.wait()
        return t1 - t0, t2 - t1
    finally:
        rc.sweep()


def overhead(samples: int = 200) -> float:
    """CPU seconds per sample of a run cgroup with a busy child."""
    rc = _run_cgroup()
    rc.create(1 << 30)
    try:
        for i in range(3):
            Cgroup.create(rc.layout, f"{rc.relpath}/agent-{i}-{secrets.token_hex(3)}", Limits())
        psi = pressure_source(rc)
        t0 = time.process_time()
        for _ in range(samples):
            take_sample(rc, psi)
        return (time.process_time() - t0) / samples
    finally:
        rc.sweep()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    peak, cap, code = kernel_cap(128 * MiB)
    print(
        f"kernel cap: peak {peak / MiB:.1f} MiB of a {cap / MiB:.0f} MiB cap"
        f" (allocator exit {code}; the cap acts before the allocation succeeds)"
    )
    lat: list[float] = []
    over: list[float] = []
    for _ in range(args.runs):
        dt, past = watchdog_once(96 * MiB, 0.1)
        lat.append(dt)
        over.append(past)
    print(
        f"watchdog (100 ms): detection latency p50 {_pct(lat, 0.5) * 1e3:.0f} ms,"
        f" p99 {_pct(lat, 0.99) * 1e3:.0f} ms; past the threshold when frozen"
        f" p50 {_pct(over, 0.5) / MiB:.0f} MiB, max {max(over) / MiB:.0f} MiB ({args.runs} runs)"
    )
    pauses, resumes = zip(*(pause_resume() for _ in range(5)), strict=True)
    print(
        f"pause (8 busy processes): median {statistics.median(pauses) * 1e3:.1f} ms;"
        f" resume: median {statistics.median(resumes) * 1e3:.1f} ms"
    )
    per = overhead()
    print(
        f"watchdog overhead: {per * 1e6:.0f} µs CPU per sample,"
        f" {per * 10 * 100:.2f}% of one core at 10 Hz"
    )


if __name__ == "__main__":
    main()
