"""What this host can provide, layer by layer (the data behind `corral doctor`).

Every probe returns a `LayerStatus`; none raises. Probes that start processes
are cached for the life of the process.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from corral.sandbox.layers import sysctl as _read

__all__ = [
    "READ_ONLY_MOUNT_GAP",
    "REQUIRED_LAYERS",
    "LayerStatus",
    "all_layers",
    "kernel_audit_enabled",
    "landlock_abi",
    "probe_agents",
    "probe_audit",
    "probe_bwrap",
    "probe_cgroup",
    "probe_init_python",
    "probe_kvm",
    "probe_landlock",
    "probe_pidns",
    "probe_qemu",
    "probe_seccomp",
    "probe_unix",
    "probe_userns",
]

# A uid no account uses; probes that must run unprivileged drop to it.
PROBE_UID = 65534


@dataclass(frozen=True, slots=True)
class LayerStatus:
    """Whether one protection layer is available, and why (not)."""

    name: str
    available: bool
    reason: str
    hint: str = ""
    detail: dict[str, str] = field(default_factory=dict)


@functools.cache
def probe_bwrap() -> LayerStatus:
    path = shutil.which("bwrap")
    if path is None:
        return LayerStatus("bwrap", False, "bwrap not found on PATH", "apt-get install bubblewrap")
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError as exc:
        return LayerStatus("bwrap", False, f"cannot run {path}: {exc}", "reinstall bubblewrap")
    version = out.stdout.strip().removeprefix("bubblewrap ").strip()
    st = os.stat(path)
    if st.st_mode & 0o4000:
        return LayerStatus(
            "bwrap",
            False,
            f"{path} is setuid root; corral needs the unprivileged build",
            "chmod u-s " + path,
            {"path": path, "version": version},
        )
    return LayerStatus(
        "bwrap", True, f"bubblewrap {version} at {path}", detail={"path": path, "version": version}
    )


def _unprivileged(cmd: list[str]) -> tuple[bool, str]:
    """Run `cmd` as PROBE_UID (when root) and report success and stderr."""
    try:
        if os.geteuid() == 0:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                user=PROBE_UID,
                group=PROBE_UID,
                extra_groups=[],
            )
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    return proc.returncode == 0, proc.stderr.strip()


@functools.cache
def probe_userns() -> LayerStatus:
    from corral.sandbox.layers import userns_blocked

    blocked = userns_blocked()
    if blocked is not None:
        return LayerStatus("userns", False, *blocked)
    max_ns = _read("/proc/sys/user/max_user_namespaces")
    unshare = shutil.which("unshare")
    if unshare is None:
        return LayerStatus(
            "userns", True, "sysctls allow unprivileged user namespaces (not tried: no unshare(1))"
        )
    ok, err = _unprivileged([unshare, "--user", "--map-root-user", "true"])
    if not ok:
        return LayerStatus(
            "userns", False, f"unprivileged unshare --user failed: {err}", "check sysctls and LSMs"
        )
    return LayerStatus("userns", True, f"unprivileged user namespaces work (max {max_ns})")


@functools.cache
def probe_pidns() -> LayerStatus:
    bw = probe_bwrap()
    if not bw.available:
        return LayerStatus("pidns", False, "not tried: " + bw.reason, bw.hint)
    ok, err = _unprivileged(
        [
            bw.detail["path"],
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
        ]
    )
    if not ok:
        return LayerStatus(
            "pidns",
            False,
            f"bwrap --unshare-all failed as uid {PROBE_UID}: {err}",
            "enable unprivileged user namespaces",
        )
    return LayerStatus("pidns", True, "PID, mount, net, IPC and UTS namespaces work under bwrap")


@functools.cache
def probe_cgroup() -> LayerStatus:
    from corral.sandbox.cgroup import detect_layout

    layout = detect_layout()
    if layout is None:
        return LayerStatus(
            "cgroup", False, "no cgroup filesystem mounted", "mount cgroup2 on /sys/fs/cgroup"
        )
    kind = layout.kind
    mounts = dict(layout.v1)
    if layout.unified:
        mounts["unified"] = layout.unified
    detail = {"hierarchy": kind, **{f"mount.{k}": v for k, v in mounts.items()}}
    if kind == "v2":
        root = mounts["unified"]
        ctrls = (_read(os.path.join(root, "cgroup.controllers")) or "").split()
        missing = [c for c in ("memory", "pids", "cpu") if c not in ctrls]
        if missing:
            return LayerStatus(
                "cgroup",
                False,
                f"cgroup v2 lacks controllers: {', '.join(missing)}",
                "enable them in the parent's cgroup.subtree_control",
                detail,
            )
        detail["controllers"] = " ".join(ctrls)
    else:
        missing = [c for c in ("memory", "pids", "cpu", "freezer") if c not in mounts]
        if missing:
            return LayerStatus(
                "cgroup",
                False,
                f"cgroup v1 lacks controllers: {', '.join(missing)}",
                "mount the missing v1 controllers",
                detail,
            )
        memsw = os.path.exists(os.path.join(mounts["memory"], "memory.memsw.limit_in_bytes"))
        detail["memsw"] = "yes" if memsw else "no"
        detail["controllers"] = " ".join(sorted(c for c in mounts if c != "unified"))
    from corral.sandbox.layers import cgroup_unwritable

    unwritable = cgroup_unwritable(layout)
    if unwritable is not None:
        return LayerStatus(
            "cgroup",
            False,
            unwritable,
            "run as root or delegate a cgroup subtree",
            detail,
        )
    return LayerStatus(
        "cgroup", True, f"cgroup {kind} ({detail['controllers']}) writable", detail=detail
    )


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    from corral.sandbox.landlock import abi_version

    return abi_version()


@functools.cache
def probe_landlock() -> LayerStatus:
    abi = landlock_abi()
    if abi <= 0:
        lsm = _read("/sys/kernel/security/lsm") or "unknown"
        return LayerStatus(
            "landlock",
            False,
            f"Landlock not enabled (LSMs: {lsm})",
            "boot with lsm=...,landlock (kernel >= 5.13)",
        )
    return LayerStatus("landlock", True, f"Landlock ABI {abi}", detail={"abi": str(abi)})


@functools.cache
def probe_seccomp() -> LayerStatus:
    actions = _read("/proc/sys/kernel/seccomp/actions_avail")
    if actions is None:
        return LayerStatus(
            "seccomp", False, "kernel has no seccomp filter support", "CONFIG_SECCOMP_FILTER=y"
        )
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as exc:
        return LayerStatus(
            "seccomp", False, f"libseccomp binding unusable: {exc}", "apt-get install libseccomp2"
        )
    return LayerStatus("seccomp", True, f"seccomp filters ({actions})")


@functools.cache
def probe_unix() -> LayerStatus:
    """The connect() supervisor that keeps host unix sockets out of reach (M3)."""
    from corral.sandbox.unix_supervisor import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return LayerStatus("unix", False, reason, "Linux >= 5.9 with seccomp user notification")
    return LayerStatus("unix", True, "seccomp user notification, pidfd_getfd, openat2")


@functools.cache
def probe_kvm() -> LayerStatus:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return LayerStatus(
            "kvm", False, f"/dev/kvm: {exc.strerror}", "load kvm modules or use --backend namespace"
        )
    os.close(fd)
    from corral.sandbox.microvm.vm import kvm_status

    reason = kvm_status(_read("/proc/cpuinfo") or "", dev_kvm=True)
    if reason is not None:
        return LayerStatus(
            "kvm", False, reason, "--backend microvm --allow-degraded kvm runs it under TCG"
        )
    return LayerStatus("kvm", True, "/dev/kvm usable (hardware virtualisation)")


def probe_qemu() -> LayerStatus:
    path = shutil.which("qemu-system-x86_64")
    if path is None:
        return LayerStatus(
            "qemu",
            False,
            "qemu-system-x86_64 not found (microvm backend)",
            "apt-get install qemu-system-x86",
        )
    return LayerStatus("qemu", True, f"QEMU at {path}")


def probe_init_python() -> LayerStatus:
    """The in-sandbox init: compiled from init.c when a C compiler exists, else init.py."""
    cc = shutil.which("cc") or shutil.which("gcc")
    py = "/usr/bin/python3"
    if cc is not None:
        return LayerStatus("init", True, f"compiled init (built with {cc} on first use, cached)")
    if os.access(py, os.X_OK):
        return LayerStatus(
            "init",
            True,
            f"no C compiler: the init runs on {py} (about 20 ms slower)",
            "apt-get install gcc for faster start-up",
        )
    return LayerStatus(
        "init",
        False,
        f"neither a C compiler nor {py}: the in-sandbox init cannot run",
        "apt-get install gcc",
    )


def probe_agents() -> list[LayerStatus]:
    """The agent CLIs in corral's tools folder (not protection layers; `corral run` needs one)."""
    from corral.agents.install import default_tools_dir, executable_path, installed_version
    from corral.agents.registry import get_adapter

    out: list[LayerStatus] = []
    tools = default_tools_dir()
    for name in ("claude-code", "codex"):
        adapter = get_adapter(name)
        version = installed_version(adapter, tools)
        if version is None:
            out.append(
                LayerStatus(
                    f"agent {name}",
                    False,
                    f"not installed in {tools}",
                    f"scripts/install-agents.sh {name}",
                )
            )
        else:
            out.append(
                LayerStatus(
                    f"agent {name}",
                    True,
                    f"{adapter.package.name} {version} at {executable_path(adapter, tools)}",
                )
            )
    return out


