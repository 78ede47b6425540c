"""The gvisor backend against the real runsc: contract points and adversarial basics.

Every attack is judged on the host: files, sockets, processes and cgroups
the host sees, never on what the sandboxed command says about itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.integration.sandbox.conftest import ExecFn, corral_argv, wait_for

pytestmark = [pytest.mark.requires_runsc, pytest.mark.requires_root, pytest.mark.requires_cgroup]

GV = ("--backend", "gvisor")
# A daemon that leaves the command's session and keeps writing to the workspace.
DAEMON = "setsid sh -c 'while :; do echo x >> tick; sleep 0.05; done' </dev/null >/dev/null 2>&1 &"


def _size(p: Path) -> int:
    return p.stat().st_size if p.exists() else 0


def _stops_growing(p: Path) -> bool:
    before = _size(p)
    time.sleep(0.6)
    return _size(p) == before


def test_exit_status_env_and_ownership(corral_exec: ExecFn, workspace: Path) -> None:
    out = corral_exec(
        "sh",
        "-c",
        "env > env.txt; mkdir d; echo hi > d/f; exit 7",
        opts=GV,
        env={**os.environ, "SECRET_TOKEN": "s3"},
    )
    assert out.code == 7, out.stderr
    assert out.summary["reason"] == "exited"
    env = (workspace / "env.txt").read_text()
    assert "SECRET_TOKEN" not in env and "s3" not in env
    for p in (workspace / "d", workspace / "d" / "f"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert out.summary["layers"]["gvisor"] in ("ptrace", "systrap", "kvm")  # type: ignore[index]


def test_timeout_is_124_and_daemon_gone(corral_exec: ExecFn, workspace: Path) -> None:
    out = corral_exec("sh", "-c", DAEMON + " sleep 100", opts=(*GV, "--timeout", "2"))
    assert out.code == 124 and out.summary["reason"] == "timeout"
    assert _stops_growing(workspace / "tick")


def test_setsid_daemon_gone_after_exit(corral_exec: ExecFn, workspace: Path) -> None:
    out = corral_exec("sh", "-c", DAEMON + " sleep 0.5; exit 0", opts=GV)
    assert out.code == 0, out.stderr
    assert _size(workspace / "tick") > 0  # the daemon did run
    assert _stops_growing(workspace / "tick")


def test_memory_limit_is_137(corral_exec: ExecFn) -> None:
    prog = "b = []\nwhile True: b.append(bytearray(16 << 20))"
    out = corral_exec("python3", "-c", prog, opts=(*GV, "--memory", "200M", "--timeout", "60"))
    assert out.code == 137, out.stderr
    assert out.summary["reason"] == "oom"
    assert int(out.summary["peak_memory_bytes"]) <= (200 << 20) + (1 << 20)  # type: ignore[call-overload]


def test_root_canary_absent(corral_exec: ExecFn, host_canary: tuple[Path, str]) -> None:
    path, secret = host_canary
    out = corral_exec("sh", "-c", f"cat {path}; cat /etc/shadow; cat /root/.bash_history", opts=GV)
    assert secret not in out.stdout
    assert "root:" not in out.stdout


def test_write_outside_workspace_has_no_host_effect(corral_exec: ExecFn, marker: str) -> None:
    targets = [f"/root/{marker}", f"/tmp/{marker}", f"/var/tmp/{marker}", f"/usr/{marker}"]
    out = corral_exec("sh", "-c", "; ".join(f"echo x > {t}" for t in targets), opts=GV)
    assert out.code != 0 or out.code == 0  # the status is not the verdict: the host is
    assert [t for t in targets if os.path.lexists(t)] == []


def _accepting(srv: socket.socket, seen: list[object]) -> threading.Thread:
    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.close()
            seen.append(1)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_host_loopback_service_unreachable(corral_exec: ExecFn) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    seen: list[object] = []
    _accepting(srv, seen)
    prog = (
        "import socket\nfor h in ('127.0.0.1', 'localhost'):\n"
        f" try: socket.create_connection((h, {port}), 2)\n except OSError: pass"
    )
    # Control: the same program on the host reaches the service.
    subprocess.run(["python3", "-c", prog], check=True, timeout=30)
    assert wait_for(lambda: len(seen) >= 1, timeout=5)
    time.sleep(0.2)
    control = len(seen)
    out = corral_exec("python3", "-c", prog, opts=GV)
    srv.close()
    assert out.code == 0, out.stderr
    assert len(seen) == control


def test_host_unix_socket_unreachable(corral_exec: ExecFn, workspace: Path) -> None:
    path = workspace / "host.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen()
    seen: list[object] = []
    _accepting(srv, seen)
    prog = (
        "import socket\ns = socket.socket(socket.AF_UNIX)\n"
        f"try: s.connect({str(path)!r})\nexcept OSError: pass"
    )
    subprocess.run(["python3", "-c", prog], check=True, timeout=30)
    assert wait_for(lambda: len(seen) >= 1, timeout=5)
    time.sleep(0.2)
    control = len(seen)
    out = corral_exec("python3", "-c", prog, opts=GV)
    time.sleep(0.2)
    srv.close()
    assert out.code == 0, out.stderr
    assert len(seen) == control


def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill9_of_corral_leaves_nothing(workspace: Path) -> None:
    argv = corral_argv(
        "--workspace", str(workspace), *GV, "--", "sh", "-c", DAEMON + " echo spawned; sleep 1000"
    )
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"spawned"
        tree = _descendants(proc.pid)
        assert len(tree) >= 3  # unshare, runsc, sentry, gofer, ...
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert wait_for(lambda: not any(_alive(p) for p in tree), timeout=10), [
        p for p in tree if _alive(p)
    ]
    assert _stops_growing(workspace / "tick")


def test_freeze_and_thaw(workspace: Path) -> None:
    from corral.sandbox.backend import GVisorConfig
    from corral.sandbox.spec import SandboxSpec

    spec = SandboxSpec(
        argv=("sh", "-c", "while :; do echo x >> tick; sleep 0.05; done"),
        workspace=str(workspace),
        env=(("PATH", "/usr/bin:/bin"),),
    )
    sb = GVisorConfig().load().start(spec)
    try:
        tick = workspace / "tick"
        assert wait_for(lambda: _size(tick) > 0, timeout=20)
        sb.freeze()
        time.sleep(0.2)
        assert _stops_growing(tick)
        sb.thaw()
        before = _size(tick)
        assert wait_for(lambda: _size(tick) > before, timeout=10)
        usage = sb.usage()
        assert usage is not None and usage.cpu_s > 0
    finally:
        sb.kill_all()
        sb.close()


ATTACK_STDIO = (
    "import os\n"
    "for fd in (0, 1, 2):\n"
    "    for f in (lambda: os.fchmod(fd, 0o6777), lambda: os.fchown(fd, 1000, 1000)):\n"
    "        try: f()\n"
    "        except OSError: pass\n"
    "print('done')\n"
)


def _ident(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid, st.st_mode


def test_host_files_given_as_stdio_are_not_reowned(workspace: Path, tmp_path: Path) -> None:
    """runsc fchowns its stdio fds: a host file corral was given as stdio must stay as it was."""
    files = [tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "err.txt"]
    for f in files:
        f.write_text("x\n")
        f.chmod(0o644)
    before = [_ident(str(f)) for f in files]
    null_before = _ident("/dev/null")
    argv = corral_argv("--workspace", str(workspace), *GV, "--", "python3", "-c", ATTACK_STDIO)
    with files[0].open("rb") as i, files[1].open("ab") as o, files[2].open("ab") as e:
        rc = subprocess.run(argv, stdin=i, stdout=o, stderr=e, timeout=60, check=False).returncode
    assert rc == 0, files[2].read_text()
    assert "done" in files[1].read_text()  # the output still arrives
    assert [_ident(str(f)) for f in files] == before
    # The same with /dev/null as stdin (a host device shared by every process).
    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
    assert _ident("/dev/null") == null_before


PROXY_GET = (
    "import os, socket\n"
    "host, port = os.environ['HTTP_PROXY'].rsplit('/', 1)[1].split(':')\n"
    "try:\n"
    "    s = socket.create_connection((host, int(port)), 3)\n"
    "    s.sendall(b'GET http://denied.invalid/ HTTP/1.1\\r\\nHost: denied.invalid\\r\\n\\r\\n')\n"
    "    print('reply', s.recv(12))\n"
    "except OSError as e:\n"
    "    print('refused', e)\n"
)


def test_broker_is_the_only_way_out(corral_exec: ExecFn) -> None:
    """The broker answers on the sandbox's link and journals the request; nothing else does."""
    out = corral_exec("python3", "-c", PROXY_GET, opts=(*GV, "--allow", "example.invalid"))
    assert out.code == 0, out.stderr
    assert out.summary["observations"] == {"allowed": 0, "denied": 1}  # the host's journal
    assert "egress" in out.summary["layers"]  # type: ignore[operator]


