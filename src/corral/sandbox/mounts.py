"""Idmapped staging of user binds (root only; Linux >= 5.12 mount API).

The sandbox runs as an unprivileged host uid, yet the workspace may be
private to the caller (mode 0700, even root's) and what the command creates
there must belong to the caller afterwards. An idmapped mount gives both: the
launcher's child enters a private mount namespace, clones each bind source
with open_tree(), maps the caller's uid/gid to the sandbox uid/gid with
mount_setattr(MOUNT_ATTR_IDMAP), and attaches the clone under a private tmpfs
staging directory that bubblewrap then binds from. The staging mounts exist
only in that private namespace and vanish with the sandbox.

Everything here runs in a forked child before exec (`stage_binds`) or is a
small parent-side helper (`make_userns_fd`); syscalls are raw ctypes calls
whose return value is checked before errno is read.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import stat
import struct
import time

from corral.errors import SandboxStartError
from corral.sandbox.grants import open_grant

__all__ = [
    "AT_FDCWD",
    "STAGE_DIR",
    "attach",
    "clone_tree",
    "make_net_ns",
    "make_private_mount_ns",
    "make_userns_fd",
    "mount_devpts",
    "mount_tmpfs",
    "open_beneath",
    "set_nosuid",
    "set_readonly",
    "set_readonly_path",
    "stage_bind",
    "staged_path",
    "userns_fd",
]

STAGE_DIR = "/run/corral-stage"

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
AT_FDCWD = _AT_FDCWD
_SYS_OPENAT2 = 437
_O_PATH = 0o10000000
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_AT_SYMLINK_NOFOLLOW = 0x100
_OPEN_TREE_CLONE = 1
_O_CLOEXEC = 0o2000000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_MS_REC = 0x4000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_PRIVATE = 0x40000


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"{what}: {os.strerror(err)}")
    return ret


def staged_path(index: int) -> str:
    return f"{STAGE_DIR}/{index}"


def make_userns_fd(
    caller_uid: int,
    caller_gid: int,
    sandbox_uid: int,
    sandbox_gid: int,
    *,
    extra: tuple[tuple[int, int], ...] = (),
) -> int:
    """A user namespace fd whose maps send the caller's ids to the sandbox's.

    For an idmapped mount, an on-disk id is read as an id *inside* this
    namespace and shown as the matching *outside* id, so on-disk caller_uid
    appears as sandbox_uid, and files the sandbox creates land as caller_uid.
    `extra` adds (on-disk id, shown id) pairs to both maps.
    """
    return userns_fd(
        f"{caller_uid} {sandbox_uid} 1\n" + "".join(f"{a} {b} 1\n" for a, b in extra),
        f"{caller_gid} {sandbox_gid} 1\n" + "".join(f"{a} {b} 1\n" for a, b in extra),
    )


def userns_fd(uid_map: str, gid_map: str, *, deny_setgroups: bool = True) -> int:
    """A fresh user namespace (owned by the caller) with these maps, as an fd.

    The maps are `inside outside count` lines. `deny_setgroups=False` leaves
    setgroups(2) to the namespace's root (a process that joins it and drops
    its groups needs that).
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(w)
            if _libc.unshare(_CLONE_NEWUSER) != 0:
                os._exit(1)
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    try:
        mine = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5.0
        while os.readlink(f"/proc/{pid}/ns/user") == mine:
            if time.monotonic() > deadline:
                raise SandboxStartError(0, "helper process did not enter its user namespace")
            time.sleep(0.0002)
        with open(f"/proc/{pid}/uid_map", "w", encoding="ascii") as fh:
            fh.write(uid_map)
        if deny_setgroups:
            with open(f"/proc/{pid}/setgroups", "w", encoding="ascii") as fh:
                fh.write("deny")
        with open(f"/proc/{pid}/gid_map", "w", encoding="ascii") as fh:
            fh.write(gid_map)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxStartError(
            exc.errno, f"cannot create idmap user namespace: {exc.strerror}"
        ) from exc
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def make_private_mount_ns() -> None:
    """Enter a new mount namespace in which nothing propagates back to the host."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    os.makedirs(STAGE_DIR, mode=0o755, exist_ok=True)
    _check(
        _libc.mount(b"corral-stage", STAGE_DIR.encode(), b"tmpfs", 0, b"mode=0755,size=64k"),
        f"mount tmpfs on {STAGE_DIR}",
    )


def make_net_ns() -> None:
    """Enter a new network namespace whose only device, `lo`, is up (the root child, before bwrap).

    Made here, by root in the host's user namespace, rather than by bwrap's
    `--unshare-net`: the namespace is owned by the host's user namespace, so
    nothing in the sandbox holds CAP_NET_ADMIN over it, and its loopback is
    up before bwrap starts, so the host can make sockets in it (the
    no-egress resolver, the broker's listeners) at once instead of waiting
    for bwrap's child to report its pid and configure `lo`. Bringing `lo` up
    makes the kernel add 127.0.0.1/8 and ::1 itself.
    """
    _check(_libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            ifr = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack("16s24x", b"lo"))
            flags = struct.unpack_from("16sH", ifr)[1] | _IFF_UP
            fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags))
    except OSError as exc:
        raise SandboxStartError(exc.errno or 0, f"bring up lo: {exc.strerror or exc}") from exc


def bind_readonly(source: str, target: str) -> None:
    """Attach a read-only, nosuid, nodev recursive clone of host path `source` at `target`
    (an existing file or directory), in the current (private) mount namespace."""
    tree = _check(
        _libc.syscall(
            _SYS_OPEN_TREE,
            _AT_FDCWD,
            source.encode(),
            _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW,
        ),
        f"open_tree({source})",
    )
    try:
        attr_set = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", attr_set, 0, 0, 0))
        _check(
            _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, attr, 32),
            f"read-only clone of {source}",
        )
        _check(
            _libc.syscall(
                _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount({source})",
        )
    finally:
        os.close(tree)


def stage_bind(
    index: int, source: str, writable: bool, userns_fd: int, target: str | None = None
) -> str:
    """Clone `source`, idmap it, and attach it at staged_path(index) (or on the
    existing `target`).

    `source` is opened again under the grant rule (no planted symlinks) and
    the mount is cloned from that descriptor, so a symlink swapped in since
    `corral exec` checked the path cannot redirect the bind.
    """
    from_fd = open_grant(source, "bind source")
    try:
        is_dir = stat.S_ISDIR(os.fstat(from_fd).st_mode)
        tree = _check(
            _libc.syscall(
                _SYS_OPEN_TREE,
                from_fd,
                b"",
                _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE | _AT_EMPTY_PATH,
            ),
            f"open_tree({source})",
        )
    finally:
        os.close(from_fd)
    try:
        # nosuid only governs exec through this clone, inside the sandbox: the
        # host's own mount of the same tree still honours a setuid bit, which
        # is why seccomp refuses the bits and `setid` clears them afterwards.
        attr_set = _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        if not writable:
            attr_set |= _MOUNT_ATTR_RDONLY
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", attr_set, 0, 0, userns_fd))
        _check(
            _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, attr, 32),
            f"idmapped mount of {source} (does its filesystem support idmapped mounts?)",
        )
        if target is None:
            target = staged_path(index)
            if is_dir:
                os.mkdir(target, 0o755)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _check(
            _libc.syscall(
                _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount({source})",
        )
        return target
    finally:
        os.close(tree)


# -- small clones for `sandbox.stage` (child side, before exec) -------------------


def mount_tmpfs(name: bytes, target: str, options: bytes, *, nosuid_nodev: bool = False) -> None:
    """Mount a fresh tmpfs called `name` at `target` with `options`."""
    flags = _MS_NOSUID | _MS_NODEV if nosuid_nodev else 0
    _check(_libc.mount(name, target.encode(), b"tmpfs", flags, options), f"mount tmpfs on {target}")


def mount_devpts(target: str) -> None:
    """A new devpts instance at `target`, as bwrap's --dev mounts it."""
    _check(
        _libc.mount(
            b"devpts",
            target.encode(),
            b"devpts",
            _MS_NOSUID | _MS_NOEXEC,
            b"newinstance,ptmxmode=0666,mode=620",
        ),
        f"mount devpts on {target}",
    )


def clone_tree(dfd: int, path: bytes, *, follow: bool) -> int:
    """A detached recursive clone of the mount at `dfd`/`path` (b"": `dfd` itself)."""
    flags = _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE
    if not path:
        flags |= _AT_EMPTY_PATH
    elif not follow:
        flags |= _AT_SYMLINK_NOFOLLOW
    return _check(_libc.syscall(_SYS_OPEN_TREE, dfd, path, flags), f"open_tree({path!r})")


def _setattr(dfd: int, path: bytes, what: str, *, devices: bool = False) -> None:
    attr_set = (
        _MOUNT_ATTR_NOSUID
        if devices
        else _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
    )
    attr = ctypes.create_string_buffer(struct.pack("QQQQ", attr_set, 0, 0, 0))
    flags = _AT_RECURSIVE | (_AT_EMPTY_PATH if not path else 0)
    _check(
        _libc.syscall(_SYS_MOUNT_SETATTR, dfd, path, flags, attr, 32),
        f"read-only clone of {what}",
    )


def set_readonly(tree: int, what: str) -> None:
    """Make every mount of clone `tree` read-only, nosuid and nodev."""
    _setattr(tree, b"", what)


def set_nosuid(tree: int, what: str) -> None:
    """Make every mount of clone `tree` nosuid (a device node stays usable)."""
    _setattr(tree, b"", what, devices=True)


def set_readonly_path(path: str) -> None:
    """Make the mount at `path` and every mount below it read-only, nosuid and nodev."""
    _setattr(_AT_FDCWD, path.encode(), path)


def attach(tree: int, dfd: int, path: bytes, what: str) -> None:
    """Attach clone `tree` at `dfd`/`path` (b"": on `dfd` itself)."""
    flags = _MOVE_MOUNT_F_EMPTY_PATH | (_MOVE_MOUNT_T_EMPTY_PATH if not path else 0)
    _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", dfd, path, flags), f"move_mount({what})")


def open_beneath(dir_fd: int, rel: bytes) -> int:
    """An O_PATH descriptor of `rel` beneath `dir_fd`, following no symlink."""
    how = ctypes.create_string_buffer(
        struct.pack(
            "QQQ",
            # Not O_NOFOLLOW: with O_PATH it returns a final symlink itself
            # instead of the ELOOP that RESOLVE_NO_SYMLINKS gives.
            _O_PATH | _O_CLOEXEC,
            0,
            _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
        )
    )
    return _check(_libc.syscall(_SYS_OPENAT2, dir_fd, rel, how, 24), f"open {rel!r}")
