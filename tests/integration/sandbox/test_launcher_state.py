"""Issue 9 item 15: what is tested is what ships (seccomp fd, prctl checks, subreaper).

- the BPF descriptor bwrap reads is `seccomp.bpf_fd`'s sealed memfd: the
  host opens the very descriptor in the running bwrap monitor and asks the
  kernel for its seals, and a write through it fails;
- a PR_SET_PDEATHSIG the kernel refuses aborts the launch with a clear error;
- `NamespaceSandbox.start()` no longer makes its caller a subreaper; the
  `corral exec` entry point (`execute`) does.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.errors import SandboxStartError
from corral.exec.cli import sandbox_env
from corral.sandbox import namespace
from corral.sandbox.namespace import NamespaceSandbox
from corral.sandbox.spec import SandboxSpec

from .conftest import wait_for

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(60)]

_ALL_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def _spec(ws: Path, *argv: str) -> SandboxSpec:
    return SandboxSpec(
        argv=argv, workspace=str(ws), env=tuple(sorted(sandbox_env("/home/corral", {}).items()))
    )


def _ppid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def test_bwrap_reads_a_sealed_bpf_memfd(workspace: Path) -> None:
    seen: list[tuple[int, int | None]] = []

    def inspect(net_pid: int) -> None:
        # Root: the hook gets bwrap's monitor (the network namespace is made
        # before bwrap), whose child blocks on --block-fd before it reads the
        # BPF program, holding the descriptor; unprivileged: bwrap's child.
        monitor = net_pid if _ppid(net_pid) == os.getpid() else _ppid(net_pid)
        children = Path(f"/proc/{monitor}/task/{monitor}/children")
        assert wait_for(lambda: children.read_text().split() != [], 10)
        links = [
            f"/proc/{pid}/fd/{name}"
            for pid in (monitor, *map(int, children.read_text().split()))
            for name in os.listdir(f"/proc/{pid}/fd")
        ]
        for link in links:
            # Descriptors of a starting bwrap come and go between the listing
            # and the readlink/open: a vanished one is simply not ours to check.
            try:
                if not os.readlink(link).startswith("/memfd:corral-seccomp"):
                    continue
                fd = os.open(link, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            finally:
                os.close(fd)
            try:
                wfd = os.open(link, os.O_WRONLY)
            except OSError as exc:
                seen.append((seals, exc.errno))
                continue
            try:
                os.write(wfd, b"\0" * 8)
                seen.append((seals, None))
            except OSError as exc:
                seen.append((seals, exc.errno))
            finally:
                os.close(wfd)

    running = NamespaceSandbox(_spec(workspace, "true"), network_hook=inspect).start()
    try:
        result = running.wait(30)
    finally:
        running.close()
    assert result.exit == 0
    assert seen, "bwrap held no corral-seccomp memfd"
    for seals, write_err in seen:
        assert seals & _ALL_SEALS == _ALL_SEALS, hex(seals)
        assert write_err == errno.EPERM


def test_refused_pdeathsig_aborts_the_launch(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = namespace.set_pdeathsig
    # The kernel refuses a signal number past _NSIG: a real failing prctl.
    monkeypatch.setattr(namespace, "set_pdeathsig", lambda _sig: real(4096))
    marker = workspace / "ran"
    with pytest.raises(SandboxStartError, match=r"PR_SET_PDEATHSIG"):
        NamespaceSandbox(_spec(workspace, "touch", str(marker))).start()
    assert not marker.exists()


def test_set_pdeathsig_checks_the_kernel() -> None:
    with pytest.raises(OSError) as info:
        namespace.set_pdeathsig(4096)
    assert info.value.errno == errno.EINVAL


_SUBREAPER_AFTER = """
import sys
from corral.exec.cli import sandbox_env
from corral.sandbox.reaper import is_subreaper
from corral.sandbox.spec import SandboxSpec
spec = SandboxSpec(argv=("true",), workspace=sys.argv[2],
                   env=tuple(sorted(sandbox_env("/home/corral", {}).items())))
if sys.argv[1] == "start":
    from corral.sandbox.namespace import NamespaceSandbox
    r = NamespaceSandbox(spec).start()
    r.wait(30)
    r.close()
else:
    from corral.sandbox.backend_config import NamespaceConfig
    from corral.exec.compose import execute
    execute(
        spec,
        backend=NamespaceConfig(),
        journal=None,
        dry_run=False,
        interrupted_exc=KeyboardInterrupt,
        pending_signal=lambda: 0,
    )
print("subreaper" if is_subreaper() else "not-subreaper")
"""


@pytest.mark.parametrize(("how", "want"), [("start", "not-subreaper"), ("exec", "subreaper")])
def test_subreaper_is_set_by_the_entry_point(how: str, want: str, workspace: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SUBREAPER_AFTER, how, str(workspace)],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.stdout.strip().splitlines()[-1:] == [want], proc.stderr
