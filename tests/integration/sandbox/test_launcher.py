"""`corral exec` through the compiled front end and the resident launcher (issue 13).

The front end (`_frontend/frontend.c`) hands argv, environment, umask, cwd and
stdio to a launcher that forks one worker per request. These tests run the
real binary against a launcher of their own (its socket in a private
directory named by CORRAL_LAUNCHER_SOCKET; CORRAL_LAUNCHER=require so that a
silent fallback to the Python CLI cannot pass for the launcher) and attack it:
kill -9 of the client, of the launcher and of the worker; a connection from
another uid; a sandbox reaching for the socket; edited sources.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.exec import launcher
from corral.exec.frontend import build

from .conftest import ExecFn, ExecOutcome, corral_argv, parse_summary, processes_with, wait_for
from .test_cli_contract import (
    test_exit_status_is_the_commands_own,
    test_killed_by_signal,
    test_layers_reported,
    test_private_workspace_and_file_ownership,
)
from .test_egress import (
    test_allowlisted_reachable_others_denied_and_journaled,
    test_no_egress_without_allow,
    upstream,
)
from .test_isolation import (
    test_caller_secrets_absent_from_environment,
    test_home_canary_unreadable,
    test_writes_outside_workspace_do_not_reach_host,
)
from .test_kill9_points import _cgroups_of, _procs_in

pytestmark = [pytest.mark.requires_sandbox]

__all__ = [
    # The existing `corral exec` tests, run here through the front end (`corral_exec` below).
    "test_allowlisted_reachable_others_denied_and_journaled",
    "test_caller_secrets_absent_from_environment",
    "test_exit_status_is_the_commands_own",
    "test_home_canary_unreadable",
    "test_killed_by_signal",
    "test_layers_reported",
    "test_no_egress_without_allow",
    "test_private_workspace_and_file_ownership",
    "test_writes_outside_workspace_do_not_reach_host",
    "upstream",
]

# Their module's marks do not come along with them.
test_allowlisted_reachable_others_denied_and_journaled = pytest.mark.requires_curl(
    test_allowlisted_reachable_others_denied_and_journaled
)
test_no_egress_without_allow = pytest.mark.requires_curl(test_no_egress_without_allow)

CLIENT = Path(__file__).with_name("launcher_client.py")


@pytest.fixture(scope="module")
def frontend() -> Iterator[Path]:
    # World-readable: the other-uid test runs it too.
    d = Path(tempfile.mkdtemp(prefix="corral-fe-"))
    d.chmod(0o755)
    out = d / "corral"
    build(str(out))
    yield out
    shutil.rmtree(d, ignore_errors=True)


@dataclass
class Launcher:
    socket: Path
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def env(self, *, require: bool = True) -> dict[str, str]:
        env = dict(os.environ, CORRAL_LAUNCHER_SOCKET=str(self.socket))
        if require:
            env["CORRAL_LAUNCHER"] = "require"
        else:
            env.pop("CORRAL_LAUNCHER", None)
        return env

    def workers(self) -> list[int]:
        """The launcher's serving workers (not the warm one waiting for the next request)."""
        return [p for p in children_of(self.pid) if not comm(p).startswith(launcher.WARM_COMM)]

    def warm(self) -> list[int]:
        """The launcher's warm worker, set up ahead of the next request ([] while serving)."""
        return [p for p in children_of(self.pid) if comm(p) == launcher.WARM_COMM]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(p) for p in (task / "children").read_text().split()]
    return sorted(out)


def started(marker: str, client: subprocess.Popen[bytes], n: int = 1) -> bool:
    """Whether `n` processes other than the client (whose argv names it too) carry `marker`."""
    return len([p for p in processes_with(marker) if p != client.pid]) >= n


def running_as(name: str) -> bool:
    """Whether a process's last argument is exactly `name` (`sh -c CMD NAME` has it as $0)."""
    for pid in processes_with(name):
        with contextlib.suppress(OSError):
            if (
                Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")[-1]
                == name.encode()
            ):
                return True
    return False


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_launcher(sock: Path, idle_s: float = 120.0) -> Launcher:
    ready_r, ready_w = os.pipe()
    log = open(sock.parent / "test-launcher.log", "ab")  # noqa: SIM115 (the launcher keeps it)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-I", "-c", launcher._BOOT, launcher.source_root()),
            *("--socket", str(sock), "--idle-s", str(idle_s), "--ready-fd", str(ready_w)),
        ],
        pass_fds=(ready_w,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
        cwd="/",
    )
    log.close()
    os.close(ready_w)
    try:
        readable, _, _ = select.select([ready_r], [], [], 60)
        assert readable and os.read(ready_r, 100).strip() == str(proc.pid).encode(), (
            sock.parent / "test-launcher.log"
        ).read_text()
    finally:
        os.close(ready_r)
    return Launcher(sock, proc)


