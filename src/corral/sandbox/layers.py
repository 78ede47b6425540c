"""The host facts behind the namespace backend's layers, read in one place.

`NamespaceBackend.check()` (before every start) and `probe` (`corral doctor`)
both decide from these: a sysctl that forbids user namespaces, a cgroup
hierarchy corral cannot write. Cheap file reads only (no subprocess), so the
start path can afford them.

A warm launcher worker reads two of them ahead of its request (`prepare`):
the cgroup mounts, kept only while the kernel reports no mount change in
this process's mount namespace, and the kernel's Landlock ABI and seccomp
notification support, which cannot change while this kernel runs. Every
other fact is read per request.
"""

from __future__ import annotations

import os
import select

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.sandbox.cgroup import CgroupLayout

__all__ = [
    "cgroup_layout",
    "cgroup_unwritable",
    "discard",
    "kernel_features",
    "prepare",
    "sysctl",
    "userns_blocked",
]

_MOUNTINFO = "/proc/self/mountinfo"
_MNT_NS = "/proc/self/ns/mnt"


class _Mounts:
    __slots__ = ("fd", "layout", "ns")

    def __init__(self, fd: int, ns: tuple[int, int], layout: CgroupLayout | None) -> None:
        self.fd = fd
        self.ns = ns
        self.layout = layout


_mounts: list[_Mounts] = []
#: (Landlock ABI, why no seccomp user notification) of this kernel, once prepared.
_kernel: list[tuple[int, str | None]] = []


def _mnt_ns() -> tuple[int, int]:
    st = os.stat(_MNT_NS)
    return st.st_dev, st.st_ino


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8")


def prepare() -> None:
    """Read the cgroup mounts and the kernel's features now (a warm worker, before its request).

    Best effort: whatever fails here is simply read again by the request.
    """
    discard()
    from corral.sandbox import landlock, unix_supervisor
    from corral.sandbox.cgroup import detect_layout

    _kernel.append((landlock.abi_version(), unix_supervisor.unavailable_reason()))
    try:
        fd = os.open(_MOUNTINFO, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        # The open fixes the mount-table event the descriptor's poll compares
        # with, so the text read after it can only be older than a change poll reports.
        ns = _mnt_ns()
        layout = detect_layout(_read_all(fd))
    except (OSError, ValueError):
        os.close(fd)
        return
    _mounts.append(_Mounts(fd, ns, layout))


def discard() -> None:
    """Forget what `prepare` read."""
    _kernel.clear()
    _forget_mounts()


def _forget_mounts() -> None:
    while _mounts:
        os.close(_mounts.pop().fd)


def cgroup_layout() -> CgroupLayout | None:
    """`cgroup.detect_layout()`: what `prepare` read, while no mount changed since."""
    if _mounts:
        m = _mounts[0]
        try:
            # A mountinfo descriptor polls POLLPRI|POLLERR once after any mount or
            # unmount in the namespace it was opened in; only in that one, hence
            # the namespace's identity too (after an unshare/setns it is another).
            p = select.poll()
            p.register(m.fd, select.POLLPRI)
            same = _mnt_ns() == m.ns and not any(
                ev & (select.POLLPRI | select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0)
            )
        except OSError:
            same = False
        if same:
            return m.layout
        # The event is reported once: this descriptor can never vouch again.
        _forget_mounts()
    from corral.sandbox.cgroup import detect_layout

    return detect_layout()


def kernel_features() -> tuple[int, str | None]:
    """(`landlock.abi_version()`, `unix_supervisor.unavailable_reason()`)."""
    if _kernel:
        return _kernel[0]
    from corral.sandbox import landlock, unix_supervisor

    return landlock.abi_version(), unix_supervisor.unavailable_reason()


def sysctl(path: str) -> str | None:
    """A /proc or /sys value, stripped; None when it does not exist or is unreadable."""
    # os.open/os.read, not open(): a text file object costs more than the
    # read itself, three times on every sandbox start.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_all(fd).strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def userns_blocked() -> tuple[str, str] | None:
    """(why, fix) when a sysctl or AppArmor forbids unprivileged user namespaces."""
    if sysctl("/proc/sys/user/max_user_namespaces") == "0":
        return "user.max_user_namespaces is 0", "sysctl -w user.max_user_namespaces=10000"
    if sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return (
            "kernel.unprivileged_userns_clone is 0",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        )
    if sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            "AppArmor restricts unprivileged user namespaces",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 "
            "or add an AppArmor profile for bwrap",
        )
    return None


def cgroup_unwritable(layout: CgroupLayout | None) -> str | None:
    """Why corral cannot create a sandbox cgroup under `layout`, or None when it can.

    On v1 every mounted controller hierarchy must be writable (a sandbox gets
    a directory in each); on v2 the unified root.
    """
    if layout is None:
        return "no cgroup filesystem mounted"
    roots = [m for _, m in layout.v1] or ([layout.unified] if layout.unified else [])
    bad = [r for r in roots if not os.access(r, os.W_OK)]
    if bad:
        return f"cgroup hierarchy {bad[0]} is not writable by uid {os.geteuid()}"
    return None
