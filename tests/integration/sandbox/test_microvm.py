"""The microvm backend booted for real (QEMU TCG here; a handful of boots).

Each guarantee test performs the attack inside the VM and asserts on the
host: the file's owner, the canary's bytes absent from the output, the host
listener's accept count, QEMU's pid after its owner was SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sandbox.backend import MicroVMConfig
from corral.sandbox.microvm.vm import MicroVMBackend, kvm_status
from corral.sandbox.spec import Limits, SandboxSpec

pytestmark = [pytest.mark.requires_qemu, pytest.mark.requires_root, pytest.mark.requires_cgroup]

OWNER = 1000
ENV = (("PATH", "/usr/bin:/bin"), ("HOME", "/home/corral"), ("ONLY", "this"))


@pytest.fixture
def world() -> Iterator[tuple[Path, Path]]:
    """A workspace owned by OWNER and a canary file outside it (both reachable by OWNER)."""
    top = Path(tempfile.mkdtemp(prefix="corral-mvm-"))
    try:
        top.chmod(0o755)
        ws = top / "ws"
        ws.mkdir()
        os.chown(ws, OWNER, OWNER)
        canary = top / "canary"
        canary.write_text("CANARY-7f3a\n")
        canary.chmod(0o644)
        yield ws, canary
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _backend() -> MicroVMBackend:
    backend = MicroVMConfig().load()
    assert isinstance(backend, MicroVMBackend)
    return backend


def _spec(ws: Path, script: str, **limits: float) -> SandboxSpec:
    return SandboxSpec(
        argv=("/bin/bash", "-c", script),
        workspace=str(ws),
        env=ENV,
        allow_degraded=frozenset({"kvm"}),
        limits=Limits(
            timeout_s=limits.get("timeout_s", 120),
            pids=int(limits["pids"]) if "pids" in limits else None,
        ),
    )


def _attack(canary: Path, port: int) -> str:
    return (
        "echo MARKER-BOOTED; env | sort | tr '\\n' ' '; echo;"
        " echo data > out.txt;"
        f" cat {canary} 2>&1 | head -c 200; echo;"
        f" (echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo LOOPBACK-REACHED;"
        # The exit report port: the command must not be able to speak for the init.
        " (echo 'exit 0' > /dev/vport0p1) 2>/dev/null && echo REPORT-FORGED;"
        # A process flood: with --pids 16 most of these forks must fail.
        " for i in $(seq 40); do (sleep 7 &) 2>/dev/null; done; n=0;"
        ' for c in /proc/[0-9]*/comm; do read -r w < $c && [ "$w" = sleep ] && n=$((n+1)); done;'
        " echo PIDS $n;"
        " exit 7"
    )


def test_boot_exit_output_workspace_and_isolation(world: tuple[Path, Path]) -> None:
    ws, canary = world
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    script = _attack(canary, port)
    # Control: on the host the same script reads the canary and reaches the listener.
    host = subprocess.run(["/bin/bash", "-c", script], cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert "CANARY-7f3a" in host.stdout and "LOOPBACK-REACHED" in host.stdout
    with contextlib.suppress(BlockingIOError):
        while True:
            listener.accept()[0].close()

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        spec = _spec(ws, script, pids=16)
        sb = _backend().start(spec, stdout_fd=out.fileno(), stderr_fd=err.fileno())
        try:
            res = sb.wait()
        finally:
            sb.close()
        out.seek(0)
        stdout = out.read().decode()
    accepted = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            listener.accept()[0].close()
            accepted += 1
    listener.close()

    assert "MARKER-BOOTED" in stdout, stdout
    assert (res.exit, res.reason) == (7, "exited"), (res, stdout)
    assert res.layers["accel"] == "tcg" and str(res.layers["kvm"]).startswith("degraded:")
    # Exactly the spec's environment (plus what bash itself sets).
    env_line = stdout.splitlines()[1]
    assert "ONLY=this" in env_line and "PYTHONPATH" not in env_line and "USER=" not in env_line
    st = (ws / "out.txt").stat()
    assert (st.st_uid, st.st_gid) == (OWNER, OWNER)
    assert (ws / "out.txt").read_text() == "data\n"
    assert "CANARY-7f3a" not in stdout
    assert "LOOPBACK-REACHED" not in stdout and accepted == 0
    assert "REPORT-FORGED" not in stdout
    sleepers = int(stdout.split("PIDS ")[1].split()[0])
    assert 0 < sleepers < 16, stdout
    # The forks the guest's pids limit refused reach the report, labelled as the guest's claim.
    claimed = res.layers["guest_counts"]
    assert isinstance(claimed, dict) and str(claimed["claimed_by"]).startswith("guest init")
    assert res.pids_limit_hits == claimed["pids_limit_hits"] >= 1, claimed
    assert res.cpu_s > 0 and res.peak_memory_bytes > 0  # the host's counters around QEMU


def test_timeout_kills_the_whole_vm(world: tuple[Path, Path]) -> None:
    ws, _ = world
    backend = _backend()
    # 2 s is shorter than a TCG boot: the limit must count from the command's start.
    sb = backend.start(_spec(ws, "exec sleep 1000", timeout_s=2))
    try:
        assert sb.cgroup is not None
        assert sb.qemu_pid in sb.cgroup.pids()
        cap = sb.layers["memory_cap_bytes"]
        assert isinstance(cap, int) and cap > 512 << 20
        res = sb.wait()
        assert (res.exit, res.reason) == (124, "timeout")
        # The init had reported the command's start before the kill: the limit
        # did not run out during the boot. (A file the command writes is no
        # oracle: a loaded host may not give the TCG guest the 2 s to write it.)
        assert sb.wait_started(0)
        assert sb.poll() is not None
        assert not sb.cgroup.pids()
    finally:
        sb.close()
    assert not any(os.path.exists(d) for d in sb.cgroup.dirs.values())


_OWNER_SCRIPT = """
import sys, time
from corral.sandbox.backend import MicroVMConfig
from corral.sandbox.spec import Limits, SandboxSpec
spec = SandboxSpec(argv=("/bin/sh", "-c", "echo up > started; exec sleep 1000"),
                   workspace=sys.argv[1], env=(),
                   allow_degraded=frozenset({"kvm"}), limits=Limits(timeout_s=600))
