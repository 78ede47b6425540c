"""The compiled init is linked statically where the C library allows it, dynamically otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from corral.sandbox import initbin

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

_PT_INTERP = 3


def _has_interpreter(path: str) -> bool:
    """Whether an ELF64 little-endian file names a dynamic loader (a PT_INTERP header)."""
    data = Path(path).read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01"
    phoff = int.from_bytes(data[32:40], "little")
    size, count = int.from_bytes(data[54:56], "little"), int.from_bytes(data[56:58], "little")
    return any(
        int.from_bytes(data[phoff + i * size : phoff + i * size + 4], "little") == _PT_INTERP
        for i in range(count)
    )


def _works(binary: str) -> None:
    r, w = os.pipe()
    proc = subprocess.run([binary, str(w), "--", "sh", "-c", "exit 7"], pass_fds=(w,), check=False)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        events = fh.read()
    assert proc.returncode == 7
    assert b'"event": "exit", "code": 7' in events


def _static_libc() -> bool:
    if shutil.which("cc") is None:
        return False
    out = subprocess.run(
        ["cc", "-print-file-name=libc.a"], capture_output=True, text=True, check=False
    )
    return os.path.isabs(out.stdout.strip())


@pytest.mark.skipif(not _static_libc(), reason="the C library has no static archive (libc.a)")
def test_init_is_static(tmp_path: Path) -> None:
    binary = initbin.init_binary(str(tmp_path))
    assert binary is not None
    assert not _has_interpreter(binary)
    _works(binary)


def test_dynamic_when_static_linking_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(initbin, "_INIT_LINKS", (("-Wl,--corral-no-such-option",), ()))
    binary = initbin.init_binary(str(tmp_path))
    assert binary is not None
    assert _has_interpreter(binary)
    _works(binary)


@pytest.mark.requires_strace
@pytest.mark.requires_landlock
@pytest.mark.requires_seccomp
def test_start_up_events_are_one_write(tmp_path: Path) -> None:
    """The init's start-up lines (landlock, seccomp_log, started) reach the
    host in one write, so a host waiting on the pipe wakes once for them;
    the exit line follows in its own. Counted with strace, not timed."""
    from corral.exec.cli import sandbox_env
    from corral.sandbox import landlock, seccomp
    from corral.sandbox.namespace import init_command
    from corral.sandbox.spec import SandboxSpec

    binary = initbin.init_binary(str(tmp_path / "cache"))
    assert binary is not None
    spec = SandboxSpec(
        argv=("true",), workspace=str(tmp_path), env=tuple(sandbox_env("/home/corral", {}).items())
    )
    bpf_fd = seccomp.bpf_fd(seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, str(tmp_path / "cache")))
    r, w = os.pipe()
    argv, _, _ = init_command(
        spec, binary=binary, abi=landlock.abi_version(), status_fd=w, seccomp_log_fd=bpf_fd
    )
    log = tmp_path / "strace.log"
    strace = shutil.which("strace")
    assert strace is not None
    # -f: the line for the started command is written after the fork.
    cmd = [strace, "-f", "-qq", "-e", "trace=write", "-e", "signal=none", "-o", str(log)]
    proc = subprocess.run(
        [*cmd, binary, *argv[1:]], pass_fds=(w, bpf_fd), check=False, cwd=tmp_path
    )
    os.close(w)
    os.close(bpf_fd)
    with os.fdopen(r, "rb") as fh:
        lines = fh.read().splitlines()
    assert proc.returncode == 0
    events = [line.split(b'"')[3] for line in lines]
    assert events == [b"landlock", b"seccomp_log", b"started", b"exit"]
    writes = [x for x in log.read_text().splitlines() if f"write({w}," in x]
    assert len(writes) == 2, writes
