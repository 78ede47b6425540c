"""Density: N concurrent idle agent-like sandboxes, each with its own broker listener.

Starts N `corral exec --allow pypi.org --memory M -- sh -c 'sleep ...'`
launchers (in batches, so that a loaded host is not swamped), waits until
every sandbox is up and attached to the broker (its journal holds a
`broker_start` row), then measures from /proc (PSS, smaps_rollup) and the
sandboxes' own memory cgroups:

- the sandbox's own processes: every descendant of a launcher except a cold
  broker (bwrap, init, the command);
- corral's host-side processes: each launcher, plus the broker: the one
  resident broker (default) or, with `--cold`, one broker per sandbox.

The fixed host-side overhead per sandbox is corral's PSS divided by N. The
total (corral's PSS + the sandboxes' cgroup `memory.usage`) is checked
against the run cap (default 2 GiB).

    .venv/bin/python bench/density.py [--sandboxes 50] [--cold] [--cap-mib 2048]
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def _pss(proc: psutil.Process) -> int:
    try:
        return int(proc.memory_full_info().pss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def _is_cold_broker(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "corral.broker" in " ".join(cmd) and "serve" in cmd


def _resident_pids() -> list[int]:
    src = str(REPO / "src")
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "resident" in cmd and src in cmd:
            out.append(proc.pid)
    return out


def _attached(journal: Path) -> bool:
    if not journal.exists():
        return False
    try:
        conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=0.5)
        try:
            row = conn.execute(
                "SELECT 1 FROM observations WHERE target LIKE 'broker_start%' LIMIT 1"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return row is not None


def _memory_cgroup_usage(pid: int) -> int:
    """The memory cgroup usage of `pid` (v1 `memory.usage_in_bytes` or v2 `memory.current`)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.usage_in_bytes"
            if f.exists():
                return int(f.read_text())
        if controllers == "":
            for base in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
                f = base / path.lstrip("/") / "memory.current"
                if f.exists():
                    return int(f.read_text())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=50)
    parser.add_argument("--cold", action="store_true", help="one broker per sandbox")
    parser.add_argument("--memory", default="64M", help="each sandbox's memory limit")
    parser.add_argument("--cap-mib", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=5)
    args = parser.parse_args()
    n = args.sandboxes
    mode = "cold" if args.cold else "resident"
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    print(f"{n} sandboxes, broker {mode}; load {os.getloadavg()[0]:.1f}, {when}")
    env = {**os.environ, "CORRAL_BROKER": mode}
    launchers: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="corral-density-") as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        try:
            for i in range(n):
                ws = root / f"ws{i}"
                ws.mkdir()
                argv = [sys.executable, "-m", "corral", "exec", "--workspace", str(ws)]
                argv += ["--allow", "pypi.org", "--memory", args.memory]
                argv += ["--journal", str(root / f"j{i}.sqlite"), "--", "sh", "-c", "sleep 3600"]
                launchers.append(
                    subprocess.Popen(
                        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                )
                if (i + 1) % args.batch == 0 or i == n - 1:
                    deadline = time.monotonic() + 300
                    while not all(_attached(root / f"j{k}.sqlite") for k in range(i + 1)):
                        dead = [p for p in launchers if p.poll() is not None]
                        if dead or time.monotonic() > deadline:
                            raise SystemExit(f"a launcher failed or timed out ({len(dead)} dead)")
                        time.sleep(0.2)
            print(f"all {n} up and attached in {time.monotonic() - t0:.1f} s")
            time.sleep(2)  # let start-up transients settle
            corral_pss = 0
            sandbox_pss = 0
            broker_pss = 0
            launcher_pss = 0
            cgroup_bytes = 0
            for popen in launchers:
                launcher = psutil.Process(popen.pid)
                own = _pss(launcher)
                launcher_pss += own
                corral_pss += own
                seen_cgroup = False
                for child in launcher.children(recursive=True):
                    if _is_cold_broker(child):
                        pss = _pss(child)
                        broker_pss += pss
                        corral_pss += pss
                        continue
                    sandbox_pss += _pss(child)
                    if not seen_cgroup and child.name() == "sleep":
                        cgroup_bytes += _memory_cgroup_usage(child.pid)
                        seen_cgroup = True
            for pid in _resident_pids() if mode == "resident" else []:
                pss = _pss(psutil.Process(pid))
                broker_pss += pss
                corral_pss += pss
            mib = 1 << 20
            each = launcher_pss / n / mib
            print(
                f"launchers (corral exec) PSS  {launcher_pss / mib:8.1f} MiB ({each:.1f}/sandbox)"
            )
            each = broker_pss / n / mib
            print(f"broker(s) PSS                {broker_pss / mib:8.1f} MiB ({each:.2f}/sandbox)")
            print(f"sandboxes' own processes PSS {sandbox_pss / mib:8.1f} MiB")
            print(f"sandboxes' memory cgroups    {cgroup_bytes / mib:8.1f} MiB")
            total = corral_pss + max(cgroup_bytes, sandbox_pss)
            print(f"fixed host-side overhead per sandbox: {corral_pss / n / mib:.1f} MiB")
            verdict = "within" if total <= args.cap_mib * mib else "OVER"
            print(f"total {total / mib:.0f} MiB: {verdict} the {args.cap_mib} MiB cap")
        finally:
            for popen in launchers:
                if popen.poll() is None:
                    popen.send_signal(signal.SIGTERM)
            t1 = time.monotonic()
            for popen in launchers:
                try:
                    popen.wait(120)
                except subprocess.TimeoutExpired:
                    popen.kill()
                    popen.wait()
            print(f"teardown of {len(launchers)} sandboxes: {time.monotonic() - t1:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
