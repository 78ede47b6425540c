"""`corral exec -- true` against its peers, measured in the same run.

Prints the median and p90 wall time of each, the median CPU time (user +
system of the process and its children, from wait4: less sensitive to a loaded
host than wall time), the ratios issue 13 sets targets for (corral <= 30 ms
median, <= 3x bare bwrap, <= 0.1x srt), and where corral's time goes: the
interpreter, the imports, parsing and building the spec, start, wait, close.
The "front end + launcher" row is `corral exec -- true` through the compiled
front end and a resident launcher (`corral/exec/launcher.py`) started for the
run; its CPU column adds the launcher's and its workers' CPU (from
/proc/PID/stat, in clock ticks: a mean per run, not a median) to the client's.
"bare bwrap" has corral's namespaces and its few large mounts; "bare bwrap,
same view" gives the sandbox corral's whole file view (each /etc entry and
workspace placeholder its own bind, as a bwrap user would write it).

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
    cpu: list[float] | None = None,
) -> list[float]:
    out: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=preexec,  # noqa: PLW1509 (no threads in the bench)
        )
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        out.append(time.perf_counter() - t0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
        if cpu is not None:
            cpu.append(usage.ru_utime + usage.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {err.decode()[-500:]}")
    return out


def _start_launcher(tmp: str) -> tuple[str, dict[str, str], subprocess.Popen[bytes]]:
    """Build the front end into `tmp`, start a launcher there; (front end, env, launcher)."""
    from corral.exec import launcher
    from corral.exec.frontend import build

    frontend = os.path.join(tmp, "corral")
    build(frontend)
    sock = os.path.join(tmp, "l.sock")
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-I", "-c", launcher._BOOT, launcher.source_root()),
            *("--socket", sock, "--idle-s", "600", "--ready-fd", str(ready_w)),
        ],
        pass_fds=(ready_w,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )
    os.close(ready_w)
    if not os.read(ready_r, 100):
        raise SystemExit("the launcher did not start")
    os.close(ready_r)
    env = dict(os.environ, CORRAL_LAUNCHER_SOCKET=sock, CORRAL_LAUNCHER="require")
    return frontend, env, proc


def _ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of `pid` (clock ticks)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15])


def _idle(pid: int) -> bool:
    """Whether the launcher serves nothing and its warm worker is set up (`corral-warm`)."""
    kids: list[str] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            kids += fh.read().split()
    names = []
    for kid in kids:
        try:
            with open(f"/proc/{kid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:
            names.append("")
    return names == ["corral-warm"]


def _timed_launcher(
    argv: list[str], runs: int, env: dict[str, str], pid: int, cpu: list[float]
) -> list[float]:
    """`_timed`, plus the CPU the launcher and its (reaped) worker spent on each run.

    Each run starts at an idle launcher (its warm worker ready): a request
    arriving right as the previous worker exits waits for the warm fork. The
    serving worker's CPU, its preparation while warm included, counts in its run.
    """
    out: list[float] = []
    hz = os.sysconf("SC_CLK_TCK")
    for _ in range(runs):
        deadline = time.monotonic() + 10
        while not _idle(pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        before = _ticks(pid)
        client: list[float] = []
        out += _timed(argv, 1, env=env, cpu=client)
        deadline = time.monotonic() + 10
        while not _idle(pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        cpu.append(client[0] + (_ticks(pid) - before) / hz)
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


def _bare_bwrap_same_view(ws: str, data_dir: str) -> list[str]:
    """bwrap giving the sandbox corral's own file view, the way a bwrap user would.

    corral's bwrap argv for `ws` as a non-root caller would get it (every
    allowlisted /etc entry, the system links, the workspace's protection
    placeholders: one `--ro-bind` each), with what is corral's alone taken
    out: the seccomp filter, the status descriptor, the compiled init (the
    command runs directly) and the descriptors behind `--ro-bind-data` (files
    in `data_dir` instead). The placeholders are created in `ws` once, as
    corral creates them for each sandbox.
    """
    from corral.exec.cli import build_spec, parse_args
    from corral.sandbox.namespace import preview_argv

    ns, cmd = parse_args(["--workspace", ws, "--", "true"])
    full = preview_argv(build_spec(ns, cmd, {}), root=False)
    cut = full.index("--")
    argv, i = [full[0]], 1
    while i < cut:
        opt = full[i]
        if opt in ("--seccomp", "--json-status-fd"):
            i += 2
        elif opt == "--ro-bind-data":
            dest = full[i + 2]
            path = os.path.join(data_dir, dest.strip("/").replace("/", "_"))
            with open(dest if os.path.exists(dest) else os.devnull, "rb") as src:
                Path(path).write_bytes(src.read()[:4096])
            argv += ["--ro-bind", path, dest]
            i += 3
        elif opt == "--ro-bind" and full[i + 2] == "/run/corral/init":
            i += 3
        else:
            if opt == "--ro-bind" and full[i + 1] == full[i + 2] and full[i + 1].startswith(ws):
                placeholder = Path(full[i + 1])
                if not placeholder.exists():
                    placeholder.touch()
            argv.append(opt)
            i += 1
    return [*argv, "--", "true"]


def _drop_to(uid: int) -> Callable[[], None]:
    def fn() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return fn


#: The in-process steps of `corral exec -- true`, in order.
STEPS = ("parse+spec", "start", "wait", "close")


def _in_process(ws: str, runs: int, steps: dict[str, list[float]]) -> list[float]:
    """The sandbox alone, as `corral run` uses it: no interpreter start-up, no imports.

    Each step's wall time is appended to `steps`.
    """
    from corral.exec.cli import build_spec, parse_args
    from corral.sandbox.namespace import NamespaceSandbox

    out: list[float] = []
    for i in range(runs + 2):
        t0 = time.perf_counter()
        ns, cmd = parse_args(["--workspace", ws, "--", "true"])
        spec = build_spec(ns, cmd, {})
        t1 = time.perf_counter()
        running = NamespaceSandbox(spec).start()
        t2 = time.perf_counter()
        try:
            result = running.wait(30)
            t3 = time.perf_counter()
        finally:
            running.close()
        t4 = time.perf_counter()
        if result.exit != 0:
            raise SystemExit(f"in-process sandbox failed: {result}")
        if i >= 2:
            out.append(t4 - t1)
            for name, d in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps.setdefault(name, []).append(d)
    return out


def _exec_modules(ws: str) -> list[str]:
    """The modules `corral exec -- true` imports beyond a bare interpreter's."""
    code = (
        "import sys; before = set(sys.modules)\n"
        "from corral.exec.cli import run_exec\n"
        f"run_exec(['--workspace', {ws!r}, '--', 'true'])\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return [m for m in out.split() if not m.startswith("__")]


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
    cpu: dict[str, list[float]] = {}
    steps: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="corral-bench-") as ws,
        tempfile.TemporaryDirectory(prefix="cb-", dir="/tmp") as ltmp,
        tempfile.TemporaryDirectory(prefix="corral-bench-bare-") as bare_ws,
        tempfile.TemporaryDirectory(prefix="corral-bench-data-") as data_dir,
    ):
        os.chmod(ws, 0o755)
        frontend, fe_env, launcher_proc = _start_launcher(ltmp)
        fe_argv = [frontend, "exec", "--workspace", ws, "--", "true"]
        _timed(fe_argv, 3, env=fe_env)
        # warm-up: page cache, .pyc files, the seccomp cache
        _timed([*corral, "--workspace", ws, "--", "true"], 3)
        modules = _exec_modules(ws)
        imports = [sys.executable, "-c", "import " + ", ".join(modules)]
        print(f"runs per command: {args.runs}; corral exec imports {len(modules)} modules")
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} CPUs")
        commands: list[tuple[str, list[str], Callable[[], None] | None]] = [
            ("bare bwrap", _bare_bwrap(ws), None),
            ("bare bwrap, same view", _bare_bwrap_same_view(bare_ws, data_dir), None),
            ("corral exec -- true", [*corral, "--workspace", ws, "--", "true"], None),
            ("python -c pass (venv)", [sys.executable, "-c", "pass"], None),
            ("python -I -S -c pass", [sys.executable, "-I", "-S", "-c", "pass"], None),
            ("python -c 'import <exec>'", imports, None),
        ]
        if os.geteuid() == 0:
            commands.insert(1, ("bare bwrap (uid 64000)", _bare_bwrap(ws), _drop_to(64000)))
        srt = shutil.which("srt") or str(REPO / "tools/srt/node_modules/.bin/srt")
        if os.access(srt, os.X_OK):
            # In the rounds too: a ratio of figures taken at different loads says little.
            commands.append(("srt -c true", [srt, "-c", "true"], None))
        else:
            print(
                "srt: not installed (npm install --prefix tools/srt @anthropic-ai/sandbox-runtime)"
            )
        # Interleaved rounds: a load change hits every command alike.
        rounds = 5
        loads: list[float] = []
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            for name, argv, pre in commands:
                results.setdefault(name, []).extend(
                    _timed(
                        argv, max(1, args.runs // rounds), preexec=pre, cpu=cpu.setdefault(name, [])
                    )
                )
            results.setdefault(FRONTEND, []).extend(
                _timed_launcher(
                    fe_argv,
                    max(1, args.runs // rounds),
                    fe_env,
                    launcher_proc.pid,
                    cpu.setdefault(FRONTEND, []),
                )
            )
            results.setdefault("sandbox in-process", []).extend(
                _in_process(ws, max(1, args.runs // rounds), steps)
            )
        loads.append(os.getloadavg()[0])
        launcher_proc.terminate()
        launcher_proc.wait(30)
    print(f"1-minute load average during the rounds: {min(loads):.2f}-{max(loads):.2f}")
    for name, xs in results.items():
        cpu_col = f"   cpu {statistics.median(cpu[name]) * 1000:7.1f} ms" if cpu.get(name) else ""
        if name == FRONTEND:
            cpu_col = f"   cpu {statistics.mean(cpu[name]) * 1000:7.1f} ms (mean, incl. worker)"
        print(f"{name:28s} {_fmt(xs)}{cpu_col}")
    med = {k: statistics.median(v) for k, v in results.items()}
    c = med["corral exec -- true"]
    print("where corral exec's time goes (medians):")
    interp = med["python -c pass (venv)"]
    print(f"  interpreter (python -c pass)      {interp * 1000:7.1f} ms")
    print(f"  imports (import <exec> - pass)    {(med[imports_key()] - interp) * 1000:7.1f} ms")
    for name in STEPS:
        print(f"  {name:32s}  {statistics.median(steps[name]) * 1000:7.1f} ms")
    rest = c - med[imports_key()] - sum(statistics.median(steps[n]) for n in STEPS)
    print(f"  rest (signals, journal-less compose, exit) {rest * 1000:6.1f} ms")
    print(f"ratio corral / bare bwrap:            {c / med['bare bwrap']:.2f}x  (target <= 3x)")
    if "srt -c true" in med:
        ratio = c / med["srt -c true"]
        print(f"ratio corral / srt:                   {ratio:.2f}x  (target <= 0.1x)")
    print(f"corral median:                        {c * 1000:.1f} ms (target <= 30 ms)")
    fe = med[FRONTEND]
    print(f"front end + launcher median:          {fe * 1000:.1f} ms (target <= 30 ms)")
    print(f"ratio front end / bare bwrap:         {fe / med['bare bwrap']:.2f}x  (target <= 3x)")
    same = med["bare bwrap, same view"]
    print(f"ratio front end / bare bwrap, same view: {fe / same:.2f}x  (target <= 3x)")
    if "srt -c true" in med:
        print(
            f"ratio front end / srt:                {fe / med['srt -c true']:.2f}x"
            "  (target <= 0.1x)"
        )
    print(f"ratio front end / corral exec:        {fe / c:.2f}x")
    lib = med["sandbox in-process"]
    ratio = lib / med["bare bwrap"]
    print(f"in-process sandbox / bare bwrap:      {ratio:.2f}x  ({lib * 1000:.1f} ms)")
    return 0


FRONTEND = "front end + launcher"


def imports_key() -> str:
    return "python -c 'import <exec>'"


if __name__ == "__main__":
    raise SystemExit(main())
