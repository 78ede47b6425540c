"""Teardown of 1,000 sandboxed processes (half of them setsid'd) after the main process exits.

The sandbox's main process starts the processes, waits on a FIFO the host
created, and exits when the host writes to it. The clock starts when that
write returns and stops when `wait()` has returned (every process killed,
the cgroup empty, the exit report read) and again after `close()` (the cgroup
removed, descriptors and placeholders released). The start is gated on the
cgroup's own count (>= 1,001 processes), not on a sleep.

    .venv/bin/python bench/teardown.py [--runs 5] [--procs 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

TARGET_S = 0.250


def _script(procs: int) -> str:
    half = procs // 2
    return (
        "i=0\n"
        f"while [ $i -lt {half} ]; do sleep 1000 & setsid sleep 1000 & i=$((i+1)); done\n"
        f"{'sleep 1000 &' if procs % 2 else ''}\n"
        "read x < go\n"
    )


def one_run(procs: int) -> tuple[float, float]:
    """(seconds until wait() returned, seconds until close() returned) after the main exits."""
    from corral.exec.cli import sandbox_env
    from corral.sandbox.namespace import NamespaceSandbox
    from corral.sandbox.spec import Limits, SandboxSpec

    with tempfile.TemporaryDirectory(prefix="corral-teardown-") as ws:
        os.chmod(ws, 0o755)
        with open(os.path.join(ws, "spawn.sh"), "w") as fh:
            fh.write(_script(procs))
        fifo = os.path.join(ws, "go")
        os.mkfifo(fifo, 0o666)
        os.chmod(fifo, 0o666)
        spec = SandboxSpec(
            argv=("sh", os.path.join(ws, "spawn.sh")),
            workspace=ws,
            env=tuple(sorted(sandbox_env("/home/corral", {}).items())),
            limits=Limits(pids=procs + 200),
        )
        running = NamespaceSandbox(spec).start()
        try:
            cg = running.cgroup
            if cg is None:
                raise SystemExit("teardown bench needs a cgroup (run as root)")
            deadline = time.monotonic() + 300
            while len(cg.pids()) < procs + 1:
                if time.monotonic() > deadline or running.poll() is not None:
                    raise SystemExit(f"only {len(cg.pids())} processes started")
                time.sleep(0.05)
            fd = os.open(fifo, os.O_WRONLY)
            os.write(fd, b"\n")
            t0 = time.perf_counter()
            os.close(fd)
            result = running.wait(120)
            t1 = time.perf_counter()
        finally:
            running.close()
        t2 = time.perf_counter()
        if result.processes_killed_at_end < procs:
            raise SystemExit(f"only {result.processes_killed_at_end} processes killed at the end")
    return t1 - t0, t2 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--procs", type=int, default=1000)
    args = ap.parse_args()
    waits: list[float] = []
    totals: list[float] = []
    for i in range(args.runs):
        w, t = one_run(args.procs)
        waits.append(w)
        totals.append(t)
        print(
            f"run {i + 1}: wait() {w * 1000:6.1f} ms   wait()+close() {t * 1000:6.1f} ms",
            flush=True,
        )
    w, t = statistics.median(waits), statistics.median(totals)
    print(f"processes: {args.procs} ({args.procs // 2} setsid'd), runs: {args.runs}")
    print(f"median teardown to wait():          {w * 1000:6.1f} ms")
    print(
        f"median teardown to close():         {t * 1000:6.1f} ms"
        f"  ratio to target {t / TARGET_S:.2f}x (target <= {TARGET_S * 1000:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
