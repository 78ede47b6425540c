"""The microVM backend: one QEMU `-M microvm` guest per sandbox.

What the host trusts, and why (the guest kernel and its init are inside the
VM, within the command's reach once it has a guest kernel exploit; the VMM,
QEMU, is the host side, confined by its cgroup, its uid and its seccomp
filter):

- exit status: the guest init's one-line report on virtio-serial port 1,
  which only guest root can open (the command runs as the workspace owner's
  uid with no capabilities). A command that became guest root can forge it,
  but the number is one the command could have chosen with `exit(N)`
  anyway; the report is bounded and strictly parsed, and anything but
  exactly one well-formed line is "no report", 125. A VM that ends without
  a report is a failure, never a success.
- timeout, kill, teardown: the host's own clock and QEMU's process; QEMU is
  corral's child with PDEATHSIG and lives in the sandbox's cgroup, so
  killing the cgroup (or corral) ends the whole VM.
- cpu, memory, OOM kills: the host's cgroup counters around QEMU; a VM
  that exceeds guest memory + VMM overhead is OOM-killed by the host (137).
- stdout/stderr: ports 2 and 3, passed through as the command's output
  (hostile bytes, as with every backend).
- the sandbox's loopback (`SandboxNet`, the broker's listener): port 4, a
  framed channel to a relay in the guest (`microvm/net.py`), parsed as
  hostile input; the guest still has no network device but `lo`.
- leftovers: the count in the init's report (bounded digits; guest root
  could forge it, and it decides nothing but the number shown).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from corral.errors import CgroupError, LayerUnavailableError, SandboxStartError
from corral.sandbox import interrupts
from corral.sandbox.backend import MicroVMConfig, SandboxNet
from corral.sandbox.cgroup import Cgroup, detect_layout, sweep_stale
from corral.sandbox.handle import CgroupProcessHandle
from corral.sandbox.microvm import assets as _assets
from corral.sandbox.microvm.cpio import Entry, archive
from corral.sandbox.microvm.net import VMNet
from corral.sandbox.microvm.plan import (
    MAX_TRUST_BUNDLE,
    RELAY,
    START,
    GuestReport,
    VMPlan,
    build_argv,
    init_script,
    parse_report,
    shares_for,
    trust_entries,
)
from corral.sandbox.noreserve import drop_reserve_access
from corral.sandbox.spec import Limits, SandboxSpec

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.sandbox.namespace import ExecResult
    from corral.sandbox.protect import Placeholders
    from corral.sandbox.spec import ExitReason
    from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = [
    "DEFAULT_GUEST_MIB",
    "GUEST_KERNEL_MIB",
    "VMM_OVERHEAD_MIB",
    "MicroVMBackend",
    "MicroVMSandbox",
    "decide_vm_exit",
    "guest_counts",
    "kvm_status",
]

DEFAULT_GUEST_MIB = 512
#: What the guest kernel, its page tables and the initramfs take of the guest's
#: memory before the command runs; `--memory` is what the command gets, so the
#: guest is given this much more. Measured on Debian's 6.1 kernel here: a
#: 256 MiB guest had 163 MiB available, an 88 MiB guest did not reach its
#: init, a 64 MiB one spun until the boot limit.
GUEST_KERNEL_MIB = 96
#: How long a VM may take to reach its command (TCG on a loaded host: tens of seconds).
BOOT_LIMIT_S = 180.0
#: QEMU's own memory on top of the guest's, in the VM's cgroup cap. Measured
#: by bench/microvm.py under TCG with a 64 MiB translation cache: 172-177 MiB
#: (2026-12, this host); the KVM figure is the target (no hardware KVM here to
#: measure it). Each leaves headroom over the measurement.
VMM_OVERHEAD_MIB = {"kvm": 64, "tcg": 256}
#: QEMU's threads (vCPU, RCU, the 9p worker pool): its pids cap on the host.
VMM_PIDS = 128

TCG_NOTE = "TCG available (slow, defence in depth only)"

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def kvm_status(cpuinfo: str, dev_kvm: bool) -> str | None:
    """None when hardware KVM can run the guest, else why not (pure).

    A /dev/kvm without vmx/svm in the CPU flags is a paravirtual KVM (e.g.
    KVM-PVM): it opens and creates VMs, but stock guest kernels never reach
    user space under it.
    """
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    hw = bool(flags & {"vmx", "svm"})
    if hw and dev_kvm:
        return None
    if dev_kvm:
        return f"paravirtual, not usable for microvm; {TCG_NOTE}"
    if hw:
        return f"/dev/kvm missing (load kvm_intel/kvm_amd); {TCG_NOTE}"
    return f"no hardware virtualisation; {TCG_NOTE}"


def tsc_khz(cpuinfo: str) -> int | None:
    """The host's TSC frequency in kHz from /proc/cpuinfo's 'cpu MHz' (pure)."""
    for line in cpuinfo.splitlines():
        if line.startswith("cpu MHz"):
            with contextlib.suppress(ValueError):
                return int(float(line.partition(":")[2]) * 1000)
    return None


def decide_vm_exit(
    *,
    qemu_rc: int | None,
    report: tuple[str, int, str] | None,
    oom_kills: int,
    timed_out: bool,
    interrupted: int,
) -> tuple[int, ExitReason, str]:
    """(exit status, reason, message) of a finished VM (pure)."""
    if timed_out:
        return 124, "timeout", ""
    if interrupted:
        return 128 + interrupted, "killed", ""
    if qemu_rc is not None and qemu_rc < 0:
        if oom_kills > 0:
            return 137, "oom", "the VM exceeded its memory cap (guest + VMM overhead)"
        return 128 - qemu_rc, "killed", ""
    if qemu_rc == 0 and report is not None:
        kind, code, message = report
        if kind == "error":
            return code, "refused", message
        if kind == "oom":
            return 137, "oom", "the guest kernel killed the command (guest memory exhausted)"
        return code, ("killed" if code > 128 else "exited"), ""
    return 125, "refused", f"the VM ended without an exit report (QEMU status {qemu_rc})"


def guest_counts(report: GuestReport | None) -> dict[str, object]:
    """The OOM kills and pids-limit hits the guest init claims, with their
    provenance, for the report's layers (pure; empty when it claims none).

    The guest kernel, not the host's cgroup, saw these: a guest root could
    forge them (bounded digits), so they are added to the host's counters and
    labelled, never used to decide the exit.
    """
    if report is None or report.kind == "error":
        return {}
    counts = {"oom_kills": report.oom_kills, "pids_limit_hits": report.pids_limit_hits}
    if not any(counts.values()):
        return {}
    return {**counts, "claimed_by": "guest init (guest kernel counters, unverified)"}


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _trust_entries(path: str) -> tuple[Entry, ...]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TRUST_BUNDLE + 1)
        return trust_entries(data)
    except (OSError, ValueError) as exc:
        raise SandboxStartError(0, f"cannot give the guest the trust bundle: {exc}") from exc


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        cand = os.path.join(d or ".", name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


class _Pump(threading.Thread):
    """Copies one pipe to a descriptor (or into a bounded buffer) until EOF."""

    def __init__(self, src: int, dst: int | None, limit: int = 1 << 16) -> None:
        super().__init__(daemon=True)
        self.src = src
        self.dst = dst
        self.limit = limit
        self.data = bytearray()
        #: when the buffer first held the init's "start" line (monotonic)
        self.started_at: float | None = None

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.src, 65536)
            except OSError:
                return
            if not chunk:
                return
            if self.dst is None:
                if len(self.data) <= self.limit:
                    self.data += chunk[: self.limit + 1 - len(self.data)]
                if self.started_at is None and self.data.startswith(START):
                    self.started_at = time.monotonic()
                continue
            with contextlib.suppress(OSError):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self.dst, view) :]


@dataclass(frozen=True, slots=True)
class _Identity:
    """Who QEMU runs as on the host (and the command inside the guest)."""

    uid: int
    gid: int


class MicroVMBackend:
    """QEMU microvm guests (see the module docstring for what is trusted)."""

    kind = "microvm"

    def __init__(self, config: MicroVMConfig) -> None:
        self.config = config

    # -- checks -----------------------------------------------------------
    def _qemu(self) -> str | None:
        return self.config.qemu or _which("qemu-system-x86_64")

    def _accel(self, kvm_reason: str | None) -> str:
        if self.config.accel == "auto":
            return "kvm" if kvm_reason is None else "tcg"
        return self.config.accel

    def check(self, spec: SandboxSpec) -> Mapping[str, str | None]:
        from corral.sandbox.namespace import cache_dir

        layers: dict[str, str | None] = {}
        layers["qemu"] = None if self._qemu() else "qemu-system-x86_64 not found (qemu-system-x86)"
        try:
            _assets.find_assets(cache_dir())
            layers["kernel"] = None
        except (_assets.AssetError, OSError) as exc:
            layers["kernel"] = str(exc)
        layers["kvm"] = kvm_status(_read("/proc/cpuinfo"), os.path.exists("/dev/kvm"))
        if self.config.accel == "tcg" and layers["kvm"] is None:
            layers["kvm"] = f"not used (accel = tcg); {TCG_NOTE}"
        from corral.sandbox.layers import cgroup_unwritable

        # Read-only hierarchies are as missing: the VM's cgroup cannot be made there.
        layers["cgroup"] = cgroup_unwritable(detect_layout())
        layers["network"] = None
        layers["unix"] = (
            "a host unix socket is not reachable from the guest (9p shares files, not sockets);"
            " --allow-unix cannot be honoured"
            if spec.allow_unix
            else None
        )
        return layers

    # -- plan -------------------------------------------------------------
    def _identity(self, spec: SandboxSpec) -> _Identity:
        if os.geteuid() != 0:
            return _Identity(os.geteuid(), os.getegid())
        try:
            st = os.stat(spec.workspace)
        except OSError as exc:
            raise SandboxStartError(
                exc.errno, f"workspace {spec.workspace}: {exc.strerror}"
            ) from exc
        # QEMU creates workspace files as itself: run it as the workspace's
        # owner so they are the caller's, and never as root when it can be avoided.
        return _Identity(st.st_uid, st.st_gid)

    def _plan(
        self,
        spec: SandboxSpec,
        *,
        accel: str,
        kernel: str,
        initrd: str,
        ports: tuple[str, str, str],
        net_fd: int | None = None,
    ) -> VMPlan:
        mem = spec.limits.memory_bytes
        guest_mib = DEFAULT_GUEST_MIB if mem is None else -(-mem >> 20) + GUEST_KERNEL_MIB
        cpus = 1 if spec.limits.cpus is None else max(1, math.ceil(spec.limits.cpus))
        return VMPlan(
            qemu=self._qemu() or "qemu-system-x86_64",
            kernel=kernel,
            initrd=initrd,
            accel=accel,
            memory_mib=guest_mib,
            cpus=cpus,
            shares=shares_for(spec),
            status_path=ports[0],
            stdout_path=ports[1],
            stderr_path=ports[2],
            tsc_khz=tsc_khz(_read("/proc/cpuinfo")) if accel == "tcg" else None,
            net_fd=net_fd,
        )

    def preview(self, spec: SandboxSpec) -> list[str]:
        from corral.sandbox.namespace import cache_dir

        try:
            kernel = _assets.find_assets(cache_dir()).vmlinux
        except (_assets.AssetError, OSError):
            kernel = "<vmlinux>"
        accel = self._accel(kvm_status(_read("/proc/cpuinfo"), os.path.exists("/dev/kvm")))
        fds = ("/proc/self/fd/4", "/proc/self/fd/5", "/proc/self/fd/6")
        net_fd = 7 if spec.network.needs_broker else None
        return build_argv(
            self._plan(
                spec, accel=accel, kernel=kernel, initrd="/proc/self/fd/3", ports=fds, net_fd=net_fd
            )
        )

    # -- start ------------------------------------------------------------
    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[SandboxNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
    ) -> MicroVMSandbox:
        """Boot a VM for `spec`. `stdout_fd`/`stderr_fd` (or `stdio`'s last two):
        where the command's output goes (the caller keeps them open until
        `close()`); the guest's stdin is always empty. `unix_observer` is never
        called: a host unix socket is not reachable through 9p (the guest's
        connect() would meet a guest inode with no listener), so a spec with
        `allow_unix` is refused (layer `unix`) rather than silently unserved.

        The guest has no network device but `lo`. With `network`, port 4
        carries its loopback (`VMNet`): `network` is called once QEMU runs,
        and the command starts only after it returned (the guest's relay
        binds every `listen()` before the host's GO).
        """
        from corral.sandbox.namespace import cache_dir

        if stdio is not None:
            stdout_fd = stdio[1] if stdio[1] is not None else stdout_fd
            stderr_fd = stdio[2] if stdio[2] is not None else stderr_fd
        checks = self.check(spec)
        active: dict[str, object] = {"backend": "microvm"}
        for name in ("qemu", "kernel", "network", "unix"):
            reason = checks[name]
            if reason is not None:
                raise LayerUnavailableError(name, reason)
        kvm_reason = checks["kvm"]
        if self.config.accel == "kvm" and kvm_reason is not None:
            raise LayerUnavailableError("kvm", kvm_reason)
        accel = self._accel(kvm_reason)
        for name in ("kvm", "cgroup"):
            reason = checks[name]
            if reason is None:
                active[name] = True
            elif name not in spec.allow_degraded:
                raise LayerUnavailableError(name, reason, degradable=True)
            else:
                active[name] = f"degraded: {reason}"
        active["accel"] = accel
        active["qemu-seccomp"] = True
        # QEMU's 9p server applies the guest's chmod/open modes to host files:
        # a filter of corral's own refuses setuid/setgid bits there (M13).
        vmm_bpf: bytes | None = None
        try:
            from corral.sandbox import seccomp

            vmm_bpf = seccomp.cached_bpf(seccomp.VMM_SETID_PROFILE, cache_dir())
            active["seccomp"] = True
        except (LayerUnavailableError, SandboxStartError) as exc:
            if "seccomp" not in spec.allow_degraded:
                raise
            active["seccomp"] = f"degraded: {exc}"
        active["network"] = "loopback relay (virtio-serial)" if network is not None else "none"
        assets = _assets.find_assets(cache_dir())
        ident = self._identity(spec)
        placeholders: Placeholders | None = None
        guest_binds: tuple[tuple[str, bool], ...] = ()
        if spec.protect:
            from corral.sandbox.bwrap import StagedBind
            from corral.sandbox.protect import start_protection

            trees = [(spec.workspace, True), *((b.path, b.writable) for b in spec.binds)]
            pairs, placeholders = start_protection(
                spec, [StagedBind(p, p, w) for p, w in trees], cache_dir()
            )
            guest_binds = tuple((b.dest, b.writable) for b in pairs)
            # The guest kernel enforces these binds for the unprivileged
            # command; the 9p share under them stays writable by QEMU.
            active["protect"] = {**placeholders.summary, "enforced_by": "guest kernel"}
        try:
            return self._boot(
                spec,
                active=active,
                accel=accel,
                assets=assets,
                ident=ident,
                guest_binds=guest_binds,
                placeholders=placeholders,
                parent_cgroup=parent_cgroup,
                output=(stdout_fd, stderr_fd),
                vmm_bpf=vmm_bpf,
                network=network,
            )
        except BaseException:
            if placeholders is not None:
                placeholders.release()
            raise

    def _boot(
        self,
        spec: SandboxSpec,
        *,
        active: dict[str, object],
        accel: str,
        assets: _assets.Assets,
        ident: _Identity,
        guest_binds: tuple[tuple[str, bool], ...],
        placeholders: Placeholders | None,
        parent_cgroup: str | None,
        output: tuple[int, int],
        vmm_bpf: bytes | None,
        network: Callable[[SandboxNet], None] | None,
    ) -> MicroVMSandbox:
        with_net = network is not None
        try:
            script = init_script(
                spec,
                shares_for(spec),
                uid=ident.uid,
                gid=ident.gid,
                guest_binds=guest_binds,
                net=with_net,
            )
        except ValueError as exc:
            raise SandboxStartError(0, str(exc)) from exc
        with open(assets.base_initramfs, "rb") as fh:
            base = fh.read()
        run_entries = [Entry.file("init", script.encode(), 0o755)]
        if with_net:
            from corral._payload import path as payload_path

            with open(payload_path("vm_relay.py"), "rb") as fh:
                run_entries.append(Entry.file(RELAY.lstrip("/"), fh.read(), 0o644))
        if spec.network.trust_bundle is not None:
            run_entries += _trust_entries(spec.network.trust_bundle)
        run_cpio = archive(run_entries, first_ino=1 << 20)
        opened: list[int] = []
        cgroup: Cgroup | None = None
        chan: socket.socket | None = None
        proc: subprocess.Popen[bytes] | None = None
        try:
            initrd = os.memfd_create("corral-initrd", os.MFD_CLOEXEC)
            opened.append(initrd)
            os.write(initrd, base + run_cpio)
            pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
            for r, w in pipes:
                opened += [r, w]
            child_fds = [initrd] + [w for _, w in pipes]
            qemu_end: int | None = None
            if with_net:
                chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                qemu_end = theirs.detach()
                opened.append(qemu_end)
                child_fds.append(qemu_end)
            if os.geteuid() == 0:
                # QEMU reopens each descriptor through /proc/self/fd as its own uid.
                for fd in child_fds:
                    os.fchown(fd, ident.uid, ident.gid)
            ports = (
                f"/proc/self/fd/{pipes[0][1]}",
                f"/proc/self/fd/{pipes[1][1]}",
                f"/proc/self/fd/{pipes[2][1]}",
            )
            plan = self._plan(
                spec,
                accel=accel,
                kernel=assets.vmlinux,
                initrd=f"/proc/self/fd/{initrd}",
                ports=ports,
                net_fd=qemu_end,
            )
            layout = detect_layout() if active["cgroup"] is True else None
            attach: list[int] = []
            if layout is not None:
                parent = parent_cgroup or "corral"
                if parent_cgroup is None:
                    sweep_stale(layout, parent)
                cap = (plan.memory_mib + VMM_OVERHEAD_MIB[accel]) << 20
                cgroup = Cgroup.create(
                    layout,
                    f"{parent}/microvm-{os.getpid()}-{os.urandom(4).hex()}",
                    Limits(memory_bytes=cap, pids=VMM_PIDS, cpus=spec.limits.cpus),
                )
                attach = cgroup.open_attach_fds()
                opened += attach
                active["memory_cap_bytes"] = cap
            parent_pid = os.getpid()
            drop = os.geteuid() == 0 and ident.uid != 0
            # Built before the fork: the child only makes the one prctl call.
            bpf_buf = ctypes.create_string_buffer(vmm_bpf or b"", len(vmm_bpf or b""))
            fprog = _SockFprog(len(vmm_bpf or b"") // 8, ctypes.addressof(bpf_buf))

            def child_setup() -> None:
                for fd in attach:
                    os.write(fd, b"0")
                # QEMU writes the workspace: no reserve of a run's disk.
                drop_reserve_access()
                if drop:
                    os.setgroups([])
                    os.setresgid(ident.gid, ident.gid, ident.gid)
                    os.setresuid(ident.uid, ident.uid, ident.uid)
                _prctl(_PR_SET_NO_NEW_PRIVS, 1)
                if vmm_bpf and (
                    _libc.prctl(
                        _PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog)
                    )
                    != 0
                ):
                    raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
                # After the uid change: changing credentials clears PDEATHSIG.
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != parent_pid:  # corral died before prctl
                    os._exit(125)

            started = time.monotonic()
            # Popen's fork must not be orphaned by an interrupt (sandbox.interrupts).
            with interrupts.deferred():
                try:
                    proc = subprocess.Popen(
                        build_argv(plan),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        pass_fds=child_fds,
                        preexec_fn=child_setup,  # noqa: PLW1509 - corral is single-threaded here
                        close_fds=True,
                    )
                except OSError as exc:
                    msg = f"cannot start QEMU: {exc.strerror}"
                    raise SandboxStartError(exc.errno, msg) from exc
        except BaseException:
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if cgroup is not None:
                # QEMU is reaped, but a v1 memory cgroup stays busy a moment longer.
                with contextlib.suppress(CgroupError):
                    cgroup.remove()
            if chan is not None:
                chan.close()
            raise
        sandbox: MicroVMSandbox | None = None
        try:
            # Until the handle exists, an interrupt waits (sandbox.interrupts).
            with interrupts.deferred():
                for fd in [initrd, *(w for _, w in pipes), *attach]:
                    os.close(fd)
                if qemu_end is not None:
                    os.close(qemu_end)
                pumps = (
                    _Pump(pipes[0][0], None, limit=4096),
                    _Pump(pipes[1][0], output[0]),
                    _Pump(pipes[2][0], output[1]),
                )
                assert proc.stderr is not None
                qemu_err = _Pump(proc.stderr.fileno(), None)
                for p in (*pumps, qemu_err):
                    p.start()
                net = VMNet(chan) if chan is not None else None
                sandbox = MicroVMSandbox(
                    proc=proc,
                    cgroup=cgroup,
                    layers=active,
                    started=started,
                    pumps=pumps,
                    qemu_err=qemu_err,
                    timeout_s=spec.limits.timeout_s,
                    placeholders=None,
                    net=net,
                )
        except BaseException:
            if sandbox is not None:
                sandbox.kill_all()
                sandbox.close()
            else:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
                if cgroup is not None:
                    with contextlib.suppress(CgroupError):
                        cgroup.remove()
            raise
        if network is not None and net is not None:
            try:
                network(net)
                net.go()
            except BaseException:
                sandbox.close()
                raise
        sandbox.placeholders = placeholders
        return sandbox


class MicroVMSandbox(CgroupProcessHandle):
    """A running VM. `wait()` or `interrupt()` reports; `close()` last, always."""

    def __init__(
        self,
        *,
        proc: subprocess.Popen[bytes],
        cgroup: Cgroup | None,
        layers: dict[str, object],
        started: float,
        pumps: tuple[_Pump, _Pump, _Pump],
        qemu_err: _Pump,
        timeout_s: float | None,
        placeholders: Placeholders | None = None,
        net: VMNet | None = None,
    ) -> None:
        self.proc = proc
        self._net = net
        self.cgroup = cgroup
        self._layers = layers
        self.started = started
        self._pumps = pumps
        self._qemu_err = qemu_err
        self._timeout_s = timeout_s
        #: The protected paths' placeholders (released after teardown).
        self.placeholders = placeholders
        self._closed = False

    @property
    def layers(self) -> Mapping[str, object]:
        return MappingProxyType(dict(self._layers))

    @property
    def qemu_pid(self) -> int:
        return self.proc.pid

    def qemu_stderr(self) -> bytes:
        """What QEMU itself printed (bounded), for diagnostics."""
        return bytes(self._qemu_err.data)

    def wait_started(self, timeout_s: float = BOOT_LIMIT_S) -> bool:
        """True once the guest init has started the command; False if the VM
        ended first or `timeout_s` passed (a boot under TCG takes seconds)."""
        deadline = time.monotonic() + timeout_s
        while self._pumps[0].started_at is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _freezer(self, state: str) -> None:
        if self.cgroup is None or "freezer" not in self.cgroup.dirs:
            raise CgroupError(0, "freezer unavailable")
        with open(os.path.join(self.cgroup.dirs["freezer"], "freezer.state"), "w") as fh:
            fh.write(state)

    def freeze(self) -> None:
        self._freezer("FROZEN")

    def thaw(self) -> None:
        self._freezer("THAWED")

    def wait(self, timeout_s: float | None = None) -> ExecResult:
        """Wait for the VM (or the timeout: the spec's unless given), then report.

        The timeout counts from the moment the guest init starts the command;
        booting is bounded separately (BOOT_LIMIT_S).
        """
        limit = self._timeout_s if timeout_s is None else timeout_s
        timed_out = False
        while self.proc.poll() is None:
            # The limit runs from the init's "start" (the command's first
            # instant), the boot has its own, host-side bound.
            began = self._pumps[0].started_at
            now = time.monotonic()
            if began is None:
                left = BOOT_LIMIT_S - (now - self.started)
            elif limit is not None:
                left = limit - (now - began)
            else:
                left = 1.0
            if left <= 0:
                timed_out = True
                self.kill_all()
                self.proc.wait()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=min(left, 0.05))
        return self._finish(timed_out=timed_out)

    def interrupt(self, signum: int) -> ExecResult:
        self.kill_all()
        self.proc.wait()
        return self._finish(timed_out=False, interrupted=signum)

    def _finish(self, *, timed_out: bool, interrupted: int = 0) -> ExecResult:
        from corral.sandbox.namespace import ExecResult

        if self.cgroup is not None:
            with contextlib.suppress(CgroupError):
                self.cgroup.kill()
            self.cgroup.wait_empty(10.0)
        for p in (*self._pumps, self._qemu_err):
            p.join(timeout=5.0)
        usage = self.usage()
        oom = usage.oom_kills if usage else 0
        report = parse_report(bytes(self._pumps[0].data))
        code, reason, message = decide_vm_exit(
            qemu_rc=self.proc.returncode,
            report=(report.kind, report.code, report.message) if report else None,
            oom_kills=oom,
            timed_out=timed_out,
            interrupted=interrupted,
        )
        guest = report if report is not None and reason != "timeout" else None
        claimed = guest_counts(guest)
        layers = dict(self._layers)
        if claimed:
            layers["guest_counts"] = claimed
        return ExecResult(
            exit=code,
            reason=reason,
            wall_s=time.monotonic() - self.started,
            cpu_s=usage.cpu_s if usage else 0.0,
            peak_memory_bytes=usage.peak_memory_bytes if usage else 0,
            # Counted by the guest init (bounded); they died with the guest.
            processes_killed_at_end=report.left if report and reason != "timeout" else 0,
            layers=layers,
            oom_kills=oom + (guest.oom_kills if claimed and guest else 0),
            pids_limit_hits=(usage.pids_limit_hits if usage else 0)
            + (guest.pids_limit_hits if claimed and guest else 0),
            message=message,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.proc.poll() is None:
                self.kill_all()
                self.proc.wait()
            if self.cgroup is not None:
                self.cgroup.remove()
        finally:
            if self._net is not None:
                self._net.close()
            for p in self._pumps:
                p.join(timeout=1.0)
                with contextlib.suppress(OSError):
                    os.close(p.src)
            self._qemu_err.join(timeout=1.0)
            if self.placeholders is not None:
                self.placeholders.release()
            if self.proc.stderr is not None:
                with contextlib.suppress(OSError):
                    self.proc.stderr.close()
