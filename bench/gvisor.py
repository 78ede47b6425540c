"""The gvisor backend against bare runsc and against the namespace backend, in the same run.

- `corral exec --backend gvisor -- true` vs `runsc --network=none do true`
  (target: <= 1.2x);
- a CPU-bound loop and a syscall-heavy `git status` on a generated tree,
  gvisor vs namespace.

Prints the median of each and the ratios.

    .venv/bin/python bench/gvisor.py [--runs 11] [--files 3000]
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPU = "i=0\nwhile [ $i -lt 200000 ]; do i=$((i+1)); done"


def _median(argv: list[str], runs: int, cwd: str) -> float:
    out: list[float] = []
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd, check=False
        )
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return statistics.median(out)


def _corral(backend: str, ws: str, *cmd: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "corral",
        "exec",
        "--backend",
        backend,
        "--workspace",
        ws,
        "--",
        *cmd,
    ]


def _tree(ws: Path, files: int) -> None:
    for i in range(files):
        d = ws / f"d{i % 50}"
        d.mkdir(exist_ok=True)
        (d / f"f{i}.txt").write_text(f"{i}\n")
    git = ["git", "-c", "user.email=b@example.invalid", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q"], cwd=ws, check=True)
    subprocess.run([*git, "add", "-A"], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "tree"], cwd=ws, check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--files", type=int, default=3000)
    args = ap.parse_args()
    runsc = shutil.which("runsc")
    if runsc is None:
        raise SystemExit("runsc not installed (apt-get install runsc)")
    with tempfile.TemporaryDirectory(prefix="corral-bench-gv-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        rows: list[tuple[str, float, float, float]] = []
        bare = _median([runsc, "--network=none", "--platform=ptrace", "do", "true"], args.runs, tmp)
        gv = _median(_corral("gvisor", str(ws), "true"), args.runs, tmp)
        rows.append(("true: gvisor vs bare runsc do", gv, bare, gv / bare))
        ns = _median(_corral("namespace", str(ws), "true"), args.runs, tmp)
        rows.append(("true: gvisor vs namespace", gv, ns, gv / ns))
        gv = _median(_corral("gvisor", str(ws), "sh", "-c", CPU), args.runs, tmp)
        ns = _median(_corral("namespace", str(ws), "sh", "-c", CPU), args.runs, tmp)
        rows.append(("cpu loop: gvisor vs namespace", gv, ns, gv / ns))
        _tree(ws, args.files)
        st = ("git", "-c", "safe.directory=*", "status", "--porcelain")
        gv = _median(_corral("gvisor", str(ws), *st), args.runs, tmp)
        ns = _median(_corral("namespace", str(ws), *st), args.runs, tmp)
        rows.append((f"git status ({args.files} files): gvisor vs namespace", gv, ns, gv / ns))
    width = max(len(r[0]) for r in rows)
    print(f"median of {args.runs} runs each (seconds)")
    for name, a, b, ratio in rows:
        print(f"{name:<{width}}  {a:7.3f}  {b:7.3f}  {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
