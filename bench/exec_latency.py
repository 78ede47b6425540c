"""`corral exec -- true` against its peers, measured in the same run.

Prints the median and p90 wall time of each and the ratios DESIGN.md section 7
sets targets for (corral <= 30 ms median, <= 3x bare bwrap, <= 0.15x srt).

    .venv/bin/python bench/exec_latency.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _timed(
    argv: list[str],
    runs: int,
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> list[float]:
    out: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
            preexec_fn=preexec,
        )
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return out


def _bare_bwrap(ws: str) -> list[str]:
    """bwrap with the same namespaces and mounts as corral, no cgroup, seccomp, Landlock or init."""
    argv = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name in ("bin", "sbin", "lib", "lib64"):
        p = f"/{name}"
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/home",
        "--tmpfs",
        "/run",
        "--bind",
        ws,
        ws,
        "--chdir",
        ws,
        "true",
    ]
    return argv


def _drop_to(uid: int) -> Callable[[], None]:
    def fn() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return fn


def _in_process(ws: str, runs: int) -> list[float]:
    """The sandbox alone, as `corral run` uses it: no interpreter start-up, no imports."""
    from corral.exec.cli import sandbox_env
    from corral.sandbox.namespace import NamespaceSandbox
    from corral.sandbox.spec import SandboxSpec

    spec = SandboxSpec(
        argv=("true",), workspace=ws, env=tuple(sorted(sandbox_env("/home/corral", {}).items()))
    )
    out: list[float] = []
    for _ in range(runs + 2):
        t0 = time.perf_counter()
        running = NamespaceSandbox(spec).start()
        try:
            result = running.wait(30)
        finally:
            running.close()
        out.append(time.perf_counter() - t0)
        if result.exit != 0:
            raise SystemExit(f"in-process sandbox failed: {result}")
    return out[2:]


def _fmt(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(len(xs) * 0.9))]
    return f"median {statistics.median(xs) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    corral = [sys.executable, "-m", "corral", "exec"]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as ws:
        os.chmod(ws, 0o755)
        # warm-up: page cache, .pyc files, the seccomp cache
        _timed([*corral, "--workspace", ws, "--", "true"], 3)
        print(f"runs per command: {args.runs}", flush=True)
        results["bare bwrap"] = _timed(_bare_bwrap(ws), args.runs)
        if os.geteuid() == 0:
            results["bare bwrap (uid 64000)"] = _timed(
                _bare_bwrap(ws), args.runs, preexec=_drop_to(64000)
            )
        results["corral exec -- true"] = _timed(
            [*corral, "--workspace", ws, "--", "true"], args.runs
        )
        results["sandbox in-process"] = _in_process(ws, args.runs)
        results["python -c pass (venv)"] = _timed([sys.executable, "-c", "pass"], args.runs)
        srt = shutil.which("srt") or str(REPO / "tools/srt/node_modules/.bin/srt")
        if os.access(srt, os.X_OK):
            results["srt -c true"] = _timed([srt, "-c", "true"], max(5, args.runs // 3))
        else:
            print(
                "srt: not installed (npm install --prefix tools/srt @anthropic-ai/sandbox-runtime)"
            )
    for name, xs in results.items():
        print(f"{name:28s} {_fmt(xs)}")
    med = {k: statistics.median(v) for k, v in results.items()}
    c = med["corral exec -- true"]
    print(f"ratio corral / bare bwrap:            {c / med['bare bwrap']:.2f}x  (target <= 3x)")
    if "srt -c true" in med:
        ratio = c / med["srt -c true"]
        print(f"ratio corral / srt:                   {ratio:.2f}x  (target <= 0.15x)")
    print(f"corral median:                        {c * 1000:.1f} ms (target <= 30 ms)")
    lib = med["sandbox in-process"]
    ratio = lib / med["bare bwrap"]
    print(f"in-process sandbox / bare bwrap:      {ratio:.2f}x  ({lib * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
