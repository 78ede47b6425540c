"""The host-side supervisor of a sandbox's `connect()` calls (docs/design.md M3).

A read-only bind does not stop `connect()` on a socket inode and Landlock up
to ABI 7 does not cover it, so a host process listening on `WS/app.sock` or
in any `--ro`/`--rw` tree would be reachable. The launcher's child installs
`notify_filter()` (seccomp user notification on every native `connect()`)
before it execs bubblewrap and passes the listener descriptor back over a
socketpair; `UnixSupervisor` answers every notification:

- it copies the address out of the caller's memory once and only ever uses
  that copy, and takes the caller's socket with `pidfd_getfd` (the same open
  file description, so O_NONBLOCK and timeouts behave as in the sandbox);
- an inet, inet6 or netlink socket (its network namespace is the sandbox's)
  and an abstract address (abstract names are scoped by the network
  namespace) are connected as asked; other families are refused, because
  their checks would see this process's capabilities instead of the sandbox's;
- a pathname is resolved the way the sandbox sees it (`openat2` below
  `/proc/<pid>/root` with RESOLVE_IN_ROOT and no magic links; a relative path
  is joined to the caller's cwd),
  the inode is pinned with O_PATH, and `unix_admit.admit` decides: the
  sandbox's own listeners (found by (dev, ino) in a UNIX_DIAG dump taken in
  the socket's network namespace) and `--allow-unix` grants are connected
  through `/proc/self/fd/<pinned>`, so a rename between the check and the
  connect changes nothing; anything else gets EACCES.

The syscall is then answered with the connect's result; the filter never
answers SECCOMP_USER_NOTIF_FLAG_CONTINUE, which would re-read the address
from sandbox memory after the check. If the supervisor dies the listener is
closed and the kernel fails every pending and later `connect()` with ENOSYS.

The same filter refuses `socket()`/`socketpair()` for AF_UNIX SOCK_DGRAM (and
SOCK_RAW, which the kernel turns into SOCK_DGRAM): a datagram socket can
`sendto()` any path without connecting, and seccomp cannot read the address.
Stream and seqpacket sockets refuse a `sendto()` address (EOPNOTSUPP/EISCONN,
or ignore it when connected). Foreign ABIs (i386, x32) are killed, so their
`connect` numbers cannot bypass the notification.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import os
import select
import socket
import stat
import struct
import threading
from collections.abc import Callable

from corral.errors import SandboxStartError

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
# unix_admit (frozen dataclasses, ~2 ms each to create) is imported on first
# use, off the start path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.sandbox.unix_admit import Admission, UnixConnectEvent, UnixGrant, UnixTarget

__all__ = [
    "ChildInstaller",
    "UnixSupervisor",
    "grants_for",
    "notify_filter",
    "recv_listener",
    "unavailable_reason",
]

_libc = ctypes.CDLL(None, use_errno=True)

# (audit arch, seccomp, connect, socket, socketpair) per machine.
_ARCH = {
    "x86_64": (0xC000_003E, 317, 42, 41, 53),
    "aarch64": (0xC000_00B7, 277, 203, 198, 199),
}
_NR_IO_URING_SETUP = 425
_NR_OPENAT2 = 437
_NR_PIDFD_GETFD = 438
_X32_BIT = 0x4000_0000

_RET_KILL_PROCESS = 0x8000_0000
_RET_ERRNO = 0x0005_0000
_RET_USER_NOTIF = 0x7FC0_0000
_RET_ALLOW = 0x7FFF_0000

_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_GET_ACTION_AVAIL = 2
_SECCOMP_GET_NOTIF_SIZES = 3
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_NOTIF_SIZE = 80
_RESP_SIZE = 24
_IOCTL_RECV = 0xC050_2100
_IOCTL_SEND = 0xC018_2101
_IOCTL_ID_VALID = 0x4008_2102
_PR_SET_NO_NEW_PRIVS = 38
_SIOCGSKNS = 0x894C
_CLONE_NEWNET = 0x4000_0000
_NS_GET_USERNS = 0xB701
_PIDFD_THREAD = os.O_EXCL
_SOL_SOCKET = 1
_SO_DOMAIN = 39
_AF_UNSPEC = 0
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_UDIAG_SHOW_VFS = 0x2
_UNIX_DIAG_VFS = 1
_RESOLVE_BENEATH = 0x08
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_SUN_PATH_OFFSET = 2
_SOCKADDR_UN_SIZE = 110
_SOCKADDR_STORAGE = 128
_MAX_PENDING = 64
_DEDUP_MAX = 1024

# BPF instruction encodings used by notify_filter().
_LD_W_ABS = 0x20
_ALU_AND_K = 0x54
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def notify_filter(machine: str | None = None) -> bytes:
    """The classic-BPF program: notify on `connect`, refuse AF_UNIX datagram sockets.

    Foreign ABIs, x32 numbers and io_uring (whose IORING_OP_CONNECT would
    skip the notification) are refused here too, so the program holds even
    when the main seccomp layer is degraded.
    """
    arch, _, nr_connect, nr_socket, nr_socketpair = _ARCH[machine or os.uname().machine]
    # (label, opcode, jump-if-true label, jump-if-false label, k); "" = next.
    asm: list[tuple[str, int, str, str, int]] = [
        ("", _LD_W_ABS, "", "", 4),  # arch
        ("", _JEQ_K, "", "kill", arch),
        ("", _LD_W_ABS, "", "", 0),  # nr
        ("", _JGE_K, "kill", "", _X32_BIT),
        ("", _JEQ_K, "notify", "", nr_connect),
        ("", _JEQ_K, "sock", "", nr_socket),
        ("", _JEQ_K, "sock", "", nr_socketpair),
        ("", _JEQ_K, "eperm", "", _NR_IO_URING_SETUP),
        ("", _JEQ_K, "eperm", "", _NR_IO_URING_SETUP + 1),  # io_uring_enter
        ("", _JEQ_K, "eperm", "allow", _NR_IO_URING_SETUP + 2),  # io_uring_register
        # The kernel reads `domain` and `type` as int: only the low words count.
        ("sock", _LD_W_ABS, "", "", 16),  # low word of args[0]: domain
        ("", _JEQ_K, "", "allow", socket.AF_UNIX),
        ("", _LD_W_ABS, "", "", 24),  # low word of args[1]: type
        ("", _ALU_AND_K, "", "", 0xF),  # SOCK_TYPE_MASK
        ("", _JEQ_K, "eperm", "", socket.SOCK_DGRAM),
        ("", _JEQ_K, "eperm", "allow", socket.SOCK_RAW),
        ("allow", _RET_K, "", "", _RET_ALLOW),
        ("notify", _RET_K, "", "", _RET_USER_NOTIF),
        ("kill", _RET_K, "", "", _RET_KILL_PROCESS),
        ("eperm", _RET_K, "", "", _RET_ERRNO | errno.EPERM),
    ]
    labels = {label: pc for pc, (label, *_) in enumerate(asm) if label}
    prog = []
    for pc, (_, code, jt, jf, k) in enumerate(asm):
        if code in (_JEQ_K, _JGE_K):
            # Classic BPF jumps forward only, relative to the next instruction.
            prog.append(_insn(code, _rel(labels, pc, jt), _rel(labels, pc, jf), k))
        else:
            prog.append(_insn(code, 0, 0, k))
    return b"".join(prog)


def _rel(labels: dict[str, int], pc: int, label: str) -> int:
    if not label:
        return 0
    off = labels[label] - pc - 1
    if not 0 <= off <= 255:
        raise ValueError(f"jump to {label} from {pc} is not a short forward jump")
    return off


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _syscall(*args: int) -> int:
    # Unprototyped ctypes calls pass Python ints as C int: widen every
    # argument, or a pointer loses its upper half.
    return int(_libc.syscall(*(ctypes.c_long(a) for a in args)))


def _ioctl(fd: int, request: int, arg: int) -> int:
    return int(_libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), ctypes.c_ulong(arg)))


def unavailable_reason() -> str | None:
    """Why the supervisor cannot run on this kernel, or None when it can."""
    machine = os.uname().machine
    if machine not in _ARCH:
        return f"architecture {machine} is not supported"
    nr_seccomp = _ARCH[machine][1]
    action = ctypes.c_uint32(_RET_USER_NOTIF)
    if _syscall(nr_seccomp, _SECCOMP_GET_ACTION_AVAIL, 0, ctypes.addressof(action)) != 0:
        return "seccomp user notification is not available"
    sizes = (ctypes.c_uint16 * 3)()
    if _syscall(nr_seccomp, _SECCOMP_GET_NOTIF_SIZES, 0, ctypes.addressof(sizes)) != 0:
        return "seccomp notification sizes are unknown"
    if (sizes[0], sizes[1], sizes[2]) != (_NOTIF_SIZE, _RESP_SIZE, 64):
        return f"unexpected seccomp notification sizes {tuple(sizes)}"
    for nr, name in ((_NR_PIDFD_GETFD, "pidfd_getfd"), (_NR_OPENAT2, "openat2")):
        if _syscall(nr, -1, 0, 0, 0) < 0 and ctypes.get_errno() == errno.ENOSYS:
            return f"{name} is not available (Linux >= 5.6)"
    return None


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class ChildInstaller:
    """Installs the filter in the launcher's child and sends the listener home.

    Built before the fork, so the child only makes raw syscalls: no import,
    no allocation beyond what CPython does for a method call.
    """

    def __init__(self, program: bytes, allow_unix: tuple[str, ...] = ()) -> None:
        self.program = program
        self._grants, self._pins = grants_for(allow_unix)
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.addressof(self._buf))
        self._nr = _ARCH[os.uname().machine][1]
        self.parent, self._child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    @property
    def child_fd(self) -> int:
        """The child's end of the socketpair (a prepared child receives it: `prefork`)."""
        return self._child.fileno()

    @classmethod
    def child_half(cls, program: bytes, child_fd: int) -> ChildInstaller:
        """In a child forked before its request (`prefork`): just what `install` uses."""
        self = cls.__new__(cls)
        self.program = program
        self._grants, self._pins = (), ()
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.addressof(self._buf))
        self._nr = _ARCH[os.uname().machine][1]
        self._child = socket.socket(fileno=child_fd)
        self.parent = self._child
        return self

    def install(self) -> None:
        """In the child: no_new_privs, the filter, and SCM_RIGHTS of its listener."""
        # Required to load a filter without CAP_SYS_ADMIN (after the uid drop).
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        fd = _check(
            _syscall(
                self._nr,
                _SECCOMP_SET_MODE_FILTER,
                _SECCOMP_FILTER_FLAG_NEW_LISTENER,
                ctypes.addressof(self._prog),
            ),
            "seccomp(NEW_LISTENER)",
        )
        try:
            self._child.sendmsg(
                [b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
            )
        finally:
            # The listener must never reach bwrap or the sandbox: whoever holds
            # it answers the sandbox's connects.
            os.close(fd)
            self._child.close()

    def start_supervisor(
        self, observer: Callable[[UnixConnectEvent], None] | None
    ) -> UnixSupervisor:
        """In the parent, after the spawn: receive the listener and start answering."""
        # Our copy of the child's end goes first, so a child that died before
        # sending shows up as EOF rather than as a timeout.
        self._child.close()
        sup = UnixSupervisor(recv_listener(self.parent), self._grants, observer, self._pins)
        self._pins = ()
        sup.start()
        return sup

    def close(self) -> None:
        self._child.close()
        self.parent.close()
        for fd in self._pins:
            os.close(fd)
        self._pins = ()


def recv_listener(sock: socket.socket, timeout_s: float = 10.0) -> int:
    """The listener descriptor the child sent (raises OSError when it did not)."""
    sock.settimeout(timeout_s)
    msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
    if msg != b"L" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise OSError(errno.EPROTO, "the launcher did not send the seccomp listener")
    return fds[0]


def grants_for(paths: tuple[str, ...]) -> tuple[tuple[UnixGrant, ...], tuple[int, ...]]:
    """`--allow-unix` paths as inodes taken now, and O_PATH descriptors pinning them.

    While a pin is open the inode cannot be freed, so its number cannot be
    reused by another socket on the same filesystem: a grant admits exactly
    the socket that existed at start. Raises SandboxStartError.
    """
    if not paths:
        # Most sandboxes grant none: spare them unix_admit's import.
        return (), ()
    from corral.sandbox.unix_admit import UnixGrant

    out: list[UnixGrant] = []
    pins: list[int] = []
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxStartError(exc.errno, f"--allow-unix {path}: {exc.strerror}") from exc
            pins.append(fd)
            st = os.fstat(fd)
            if not stat.S_ISSOCK(st.st_mode):
                raise SandboxStartError(errno.ENOTSOCK, f"--allow-unix {path}: not a socket")
            out.append(UnixGrant(path, st.st_dev, st.st_ino))
    except BaseException:
        for fd in pins:
            os.close(fd)
        raise
    return tuple(out), tuple(pins)


class _Notif(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("nr", ctypes.c_int32),
        ("arch", ctypes.c_uint32),
        ("ip", ctypes.c_uint64),
        ("args", ctypes.c_uint64 * 6),
    ]


class _Resp(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("val", ctypes.c_int64),
        ("error", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
    ]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Denied(Exception):
    """Internal: answer the notification with this errno."""

    def __init__(self, err: int) -> None:
        super().__init__(err)
        self.err = err


def _pidfd_of_thread(tid: int) -> int:
    """A pidfd for the notifying task, which may be any thread of its process."""
    try:
        # PIDFD_THREAD (Linux 6.9): pidfd_getfd then reads this thread's own fd table.
        return os.pidfd_open(tid, _PIDFD_THREAD)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise _Denied(errno.ESRCH) from None
    # Older kernels take only a thread-group leader. The caller re-checks that
    # the notification is still pending afterwards, so `tid` cannot have been
    # reused by another task in between.
    try:
        with open(f"/proc/{tid}/status", "rb") as fh:
            tgid = next(int(line.split()[1]) for line in fh if line.startswith(b"Tgid:"))
        return os.pidfd_open(tgid)
    except (OSError, StopIteration, ValueError):
        raise _Denied(errno.ESRCH) from None


def _read_remote(pid: int, addr: int, size: int) -> bytes:
    buf = ctypes.create_string_buffer(size)
    local = _Iovec(ctypes.addressof(buf), size)
    remote = _Iovec(addr, size)
    n = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n != size:
        raise _Denied(errno.EFAULT)
    return buf.raw


def _openat2(dirfd: int, path: bytes, resolve: int) -> int:
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, resolve)
    cpath = ctypes.create_string_buffer(path)
    ret = _syscall(_NR_OPENAT2, dirfd, ctypes.addressof(cpath), ctypes.addressof(how), 24)
    if ret < 0:
        raise _Denied(ctypes.get_errno())
    return ret


def _kernel_dev(kdev: int) -> int:
    # UNIX_DIAG reports the kernel-internal dev_t (major << 20 | minor).
    return os.makedev(kdev >> 20, kdev & 0xFFFFF)


def _diag_inodes(sock: socket.socket) -> set[tuple[int, int]]:
    """(dev, low 32 bits of ino) of every unix socket bound in `sock`'s netns."""
    req = struct.pack("<BBHIII2I", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_VFS, 0, 0)
    hdr = struct.pack("<IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0)
    sock.sendto(hdr + req, (0, 0))
    out: set[tuple[int, int]] = set()
    while True:
        data = sock.recv(1 << 16)
        off = 0
        while off + 16 <= len(data):
            length, kind, _fl, _seq, _pid = struct.unpack_from("<IHHII", data, off)
            if length < 16 or off + length > len(data):
                raise OSError(errno.EPROTO, "malformed sock_diag reply")
            if kind == _NLMSG_DONE:
                return out
            if kind == _NLMSG_ERROR:
                (code,) = struct.unpack_from("<i", data, off + 16)
                raise OSError(-code, "sock_diag dump failed")
            pos, end = off + 16 + 16, off + length
            while pos + 4 <= end:
                alen, atype = struct.unpack_from("<HH", data, pos)
                if alen < 4:
                    break
                if atype == _UNIX_DIAG_VFS and alen >= 12:
                    vino, vdev = struct.unpack_from("<II", data, pos + 4)
                    out.add((_kernel_dev(vdev), vino))
                pos += (alen + 3) & ~3
            off += (length + 3) & ~3
        if not data:
            raise OSError(errno.EPROTO, "sock_diag dump ended early")


def _diag_socket_in(netns_fd: int) -> socket.socket:
    """A NETLINK_SOCK_DIAG socket created inside the network namespace `netns_fd`.

    setns(CLONE_NEWNET) changes only the calling thread, so it runs on a
    throwaway thread and never on a worker that goes on connecting.
    """
    box: list[socket.socket | BaseException] = []

    def body() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(netns_fd, _CLONE_NEWNET), "setns(sandbox netns)")
            try:
                box.append(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG))
            finally:
                _check(_libc.setns(own, _CLONE_NEWNET), "setns(back)")
        except BaseException as exc:
            box.append(exc)
        finally:
            os.close(own)

    t = threading.Thread(target=body, name="corral-unix-diag", daemon=True)
    t.start()
    t.join()
    if not box:
        raise OSError(errno.EPROTO, "no sock_diag socket")
    got = box[0]
    if isinstance(got, PermissionError):
        # Not root: only the owner of the sandbox's user namespace may join
        # it, and setns(CLONE_NEWUSER) refuses a multithreaded caller.
        return _diag_socket_via_helper(netns_fd)
    if isinstance(got, BaseException):
        raise got
    return got


