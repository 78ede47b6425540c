"""The gvisor backend against bare runsc and against the namespace backend, in the same run.

- `corral exec --backend gvisor -- true` vs `runsc --network=none do true`
  (target: <= 1.2x), through the Python CLI and through the compiled front end
  and resident launcher (built and started here, on a private socket), all
  interleaved with bare runsc in the root cgroup and in a `corral/` cgroup.
  Through the launcher the sandbox is booted ahead by its warm worker
  (gvisor.preboot) while it waits: before every timed run the bench waits
  until that worker is ready, so no boot overlaps a measured run (of either
  side);
- a CPU-bound loop and a syscall-heavy `git status` on a generated tree,
  gvisor vs namespace.

Prints the median of each, the ratios and the load (`uptime`) before and after.

    .venv/bin/python bench/gvisor.py [--runs 11] [--files 3000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from corral.sandbox.cgroup import Cgroup

REPO = Path(__file__).resolve().parent.parent
CPU = "i=0\nwhile [ $i -lt 200000 ]; do i=$((i+1)); done"


def _once(
    argv: list[str], cwd: str, attach: list[int] | None = None, env: dict[str, str] | None = None
) -> float:
    env = {**(env or os.environ), "PYTHONPATH": str(REPO / "src")}

    def join() -> None:
        for fd in attach or ():
            os.write(fd, b"0")

    t0 = time.perf_counter()
    # A pipe, never the host's /dev/null: bare `runsc do` (root) fchowns the
    # descriptors it gets as the container's stdio to its sandbox user, which
    # left /dev/null owned by nobody (and then re-moded from inside) for
    # everything else on the host.
    proc = subprocess.run(
        argv,
        input=b"",
        capture_output=True,
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


Case = tuple[list[str], list[int] | None, dict[str, str] | None]


def _interleaved(
    cases: list[Case], runs: int, cwd: str, settle: Callable[[], None] = lambda: None
) -> list[float]:
    """Medians of each case, the cases run in turn each round (the load drifts alike);
    `settle()` before each run."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(runs):
        for i, (argv, attach, env) in enumerate(cases):
            settle()
            times[i].append(_once(argv, cwd, attach, env))
    return [statistics.median(t) for t in times]


def _launcher_pid(env: dict[str, str]) -> int | None:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.connect(env["CORRAL_LAUNCHER_SOCKET"])
        raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", raw)[0])
    return None


def _warm_ready(launcher: int, limit_s: float = 30.0) -> None:
    """Wait until the launcher's warm worker has finished preparing (its comm says so)."""
    from corral.exec.launcher import WARM_COMM

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            comm = stat[stat.index(b"(") + 1 : stat.rindex(b")")]
            if (
                comm == WARM_COMM.encode()
                and int(stat[stat.rindex(b")") + 2 :].split()[1]) == launcher
            ):
                _booted(int(pid), deadline)
                return
        time.sleep(0.01)


def _booted(worker: int, deadline: float) -> None:
    """Wait until the sandbox `worker` is booting (if any) has its supervisor
    running: the supervisor creates its report file just before it says ready."""
    from corral.sandbox.gvisor.backend import STATE_ROOT

    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            mine = [n for n in os.listdir(STATE_ROOT) if f"-{worker}-" in n]
            if not mine or all(os.path.exists(f"{STATE_ROOT}/{n}/report/status") for n in mine):
                return
        time.sleep(0.01)


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


def _corral(backend: str, ws: str, *cmd: str, front: list[str] | None = None) -> list[str]:
    return [
        *(front or [sys.executable, "-m", "corral"]),
        "exec",
        "--backend",
        backend,
        "--workspace",
        ws,
        "--",
        *cmd,
    ]


def _frontend(tmp: str) -> tuple[list[str], dict[str, str]] | None:
    """The front end's argv prefix and environment (its own launcher socket), warmed up."""
    from corral.exec.frontend import build

    exe = os.path.join(tmp, "corral")
    try:
        build(exe)
    except OSError as exc:
        print(f"front end not built: {exc}")
        return None
    sock_dir = tempfile.mkdtemp(prefix="cgl-", dir="/tmp")  # 0700; sun_path is short
    env = {**os.environ, "CORRAL_LAUNCHER_SOCKET": os.path.join(sock_dir, "l.sock")}
    # The first call falls back to the Python CLI and starts the launcher.
    subprocess.run([exe, "exec", "--", "true"], env=env, cwd=tmp, check=False)
    env["CORRAL_LAUNCHER"] = "require"
    for _ in range(100):
        if os.path.exists(env["CORRAL_LAUNCHER_SOCKET"]):
            break
        time.sleep(0.1)
    return [exe], env


def _stop_launcher(env: dict[str, str]) -> None:
    path = env["CORRAL_LAUNCHER_SOCKET"]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        os.kill(struct.unpack("3i", raw)[0], signal.SIGTERM)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


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
        load_before = _load()
        cg = _bench_cgroup()
        fds = cg.open_attach_fds() if cg is not None else []
        fe = _frontend(tmp)
        try:
            cases: list[Case] = [
                (do, None, None),
                (_corral("gvisor", str(ws), "true"), None, None),
            ]
            if fe is not None:
                cases.append((_corral("gvisor", str(ws), "true", front=fe[0]), None, fe[1]))
            if fds:
                cases.append((do, fds, None))
            launcher = _launcher_pid(fe[1]) if fe is not None else None
            settle = (lambda: _warm_ready(launcher)) if launcher is not None else (lambda: None)
            bare, gv, *rest = _interleaved(cases, args.runs, tmp, settle)
        finally:
            for fd in fds:
                os.close(fd)
            if cg is not None:
                cg.remove()
            if fe is not None:
                _stop_launcher(fe[1])
        gv_fe = rest.pop(0) if fe is not None else None
        in_cg = rest[0] if rest else None
        rows.append(("true: gvisor vs bare runsc do", gv, bare, gv / bare))
        if in_cg is not None:
            name = "true: gvisor vs bare runsc do in a corral/ cgroup"
            rows.append((name, gv, in_cg, gv / in_cg))
        if gv_fe is not None:
            name = "true: gvisor (front end, pre-booted) vs bare runsc do"
            rows.append((name, gv_fe, bare, gv_fe / bare))
            if in_cg is not None:
                name = "true: gvisor (front end, pre-booted) vs bare runsc do in a corral/ cgroup"
                rows.append((name, gv_fe, in_cg, gv_fe / in_cg))
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
    print(f"load before: {load_before}")
    print(f"load after:  {_load()}")
    print(f"median of {args.runs} runs each (seconds)")
    for name, a, b, ratio in rows:
        print(f"{name:<{width}}  {a:7.3f}  {b:7.3f}  {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