def test_broker_death_is_no_egress(workspace: Path, tmp_path: Path) -> None:
    """Kill the broker mid-run: the sandbox's next request reaches nothing (journal: no row)."""
    script = (
        "import os, time\nopen('ready', 'w').close()\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
    )
    journal = tmp_path / "j.sqlite"
    argv = corral_argv(
        "--workspace",
        str(workspace),
        *GV,
        "--allow",
        "example.invalid",
        "--journal",
        str(journal),
        "--json",
        "--",
        "python3",
        "-c",
        script + PROXY_GET,
    )
    # This test kills the exec's own broker process; the resident broker's death
    # has its own tests (tests/integration/broker/test_resident.py).
    env = {**os.environ, "CORRAL_BROKER": "cold"}
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert wait_for((workspace / "ready").exists, timeout=30)
        brokers = [
            p
            for p in _descendants(proc.pid)
            if b"corral.broker" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        assert brokers, "no broker process found"
        for p in brokers:
            os.kill(p, signal.SIGKILL)
        (workspace / "go").touch()
        stdout, stderr = proc.communicate(timeout=60)
    assert "refused" in stdout, stdout + stderr
    from tests.integration.sandbox.conftest import parse_summary

    assert parse_summary(stderr)["observations"] == {"allowed": 0, "denied": 0}


def test_home_is_writable(corral_exec: ExecFn) -> None:
    out = corral_exec("sh", "-c", 'echo home-ok > "$HOME/f" && cat "$HOME/f"', opts=GV)
    assert out.code == 0, out.stderr
    assert "home-ok" in out.stdout
