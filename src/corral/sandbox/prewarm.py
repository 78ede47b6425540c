"""What a warm launcher worker prepares for its sandbox before the request (host code).

A warm worker (`exec/launcher.py`) waits, forked and set up, for a request
it knows nothing about yet. Part of `NamespaceSandbox.start`'s work does not
depend on the request and is done here instead, ahead of it:

- as root, the sandbox's host uid (`uids.allocate`) and the user namespace
  that idmaps the caller to it (`mounts.make_userns_fd`: a fork of this
  large process and a wait for it, the costliest step before bwrap). Both
  stay valid until used: the lease's flock keeps every other sandbox off the
  id, so no process can appear with it, and the map's caller is this
  process's uid/gid, which the request cannot change (the launcher serves
  only its own uid). What the request *can* change is re-read when it
  arrives: `CORRAL_UID_RANGE` comes from the caller's environment and
  `/etc` may have changed, so `take_userns` hands the lease out only when
  the request's freshly validated range still contains it.

- the next sandbox's cgroup, and its first process forked into it,
  parked until the request (`sandbox.prefork`).

- the cgroup mounts, and the kernel's Landlock ABI and seccomp
  notification support (`layers.prepare`): the mounts are used only while
  the kernel reports no mount change since they were read, the kernel's
  features cannot change while it runs.

Not prepared, because the host or the caller can change them between the
warm fork and the request and they are cheap to read: bwrap's path (the
caller's PATH), the cgroup hierarchy's writability, the user-namespace
sysctls, the seccomp cache (its file is re-validated), the Landlock plan
(it depends on the request's paths).

The warm worker then rehearses the request path (`exec.launcher._rehearse`),
its results dropped, so the request does not pay the copy-on-write faults
of first touching the launcher's pages.

A process that never calls `prepare` (the Python CLI, `corral run`) takes
nothing and computes everything per sandbox, as before.

After a gVisor request, the warm worker also boots the next gVisor sandbox
(`gvisor.preboot`), which a request with the same boot key takes.
"""

from __future__ import annotations

import contextlib
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.sandbox.uids import UidLease, UidRange

__all__ = ["discard", "launcher_pid", "prepare", "take_userns"]


class _Prepared:
    __slots__ = ("caller", "lease", "userns_fd")

    def __init__(self, lease: UidLease, userns_fd: int, caller: tuple[int, int]) -> None:
        self.lease = lease
        self.userns_fd = userns_fd
        self.caller = caller


_slot: list[_Prepared] = []
#: The launcher whose warm worker this process is (set by `prepare`).
_launcher: list[int] = []


def launcher_pid() -> int | None:
    """The pid of the launcher this process is a warm worker of; None in any other process."""
    return _launcher[0] if _launcher else None


def prepare() -> None:
    """Allocate the next sandbox's uid and idmap namespace now (root only; best effort).

    Any failure leaves nothing prepared: the request then does the same work
    itself and reports the error there, where it belongs.
    """
    _launcher[:] = [os.getppid()]
    _prepare_uid()
    from corral.sandbox import prefork

    # After the userns helper's fork: the parked child holds none of this.
    prefork.prepare()
    from corral.sandbox import layers

    # After the parked child's fork: it holds no mountinfo descriptor either.
    with contextlib.suppress(Exception):
        layers.prepare()


def _prepare_uid() -> None:
    if _slot or os.geteuid() != 0:
        return
    from corral.sandbox.gvisor import preboot

    preboot.prepare()
    from corral.sandbox import mounts, uids

    caller = (os.getuid(), os.getgid())
    try:
        lease = uids.allocate(uids.configured_range())
    except Exception:  # e.g. a malformed CORRAL_UID_RANGE: the request will say so
        return
    try:
        fd = mounts.make_userns_fd(caller[0], caller[1], lease.uid, lease.gid)
    except Exception:
        lease.close(clean=True)
        return
    _slot.append(_Prepared(lease, fd, caller))


def take_userns(r: UidRange) -> tuple[UidLease, int] | None:
    """The prepared (lease, userns fd) when it fits this request, else None.

    `r` is the request's own validated range. The caller owns what it gets
    (closes the fd, closes the lease). Whatever does not fit is released.
    """
    if not _slot:
        return None
    prepared = _slot.pop()
    if prepared.lease.uid in r and prepared.caller == (os.getuid(), os.getgid()):
        return prepared.lease, prepared.userns_fd
    _release(prepared)
    return None


def discard() -> None:
    """Give back what was prepared and never used (no sandbox ran with it: clean)."""
    from corral.sandbox import layers, prefork
    from corral.sandbox.gvisor import preboot

    layers.discard()
    preboot.discard()
    prefork.discard()
    while _slot:
        _release(_slot.pop())


def _release(prepared: _Prepared) -> None:
    with contextlib.suppress(OSError):
        os.close(prepared.userns_fd)
    with contextlib.suppress(OSError):
        prepared.lease.close(clean=True)