def listener_pid(sock: Path) -> int | None:
    """The pid serving `sock` (SO_PEERCRED), or None when nothing accepts there."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(sock))
        raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", raw)[0])
    except OSError:
        return None
    finally:
        s.close()


def _has_interpreter(path: Path) -> bool:
    """Whether an ELF64 executable names a program interpreter (PT_INTERP)."""
    import struct

    data = path.read_bytes()
    assert data[:5] == b"\x7fELF\x02", "not an ELF64 file"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def test_the_front_end_is_static_where_the_c_library_allows(frontend: Path) -> None:
    """No dynamic loader on every `corral exec` (install-system.sh installs libc6-dev, whose
    libc.a the compiled init links too); without the archive it is linked dynamically."""
    import glob

    static_libc = bool(glob.glob("/usr/lib/*/libc.a") or glob.glob("/usr/lib/libc.a"))
    assert _has_interpreter(frontend) is not static_libc


@pytest.fixture
def launcher_proc() -> Iterator[Launcher]:
    # Short: sun_path holds 108 bytes, and the front end does not shorten it.
    d = Path(tempfile.mkdtemp(prefix="cl-", dir="/tmp"))
    started = start_launcher(d / "l.sock")
    try:
        yield started
    finally:
        for pid in {started.pid, listener_pid(started.socket)}:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        started.proc.wait(30)
        # One started in the background (a fallback) is nobody's child here.
        wait_for(lambda: listener_pid(started.socket) is None, 15)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def corral_exec(workspace: Path, frontend: Path, launcher_proc: Launcher) -> ExecFn:
    """The conftest's `corral_exec`, through the front end and the launcher."""

    def run(
        *cmd: str,
        opts: tuple[str, ...] = (),
        timeout: float = 60,
        env: dict[str, str] | None = None,
        ws: Path | None = None,
    ) -> ExecOutcome:
        argv = [str(frontend), "exec", "--workspace", str(ws or workspace), "--json", *opts]
        full_env = launcher_proc.env()
        if env is not None:
            full_env = {
                **env,
                **{k: full_env[k] for k in ("CORRAL_LAUNCHER", "CORRAL_LAUNCHER_SOCKET")},
            }
        proc = subprocess.run(
            [*argv, "--", *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=full_env,
        )
        assert "CORRAL_LAUNCHER=require" not in proc.stderr, proc.stderr
        return ExecOutcome(proc.returncode, proc.stdout, proc.stderr, parse_summary(proc.stderr))

    return run


# --- identical to the Python path ------------------------------------------------------------

_CASES = {
    "streams-and-status": ((), ("sh", "-c", "echo out; echo err >&2; exit 7")),
    "not-found": ((), ("no-such-command-here",)),
    "bad-option-value": (("--memory", "lots"), ("true",)),
    "unknown-option": (("--no-such-flag",), ("true",)),
    "cwd-umask-env": ((), ("sh", "-c", 'pwd; umask; echo "$LANG"')),
    "rlimits": ((), ("sh", "-c", "ulimit -n; ulimit -c; ulimit -s")),
    "stdin": ((), ("sh", "-c", "cat; echo end")),
    "dry-run": (("--dry-run",), ("true",)),
    "help": (("--help",), ()),
}


def _caller_state() -> None:
    """A caller whose umask and resource limits differ from the launcher's."""
    os.umask(0o027)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, nofile))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_STACK, (4 << 20, resource.RLIM_INFINITY))