sb = MicroVMConfig().load().start(spec)
print(sb.qemu_pid, flush=True)
time.sleep(600)
"""


def test_kill_9_of_the_owner_leaves_no_qemu(world: tuple[Path, Path]) -> None:
    ws, _ = world
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, str(ws)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert owner.stdout is not None
        qemu = int(owner.stdout.readline())
        with open(f"/proc/{qemu}/cmdline", "rb") as fh:
            assert b"qemu-system-x86_64" in fh.read()
        pidfd = os.pidfd_open(qemu)
        # Wait until the guest runs the command, so QEMU is past its start-up
        # (a QEMU that dies early of SIGPIPE on its stderr would prove nothing).
        for _ in range(1200):
            if (ws / "started").exists():
                break
            select.select([pidfd], [], [], 0.1)
        assert (ws / "started").exists(), "the guest never started the command"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    try:
        # PDEATHSIG delivers SIGKILL to QEMU when its parent dies; the pidfd
        # becomes readable once QEMU has exited (no pid reuse confusion).
        ready, _, _ = select.select([pidfd], [], [], 30)
        assert ready, f"QEMU {qemu} survived its owner's SIGKILL"
    finally:
        os.close(pidfd)


def test_guest_memory_exhaustion_is_oom_and_the_host_cap_holds(world: tuple[Path, Path]) -> None:
    ws, _ = world
    # tail -n 1 buffers a newline-free stream whole: 400 MiB under --memory 128M.
    spec = SandboxSpec(
        argv=("/bin/bash", "-c", "head -c 400m /dev/zero | tail -n 1 >/dev/null"),
        workspace=str(ws),
        env=ENV,
        allow_degraded=frozenset({"kvm"}),
        limits=Limits(memory_bytes=128 << 20, timeout_s=300),
    )
    sb = _backend().start(spec)
    try:
        res = sb.wait()
    finally:
        sb.close()
    assert (res.exit, res.reason) == (137, "oom"), res
    # The guest kernel killed the command; QEMU itself stayed within its cap (the
    # host cgroup saw no OOM kill): the count is the guest's, labelled so.
    cap = res.layers["memory_cap_bytes"]
    assert isinstance(cap, int) and 0 < res.peak_memory_bytes <= cap
    claimed = res.layers["guest_counts"]
    assert isinstance(claimed, dict) and str(claimed["claimed_by"]).startswith("guest init")
    assert res.oom_kills == claimed["oom_kills"] >= 1, claimed


def _exec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "exec", "--backend", "microvm", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_exec_refuses_tcg_unless_kvm_is_explicitly_degraded(world: tuple[Path, Path]) -> None:
    ws, _ = world
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
        if kvm_status(fh.read(), dev_kvm=os.path.exists("/dev/kvm")) is None:
            pytest.skip("hardware KVM on this host: there is no degradation to refuse")
    proc = _exec("--workspace", str(ws), "--", "/bin/sh", "-c", "echo ran > ran")
    assert proc.returncode == 125, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "'kvm' unavailable" in first and "--allow-degraded kvm" in first
    assert not (ws / "ran").exists()
    dry = _exec("--allow-degraded", "kvm", "--workspace", str(ws), "--dry-run", "--", "true")
    assert dry.returncode == 0, dry.stderr
    assert "qemu-system-x86_64 -M microvm,isa-serial=off -accel tcg" in dry.stdout


def test_a_small_memory_limit_is_what_the_command_gets(world: tuple[Path, Path]) -> None:
    """`--memory 64M`: the guest kernel's own share comes on top, so the VM boots.

    A 64 MiB guest spun until the 180 s boot limit, an 88 MiB one panicked:
    `--memory` was the guest's whole memory, kernel included.
    """
    from corral.sandbox.microvm.vm import GUEST_KERNEL_MIB, VMM_OVERHEAD_MIB

    ws, _ = world
    spec = SandboxSpec(
        argv=("/bin/sh", "-c", "grep MemAvailable /proc/meminfo > mem"),
        workspace=str(ws),
        env=ENV,
        allow_degraded=frozenset({"kvm"}),
        limits=Limits(memory_bytes=64 << 20, timeout_s=120),
    )
    sb = _backend().start(spec)
    try:
        res = sb.wait()
    finally:
        sb.close()
    assert res.exit == 0, res
    available_kib = int((ws / "mem").read_text().split()[1])
    # About what was asked for: at least 7/8 of it, not the guest's whole memory.
    assert 56 << 10 <= available_kib < (64 + GUEST_KERNEL_MIB) << 10, available_kib
    accel = str(res.layers["accel"])
    assert res.layers["memory_cap_bytes"] == (64 + GUEST_KERNEL_MIB + VMM_OVERHEAD_MIB[accel]) << 20


def test_allow_unix_is_refused_not_silently_unserved(world: tuple[Path, Path]) -> None:
    """A host unix socket is not reachable through 9p: the grant cannot be honoured."""
    ws, _ = world
    grants = ws.parent / "grants"
    grants.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(grants / "svc.sock"))
        sock.listen()
        proc = _exec(
            *("--allow-degraded", "kvm", "--workspace", str(ws), "--rw", str(grants)),
            *("--allow-unix", str(grants / "svc.sock"), "--", "/bin/sh", "-c", "echo ran > ran"),
        )
    finally:
        sock.close()
    assert proc.returncode == 125, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "'unix' unavailable" in first and "--allow-unix" in first, first
    assert not (ws / "ran").exists()


def test_no_setid_file_appears_in_the_workspace_on_the_host(world: tuple[Path, Path]) -> None:
    ws, _ = world
    script = (
        "cp /bin/true su-copy; chmod 4755 su-copy; chmod g+s su-copy;"
        " install -m 6755 /bin/true su-install; (umask 0; touch plain)"
        # Still running: QEMU would have set the bits already (live on the host).
        " ; echo > checked; sleep 1"
    )
    sb = _backend().start(_spec(ws, script))
    try:
        res = sb.wait()
    finally:
        sb.close()
    assert res.exit != 125, res
    found = [p.name for p in ws.iterdir() if p.stat().st_mode & 0o6000]
    assert (ws / "checked").exists() and (ws / "su-copy").exists()
    assert found == [], found


# As the command (uid OWNER): the NICs it sees, an attempt on the channel's
# guest device, a request through the broker, and two processes left behind.
_EGRESS = r"""
import os, socket, subprocess
print('NICS', sorted(os.listdir('/sys/class/net')))
try:
    os.open('/dev/vport0p4', os.O_RDWR)
    print('NET-PORT-OPENED')