_HELPER = """
import ctypes, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
user, net, out = map(int, sys.argv[1:4])
if libc.setns(user, 0x10000000) != 0 or libc.setns(net, 0x40000000) != 0:
    sys.exit(ctypes.get_errno() or 1)
d = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)
socket.send_fds(socket.socket(fileno=out), [b"D"], [d.fileno()])
"""


def _helper_python() -> str:
    import sys

    # The system interpreter: a virtualenv's may live where this uid cannot exec.
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _diag_socket_via_helper(netns_fd: int) -> socket.socket:
    import subprocess

    userns = _check(_ioctl(netns_fd, _NS_GET_USERNS, 0), "NS_GET_USERNS")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        fds = (userns, netns_fd, theirs.fileno())
        proc = subprocess.run(
            [_helper_python(), "-I", "-S", "-c", _HELPER, *map(str, fds)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
        theirs.close()
        if proc.returncode != 0:
            raise OSError(errno.EPERM, f"cannot enter the sandbox netns (helper {proc.returncode})")
        mine.settimeout(5)
        msg, got, _flags, _addr = socket.recv_fds(mine, 1, 1)
        if msg != b"D" or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise OSError(errno.EPROTO, "the netns helper sent no socket")
        return socket.socket(fileno=got[0])
    finally:
        os.close(userns)
        theirs.close()
        mine.close()


class UnixSupervisor:
    """Answers the connect() notifications of one sandbox; `close()` releases everything.

    `observer` receives every decided pathname connect before it is carried
    out; if it raises, the connect is refused (the journal is written first).
    Connects to the sandbox's own sockets are reported once per inode.
    """

    def __init__(
        self,
        listener: int,
        grants: tuple[UnixGrant, ...] = (),
        observer: Callable[[UnixConnectEvent], None] | None = None,
        pins: tuple[int, ...] = (),
    ) -> None:
        """Takes ownership of `listener` and of the grants' `pins`."""
        self._listener = listener
        self._pins = pins
        self._nr_connect = _ARCH[os.uname().machine][2]
        self._grants = grants
        self._observer = observer
        self._lock = threading.Lock()
        self._diag_lock = threading.Lock()
        self._diag: dict[tuple[int, int], socket.socket] = {}
        self._reported: set[tuple[int, int]] = set()
        # Workers stay alive between notifications (starting a thread per
        # connect doubled its cost); at most _MAX_PENDING run, so a flood of
        # blocking connects queues further notifications instead of passing them.
        self._jobs: collections.deque[_Notif | None] = collections.deque()
        self._jobs_ready = threading.Condition(threading.Lock())
        self._pool_lock = threading.Lock()
        self._workers = self._idle = self._backlog = 0
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._loop, name="corral-unix", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop answering; later connects of anything left fail with ENOSYS."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5.0)
        self._close_listener()
        with self._pool_lock:
            workers = self._workers
        for _ in range(workers):
            self._put(None)
        with self._diag_lock:
            for s in self._diag.values():
                s.close()
            self._diag.clear()
        for fd in (self._wake_r, self._wake_w, *self._pins):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1
        self._pins = ()

    def _close_listener(self) -> None:
        with self._lock:
            if self._listener >= 0:
                os.close(self._listener)
                self._listener = -1

    # -- the receive loop --------------------------------------------------
    def _loop(self) -> None:
        try:
            poller = select.poll()
            poller.register(self._listener, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while True:
                events = dict(poller.poll())
                if self._wake_r in events:
                    return
                ev = events.get(self._listener, 0)
                if ev & select.POLLIN:
                    notif = self._recv()
                    if notif is not None:
                        self._dispatch(notif)
                elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    # Every process under the filter has exited.
                    return
        finally:
            # Fail closed: without a supervisor the kernel answers ENOSYS.
            self._close_listener()

    def _recv(self) -> _Notif | None:
        notif = _Notif()
        if _ioctl(self._listener, _IOCTL_RECV, ctypes.addressof(notif)) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.EINTR):
                # The caller died or was interrupted before we received it.
                return None
            raise OSError(err, f"SECCOMP_IOCTL_NOTIF_RECV: {os.strerror(err)}")
        return notif

    def _id_valid(self, notif_id: int) -> bool:
        nid = ctypes.c_uint64(notif_id)
        with self._lock:
            if self._listener < 0:
                return False
            return _ioctl(self._listener, _IOCTL_ID_VALID, ctypes.addressof(nid)) == 0

    def _respond(self, notif_id: int, val: int, err: int) -> None:
        resp = _Resp(notif_id, val, -err if err else 0, 0)
        with self._lock:
            if self._listener < 0:
                return
            # ENOENT: the caller died or was interrupted meanwhile; nothing to do.
            _ioctl(self._listener, _IOCTL_SEND, ctypes.addressof(resp))

    def _dispatch(self, notif: _Notif) -> None:
        spawn = False
        with self._pool_lock:
            if self._idle:
                self._idle -= 1
            elif self._workers < _MAX_PENDING:
                self._workers += 1
                spawn = True
            else:
                self._backlog += 1
        self._put(notif)
        if spawn:
            threading.Thread(target=self._worker, name="corral-unix-w", daemon=True).start()

    def _put(self, job: _Notif | None) -> None:
        with self._jobs_ready:
            self._jobs.append(job)
            self._jobs_ready.notify()

    def _get(self) -> _Notif | None:
        with self._jobs_ready:
            while not self._jobs:
                self._jobs_ready.wait()
            return self._jobs.popleft()

    def _worker(self) -> None:
        while (notif := self._get()) is not None:
            self._work(notif)
            with self._pool_lock:
                if self._backlog:
                    self._backlog -= 1
                else:
                    self._idle += 1

    def _work(self, notif: _Notif) -> None:
        err = errno.EACCES
        try:
            err = self._handle(notif)
        except _Denied as d:
            err = d.err
        except Exception:  # fail closed: any surprise refuses the connect
            err = errno.EACCES
        self._respond(notif.id, 0, err)

    # -- one connect -------------------------------------------------------
    def _handle(self, notif: _Notif) -> int:
        if notif.nr != self._nr_connect:
            return errno.ENOSYS
        fd_nr = notif.args[0] & 0xFFFFFFFF
        addr_ptr = notif.args[1]
        addrlen = ctypes.c_int32(notif.args[2] & 0xFFFFFFFF).value
        if not 0 <= addrlen <= _SOCKADDR_STORAGE:
            return errno.EINVAL
        pidfd = _pidfd_of_thread(notif.pid)
        try:
            # The pid may have been reused before pidfd_open: only a still
            # pending notification proves the pidfd names the caller.
            if not self._id_valid(notif.id):
                raise _Denied(errno.EINTR)
            addr = _read_remote(notif.pid, addr_ptr, addrlen) if addrlen else b""
            sock = _syscall(_NR_PIDFD_GETFD, pidfd, fd_nr, 0)
            if sock < 0:
                raise _Denied(ctypes.get_errno())
        finally:
            os.close(pidfd)
        try:
            return self._connect(notif, sock, addr)
        finally:
            os.close(sock)

    def _connect(self, notif: _Notif, sock: int, addr: bytes) -> int:
        domain = ctypes.c_int(0)
        size = ctypes.c_uint32(4)
        rc = _libc.getsockopt(
            sock, _SOL_SOCKET, _SO_DOMAIN, ctypes.byref(domain), ctypes.byref(size)
        )
        if rc != 0:
            return ctypes.get_errno()
        if domain.value in (socket.AF_INET, socket.AF_INET6):
            return _raw_connect(sock, addr)
        if domain.value == socket.AF_NETLINK:
            # netlink_connect() lets CAP_NET_ADMIN (which this process has)
            # subscribe to multicast groups; refuse as for an unprivileged caller.
            if len(addr) >= 12 and int.from_bytes(addr[8:12], "little"):
                return errno.EPERM
            return _raw_connect(sock, addr)
        if domain.value != socket.AF_UNIX:
            # Other families may check the connecting task's capabilities,
            # which would be this process's rather than the sandbox's.
            return errno.EPERM
        if len(addr) <= _SUN_PATH_OFFSET or len(addr) > _SOCKADDR_UN_SIZE:
            return errno.EINVAL
        family = int.from_bytes(addr[:2], "little")
        if family == _AF_UNSPEC:
            return _raw_connect(sock, addr)
        if family != socket.AF_UNIX:
            return errno.EINVAL
        if addr[_SUN_PATH_OFFSET] == 0:
            # Abstract names live in the socket's network namespace, the sandbox's.
            return _raw_connect(sock, addr)
        path = addr[_SUN_PATH_OFFSET:].split(b"\0", 1)[0]
        return self._connect_path(notif, sock, path)

    def _connect_path(self, notif: _Notif, sock: int, path: bytes) -> int:
        from corral.sandbox.unix_admit import Admission, UnixTarget, admit

        # For the journal only: invalid UTF-8 would not survive its encoder.
        text = path.decode("utf-8", "backslashreplace")
        try:
            pinned = self._resolve(notif.pid, path)
        except _Denied as d:
            self._report(notif.pid, text, Admission(False, "unresolvable", "lookup failed", d.err))
            raise
        try:
            st = os.fstat(pinned)
            target = UnixTarget(text, st.st_dev, st.st_ino, stat.S_ISSOCK(st.st_mode))
            inside = target.is_socket and self._inside(sock, target)
            decision = admit(target, self._grants, inside)
            key = (target.dev, target.ino)
            if decision.rule != "inside" or key not in self._reported:
                if decision.rule == "inside" and len(self._reported) < _DEDUP_MAX:
                    self._reported.add(key)
                self._report(notif.pid, text, decision)
            if not decision.allow:
                return decision.error
            via = b"/proc/self/fd/%d" % pinned
            return _raw_connect(sock, struct.pack("<H", socket.AF_UNIX) + via + b"\0")
        finally:
            os.close(pinned)

    def _resolve(self, pid: int, path: bytes) -> int:
        if not path.startswith(b"/"):
            # The cwd as the sandbox names it; whatever the link says, the
            # lookup below stays inside the sandbox's root.
            with contextlib.suppress(OSError):
                cwd = os.readlink(f"/proc/{pid}/cwd".encode())
                if cwd.startswith(b"/") and not cwd.endswith(b" (deleted)"):
                    path = cwd.rstrip(b"/") + b"/" + path
        absolute = path.startswith(b"/")
        base = f"/proc/{pid}/{'root' if absolute else 'cwd'}"
        try:
            dirfd = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _Denied(exc.errno or errno.EACCES) from None
        try:
            if absolute:
                return _openat2(dirfd, path, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
            # Beneath the cwd: a ".." out of it is refused (EXDEV) instead of
            # being resolved without the sandbox's root as the limit.
            return _openat2(dirfd, path, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        finally:
            os.close(dirfd)

    def _inside(self, sock: int, target: UnixTarget) -> bool:
        if target.ino > 0xFFFFFFFF:
            # UNIX_DIAG reports 32 bits of the inode number: above that a
            # sandbox socket could alias a host one, so such inodes never count
            # as the sandbox's own (fail closed).
            return False
        netns = _check(_ioctl(sock, _SIOCGSKNS, 0), "SIOCGSKNS")
        try:
            st = os.fstat(netns)
            key = (st.st_dev, st.st_ino)
            with self._diag_lock:
                diag = self._diag.get(key)
                if diag is None:
                    diag = _diag_socket_in(netns)
                    diag.settimeout(5.0)
                    self._diag[key] = diag
                try:
                    bound = _diag_inodes(diag)
                except BaseException:
                    # A half-read dump would confuse the next one.
                    del self._diag[key]
                    diag.close()
                    raise
        finally:
            os.close(netns)
        return (target.dev, target.ino) in bound

    def _report(self, pid: int, path: str, decision: Admission) -> None:
        from corral.sandbox.unix_admit import UnixConnectEvent

        if self._observer is not None:
            self._observer(
                UnixConnectEvent(
                    pid, path, decision.allow, decision.rule, decision.reason, decision.error
                )
            )


def _raw_connect(sock: int, addr: bytes) -> int:
    buf = ctypes.create_string_buffer(addr, max(len(addr), 1))
    if _libc.connect(sock, buf, len(addr)) != 0:
        return ctypes.get_errno()
    return 0