_AUDIT_GET = 1000
_NETLINK_AUDIT = 9


def kernel_audit_enabled() -> bool | None:
    """Whether the kernel's audit subsystem is on (it then reports seccomp and
    Landlock denials); None when it cannot be asked (no audit support, no
    CAP_AUDIT_CONTROL)."""
    import socket
    import struct

    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_AUDIT) as s:
            s.settimeout(1.0)
            s.send(struct.pack("=IHHII", 16, _AUDIT_GET, 1, 1, 0))
            data = s.recv(8192)
    except OSError:
        return None
    if len(data) < 24 or struct.unpack_from("=IH", data)[1] != _AUDIT_GET:
        return None
    return bool(struct.unpack_from("=II", data, 16)[1])


#: What kernel audit cannot journal even when on (docs/broker.md, "Kernel denials").
READ_ONLY_MOUNT_GAP = (
    "writes refused by the sandbox's read-only mounts (/usr, /etc, /) fail with EROFS"
    " before Landlock is asked, so they leave no journal row (they are refused all the same)"
)


def probe_audit() -> LayerStatus:
    """Whether Landlock and seccomp denials reach the journal (corral never turns audit on)."""
    enabled = kernel_audit_enabled()
    if enabled is None:
        return LayerStatus(
            "audit",
            False,
            "the kernel audit subsystem cannot be queried (no audit support or no "
            "CAP_AUDIT_CONTROL): Landlock and seccomp denials are not journaled "
            "(they are denied all the same)",
            "a kernel with CONFIG_AUDIT, run corral as root, then `auditctl -e 1`",
        )
    if not enabled:
        return LayerStatus(
            "audit",
            False,
            "kernel audit is disabled: the kernel does not report Landlock and seccomp "
            "denials, so they are not journaled (they are denied all the same)",
            "run `auditctl -e 1` (or boot with audit=1) to have them journaled",
        )
    return LayerStatus(
        "audit",
        True,
        "kernel audit is enabled: Landlock and seccomp denials are journaled; "
        + READ_ONLY_MOUNT_GAP,
    )


def all_layers() -> list[LayerStatus]:
    return [
        probe_bwrap(),
        probe_userns(),
        probe_pidns(),
        probe_cgroup(),
        probe_seccomp(),
        probe_landlock(),
        probe_unix(),
        probe_init_python(),
        probe_kvm(),
        probe_qemu(),
        probe_audit(),
        *probe_agents(),
    ]


#: Layers the default (namespace) profile cannot run without.
REQUIRED_LAYERS = ("bwrap", "userns", "pidns", "cgroup", "seccomp", "landlock", "unix", "init")