except OSError:
    pass
host, port = os.environ['HTTP_PROXY'].rsplit('/', 1)[1].split(':')
s = socket.create_connection((host, int(port)), 30)
s.sendall(b'GET http://denied.invalid/ HTTP/1.1\r\nHost: denied.invalid\r\n\r\n')
print('REPLY', s.recv(12))
for _ in range(2):
    subprocess.Popen(['/bin/sleep', '1000'], start_new_session=True)
"""


def test_broker_over_the_loopback_relay_only_lo_journaled_and_leftovers_counted(
    world: tuple[Path, Path], tmp_path: Path
) -> None:
    """The guest reaches the host's broker at its own 127.0.0.1:3128 (the request is
    journaled as denied), has no NIC but `lo`, cannot open the channel's device, and
    the two processes it leaves are counted by the init."""
    from tests.integration.sandbox.conftest import parse_summary

    ws, _ = world
    (ws / "egress.py").write_text(_EGRESS)
    journal = tmp_path / "journal.sqlite"
    proc = _exec(
        "--allow-degraded", "kvm", "--workspace", str(ws), "--allow", "example.invalid",
        "--journal", str(journal), "--json", "--timeout", "120",
        "--", "/usr/bin/python3", "egress.py",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "NICS ['lo']" in proc.stdout, proc.stdout
    assert "NET-PORT-OPENED" not in proc.stdout
    assert "REPLY b'HTTP/1.1 403'" in proc.stdout, proc.stdout
    summary = parse_summary(proc.stderr)
    # The host's journal holds the denial: the broker, not the guest, decided.
    assert summary["observations"] == {"allowed": 0, "denied": 1}, summary
    layers = summary["layers"]
    assert isinstance(layers, dict) and layers["broker"] is True
    assert str(layers["network"]).startswith("loopback relay")
    assert summary["processes_killed_at_end"] == 2, summary
