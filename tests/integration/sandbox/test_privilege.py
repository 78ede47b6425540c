"""M8: unprivileged uid, no capabilities, seccomp denials, no TIOCSTI."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox]

SYSCALL_PROBE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def sc(*args):
    r = libc.syscall(*args)
    return 'OK' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')
print('ptrace', sc(101, 16, 1, 0, 0))                 # PTRACE_ATTACH to pid 1
print('unshare_user', sc(272, 0x10000000))            # unshare(CLONE_NEWUSER)
print('unshare_ns', sc(272, 0x00020000))              # unshare(CLONE_NEWNS)
print('mount', sc(165, b'none', b'/tmp', b'tmpfs', 0, None))
print('io_uring', sc(425, 8, ctypes.create_string_buffer(120)))
print('bpf', sc(321, 0, None, 0))
print('perf', sc(298, ctypes.create_string_buffer(128), 0, -1, -1, 0))
print('userfaultfd', sc(323, 0))
print('keyctl', sc(250, 0, 0, 0, 0, 0))
print('vm_readv', sc(310, 1, None, 0, None, 0, 0))
"""


def _results(stdout: str) -> dict[str, str]:
    return dict(line.split() for line in stdout.splitlines() if len(line.split()) == 2)


def test_dangerous_syscalls_refused(corral_exec: ExecFn, workspace: Path) -> None:
    (workspace / "probe.py").write_text(SYSCALL_PROBE)
    out = corral_exec("python3", "probe.py")
    assert out.code == 0, out.stderr
    res = _results(out.stdout)
    assert set(res) == {
        "ptrace",
        "unshare_user",
        "unshare_ns",
        "mount",
        "io_uring",
        "bpf",
        "perf",
        "userfaultfd",
        "keyctl",
        "vm_readv",
    }
    for name, verdict in res.items():
        assert verdict != "OK", f"{name} succeeded inside the sandbox"
        assert verdict in ("EPERM", "ENOSYS"), (name, verdict)


def test_unshare_and_mount_tools_fail(corral_exec: ExecFn) -> None:
    out = corral_exec(
        "sh", "-c", "unshare -U true && echo UNSHARED; mount -t tmpfs none /tmp && echo MOUNTED"
    )
    assert "UNSHARED" not in out.stdout
    assert "MOUNTED" not in out.stdout


def test_runs_unprivileged_without_capabilities(corral_exec: ExecFn, workspace: Path) -> None:
    out = corral_exec(
        "sh",
        "-c",
        "grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    fields = {
        k.strip(): v.split() for k, v in (line.split(":", 1) for line in out.stdout.splitlines())
    }
    assert fields["Uid"][0] != "0"
    assert fields["CapEff"] == ["0000000000000000"]
    assert fields["CapPrm"] == ["0000000000000000"]
    assert fields["NoNewPrivs"] == ["1"]
    assert fields["Seccomp"] == ["2"]
    # On the host, the sandboxed processes belong to an unprivileged uid.
    (workspace / "w.sh").write_text("sleep 5 & echo $! > pid; wait\n")


def test_host_uid_of_sandboxed_process_is_unprivileged(workspace: Path, marker: str) -> None:
    from .conftest import corral_argv, processes_with, wait_for

    with subprocess.Popen(
        corral_argv(
            "--workspace",
            str(workspace),
            "--",
            "python3",
            "-c",
            "import time; time.sleep(20)",
            marker,
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:
            assert wait_for(
                lambda: any(
                    Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"python3")
                    for p in processes_with(marker)
                )
            )
            pids = [
                p
                for p in processes_with(marker)
                if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"python3")
            ]
            for pid in pids:
                assert os.stat(f"/proc/{pid}").st_uid != 0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


def test_tiocsti_refused(corral_exec: ExecFn) -> None:
    code = (
        "import fcntl, os, errno\n"
        "fd = os.open('/dev/tty', os.O_RDWR) if os.path.exists('/dev/tty') else 0\n"
        "try:\n"
        "    fcntl.ioctl(fd, 0x5412, b'x'); print('INJECTED')\n"
        "except OSError as e:\n"
        "    print('refused', errno.errorcode.get(e.errno))\n"
    )
    out = corral_exec("python3", "-c", code)
    assert "INJECTED" not in out.stdout


def test_signal_to_host_process_impossible(corral_exec: ExecFn) -> None:
    with subprocess.Popen(["sleep", "30"]) as victim:
        try:
            out = corral_exec("sh", "-c", f"kill -9 {victim.pid}; kill -9 1; echo done")
            time.sleep(0.2)
            assert victim.poll() is None, "a host process was killed from inside the sandbox"
            assert "done" in out.stdout
        finally:
            victim.kill()
            victim.wait()