@pytest.mark.parametrize("case", sorted(_CASES))
def test_same_outcome_as_the_python_cli(
    case: str, frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    opts, cmd = _CASES[case]
    # No --workspace: the workspace is the caller's cwd, passed as a descriptor.
    outcomes = []
    for argv, env in (
        (corral_argv(*opts, "--", *cmd), dict(os.environ, LANG="C.UTF-8")),
        ([str(frontend), "exec", *opts, "--", *cmd], {**launcher_proc.env(), "LANG": "C.UTF-8"}),
    ):
        proc = subprocess.run(
            argv,
            input=b"from stdin\n",
            capture_output=True,
            cwd=workspace,
            env=env,
            timeout=60,
            check=False,
            preexec_fn=_caller_state,
        )
        outcomes.append((proc.returncode, proc.stdout, proc.stderr))
    assert outcomes[1] == outcomes[0]
    assert launcher_proc.workers() == [] or wait_for(lambda: launcher_proc.workers() == [], 10)


def test_the_front_end_really_used_the_launcher(
    frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    proc = subprocess.Popen(
        [str(frontend), "exec", "--", "sh", "-c", "sleep 60", marker],
        cwd=workspace,
        env=launcher_proc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_for(lambda: started(marker, proc, 3), 30)  # bwrap, bwrap, sh
        # The sandbox's bwrap is a child of a worker of the launcher, not of the client.
        (worker,) = launcher_proc.workers()
        assert children_of(worker)
        assert children_of(proc.pid) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err


# --- kill -9 of the client, the launcher, the worker -----------------------------------------


def _mounts_naming(path: Path) -> list[str]:
    return [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in ln]


def _daemonising(marker: str) -> list[str]:
    return [
        "sh",
        "-c",
        f'setsid sh -c "sleep 1000" {marker}-daemon & exec sh -c "sleep 1000" {marker}-main',
    ]


@pytest.mark.parametrize("point", ["worker-forked", "bwrap-started", "command-running"])
def test_kill9_of_the_client_tears_the_sandbox_down(
    point: str, frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    """The worker sees EOF and tears down as for a signal; the host keeps nothing."""
    client = subprocess.Popen(
        [str(frontend), "exec", "--", *_daemonising(marker)],
        cwd=workspace,
        env=launcher_proc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []

    def reached() -> bool:
        workers[:] = launcher_proc.workers()
        if point == "worker-forked":
            return bool(workers)
        if point == "bwrap-started":
            return any(children_of(w) for w in workers)
        return running_as(f"{marker}-daemon") and running_as(f"{marker}-main")

    assert wait_for(reached, 30), point
    client.kill()
    client.wait()
    assert workers
    assert wait_for(lambda: not any(alive(w) for w in workers), 30), "worker outlived its client"
    assert wait_for(lambda: processes_with(marker) == [], 10), processes_with(marker)
    assert _mounts_naming(workspace) == []
    leftovers = [cg for w in workers for cg in _cgroups_of(w)]
    assert _procs_in(leftovers) == 0
    # What a dead owner leaves, the next exec sweeps (as after kill -9 of `corral exec`).
    subprocess.run(corral_argv("--workspace", str(workspace), "--", "true"), check=True)
    assert [cg for cg in leftovers if os.path.isdir(cg)] == []


def test_kill9_of_the_launcher_leaves_running_sandboxes_to_finish(
    frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    gate = workspace / "go"
    client = subprocess.Popen(
        [
            str(frontend),
            "exec",
            "--",
            "sh",
            "-c",
            "while [ ! -e go ]; do sleep 0.05; done; echo done; exit 5",
            marker,
        ],
        cwd=workspace,
        env=launcher_proc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: started(marker, client, 3), 30)
    os.kill(launcher_proc.pid, signal.SIGKILL)
    launcher_proc.proc.wait()
    gate.touch()
    out, err = client.communicate(timeout=60)
    assert (client.returncode, out) == (5, b"done\n"), err
    assert wait_for(lambda: processes_with(marker) == [], 10)
    # The next client finds a dead socket: it runs the Python CLI, which starts a launcher.
    env = launcher_proc.env(require=False)
    proc = subprocess.run(
        [str(frontend), "exec", "--", "sh", "-c", "echo fallback"],
        cwd=workspace, env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, b"fallback\n"), proc.stderr
    assert wait_for(lambda: listener_pid(launcher_proc.socket) is not None, 60)
    proc = subprocess.run(
        [str(frontend), "exec", "--", "sh", "-c", "echo relaunched"],
        cwd=workspace, env=launcher_proc.env(), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, b"relaunched\n"), proc.stderr


def test_kill9_of_the_worker_is_kill9_of_corral_exec(
    frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    client = subprocess.Popen(
        [str(frontend), "exec", "--", *_daemonising(marker)],
        cwd=workspace,
        env=launcher_proc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: running_as(f"{marker}-daemon") and running_as(f"{marker}-main"), 30)
    (worker,) = launcher_proc.workers()
    os.kill(worker, signal.SIGKILL)
    _, err = client.communicate(timeout=30)
    assert client.returncode == 125
    assert b"worker died" in err
    # bwrap's --die-with-parent and the pid namespace's end take the rest.
    assert wait_for(lambda: processes_with(marker) == [], 10), processes_with(marker)
    assert _mounts_naming(workspace) == []
    leftovers = _cgroups_of(worker)
    # A bwrap or init still exiting (killed, its command line already empty) is
    # still in the cgroup for a moment: what must hold is that nothing stays.
    assert wait_for(lambda: _procs_in(leftovers) == 0, 10), leftovers
    subprocess.run(corral_argv("--workspace", str(workspace), "--", "true"), check=True)
    assert [cg for cg in leftovers if os.path.isdir(cg)] == []


def test_relayed_signal_interrupts_like_a_signal_to_corral_exec(
    frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    client = subprocess.Popen(
        [str(frontend), "exec", "--", *_daemonising(marker)],
        cwd=workspace,
        env=launcher_proc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: running_as(f"{marker}-daemon") and running_as(f"{marker}-main"), 30)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=30)
    assert client.returncode == 128 + signal.SIGINT, err
    assert processes_with(marker) == []


# --- who may talk to the launcher ------------------------------------------------------------


def _client_argv(sock: Path, target: Path) -> list[str]:
    return [
        "python3", str(CLIENT), str(sock), launcher.BUILD_ID,
        "exec", "--workspace", str(target), "--", "touch", str(target / "pwned"),
    ]  # fmt: skip


@pytest.mark.requires_root
def test_another_uid_is_refused(launcher_proc: Launcher, tmp_path: Path) -> None:
    target = Path(tempfile.mkdtemp(prefix="corral-uid-"))
    target.chmod(0o777)
    sock = launcher_proc.socket
    try:
        # Past the 0700 directory and the 0600 socket (the first two guards): only
        # SO_PEERCRED stands between uid 64000 and a sandbox of root's choosing.
        sock.parent.chmod(0o711)
        sock.chmod(0o666)

        def drop() -> None:
            os.setgroups([])
            os.setresgid(64000, 64000, 64000)
            os.setresuid(64000, 64000, 64000)

        proc = subprocess.run(
            _client_argv(sock, target), cwd="/", capture_output=True, text=True,
            timeout=60, check=False, preexec_fn=drop,
        )  # fmt: skip
        assert proc.returncode == 3, proc.stderr  # the connection closed, unanswered
        assert not (target / "pwned").exists()
        assert launcher_proc.workers() == []
        # The control: the same request from the launcher's own uid is served.
        proc = subprocess.run(
            _client_argv(sock, target), cwd="/", capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (target / "pwned").exists()
    finally:
        sock.parent.chmod(0o700)
        shutil.rmtree(target, ignore_errors=True)


def test_the_sandbox_cannot_reach_the_launcher(
    corral_exec: ExecFn, launcher_proc: Launcher, workspace: Path
) -> None:
    target = Path(tempfile.mkdtemp(prefix="corral-reach-"))
    try:
        shutil.copy(CLIENT, workspace / "client.py")
        argv = _client_argv(launcher_proc.socket, target)
        argv[1] = "client.py"
        out = corral_exec(*argv)
        assert out.code == 3, out.stderr  # no launcher reachable from inside
        assert not (target / "pwned").exists()
        # Handing the socket's directory to the sandbox is refused outright.
        for opt in ("--ro", "--rw"):
            out = corral_exec("true", opts=(opt, str(launcher_proc.socket.parent.parent)))
            assert out.code == 2
            assert "launcher and broker sockets" in out.stderr
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_edited_sources_retire_the_launcher(
    frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """Stale code never runs: after an edit the launcher refuses, goes, and is replaced."""
    victim = Path(launcher.source_root()) / "corral" / "exec" / "__init__.py"
    st = victim.stat()
    # Same times, so nothing else notices (no .pyc is invalidated); inotify sees the change.
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = subprocess.run(
        [str(frontend), "exec", "--", "sh", "-c", "echo ran"],
        cwd=workspace, env=launcher_proc.env(require=False), capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, b"ran\n"), proc.stderr
    launcher_proc.proc.wait(30)  # the old launcher is gone, having served nothing
    assert wait_for(lambda: listener_pid(launcher_proc.socket) not in (None, launcher_proc.pid), 60)
