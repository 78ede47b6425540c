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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.sandbox.cgroup import Cgroup

REPO = Path(__file__).resolve().parent.parent
CPU = "i=0\nwhile [ $i -lt 200000 ]; do i=$((i+1)); done"


def _once(argv: list[str], cwd: str, attach: list[int] | None = None) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}

    def join() -> None:
        for fd in attach or ():
            os.write(fd, b"0")

    t0 = time.perf_counter()
    proc = subprocess.run(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        check=False,
        preexec_fn=join if attach else None,
        pass_fds=attach or (),
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return took


def _median(argv: list[str], runs: int, cwd: str) -> float:
    return statistics.median(_once(argv, cwd) for _ in range(runs))


def _interleaved(
    cases: list[tuple[list[str], list[int] | None]], runs: int, cwd: str
) -> list[float]:
    """Medians of each case, the cases run in turn each round (the load drifts alike)."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(runs):
        for i, (argv, attach) in enumerate(cases):
            times[i].append(_once(argv, cwd, attach))
    return [statistics.median(t) for t in times]


def _bench_cgroup() -> Cgroup | None:
    """A cgroup beside the sandboxes' (below `corral`): bare runsc there competes for
    the CPU with the same weight as corral's sandbox, whose cgroup shares `corral`'s."""
    from corral.sandbox.cgroup import Cgroup as _Cgroup
    from corral.sandbox.cgroup import detect_layout
    from corral.sandbox.spec import Limits

    layout = detect_layout()
    if layout is None or os.geteuid() != 0:
        return None
    return _Cgroup.create(layout, f"corral/bench-gv-{os.getpid()}", Limits())


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
        do = [runsc, "--network=none", "--platform=ptrace", "do", "true"]
        cg = _bench_cgroup()
        fds = cg.open_attach_fds() if cg is not None else []
        try:
            cases: list[tuple[list[str], list[int] | None]] = [
                (do, None),
                (_corral("gvisor", str(ws), "true"), None),
            ]
            if fds:
                cases.append((do, fds))
            bare, gv, *in_cg = _interleaved(cases, args.runs, tmp)
        finally:
            for fd in fds:
                os.close(fd)
            if cg is not None:
                cg.remove()
        rows.append(("true: gvisor vs bare runsc do", gv, bare, gv / bare))
        if in_cg:
            name = "true: gvisor vs bare runsc do in a corral/ cgroup"
            rows.append((name, gv, in_cg[0], gv / in_cg[0]))
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
