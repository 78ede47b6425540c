"""The next sandbox's first process, forked into its cgroup before the request (host code).

A process's first write to a v1 `cgroup.procs` waits for an RCU grace
period (the kernel switches cgroup_threadgroup_rwsem to its slow mode and
synchronizes before the move): about 8 ms on an idle host, the largest
single wait between `NamespaceSandbox.start`'s fork and bwrap's exec. A
warm launcher worker (`exec/launcher.py`, via `sandbox.prewarm`) pays it
ahead: it creates the next sandbox's cgroup under the default parent with
no limits, forks a child that joins it, and the child parks on a
socketpair only the worker holds.

On the request, `take` hands it to `NamespaceSandbox.start` when the request
fits (same cgroup parent and layout; the request's limits are written into
the cgroup first, before the child may exec anything), and `launch` sends it
what Popen would have given the child: argv, environment, umask, resource
limits and the descriptors at the numbers the argv names (SCM_RIGHTS). The
child then runs the same `namespace.child_setup` as Popen's child and execs
bwrap; the parent waits for that exec like Popen does (the socket is
close-on-exec: EOF means exec'd, bytes are the error). With
`launch(gate=...)` the child stops before its self-binds until the worker
has made the protection placeholders.

Tried and dropped: spawning bwrap as the worker's child from a vfork-style
clone (CLONE_VM|CLONE_VFORK|CLONE_PARENT) instead of this exec, which
first unmaps the ~40 MB the child shares with the worker: -1.0 ms, but the
exiting spawner stays charged to the sandbox's pids limit until reaped, so
`--pids 4` (enough for bwrap, its pid 1, the init and `sh`) failed.

What it holds while parked: stdio, its end of the socketpair (every
other descriptor is closed at the fork) and the sandbox's network namespace,
made ahead like the cgroup move (`mounts.make_net_ns`); PDEATHSIG and a parent check make it
die with its worker, whose cgroup name carries the worker's pid, so
`sweep_stale` removes it once the worker is gone. It is a fork of the
worker, so it runs exactly the code the launcher's staleness check vouched
for, and it is gone before the worker is (discard, or the kernel's
PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import socket
import struct
import subprocess
import threading

from corral.errors import CgroupError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from corral.sandbox.cgroup import Cgroup, CgroupLayout
    from corral.sandbox.spec import Limits
    from corral.sandbox.stage import EtcTuple

__all__ = ["SETUP_COMM", "SPAWN_COMM", "AdoptedChild", "Prepared", "discard", "prepare", "take"]

#: /proc/PID/comm of a parked child, and of one setting up for its request (until exec).
SPAWN_COMM = "corral-spawn"
SETUP_COMM = "corral-spawning"
_MAX_BODY = 16 << 20
#: What releases a gated child (`launch(gate=...)`) into its self-binds.
_GO = b"G"
#: SCM_MAX_FD: the kernel refuses more descriptors in one message.
_MAX_FDS = 253
_PR_SET_NAME = 15


class AdoptedChild(subprocess.Popen[bytes]):
    """A Popen for a child this process forked itself: poll/wait/kill work as for Popen's own.

    Only the attributes those methods read are set; there are no pipes.
    """

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = True
        self._waitpid_lock = threading.Lock()
        self._sigint_wait_secs = 0.25
        self._input = None
        self._communication_started = False
        self._closed_child_pipe_fds = True
        self.text_mode = False
        self.encoding = None
        self.errors = None


class Prepared:
    """A parked child in its cgroup: the worker's side."""

    __slots__ = ("cgroup", "parent", "pid", "sock")

    def __init__(self, cgroup: Cgroup, parent: str, pid: int, sock: socket.socket) -> None:
        self.cgroup = cgroup
        self.parent = parent
        self.pid = pid
        self.sock = sock

    def alive(self) -> bool:
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid:
            self.pid = -1
            return False
        return self.pid > 0

    def launch(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        stdio: Sequence[int | None],
        pass_fds: Sequence[int],
        keep_fds: Sequence[int],
        setup: Setup,
        gate: Callable[[], None] | None = None,
    ) -> AdoptedChild:
        """Have the child exec `argv` as Popen(cwd="/", close_fds=True, pass_fds) would.

        `stdio` lands on 0-2 (None: this process's own), `pass_fds` at their
        numbers and inheritable, `keep_fds` at their numbers close-on-exec
        (for `child_setup`, whose arguments are `setup`). Raises
        SubprocessError with the child's reason when it did not exec; the
        child is reaped then. With `gate` the child stops before its
        self-binds until `gate()` has returned here (run while it stages the
        rest); if `gate` raises, the child is killed and the error re-raised.
        """
        import resource

        if not os.path.isabs(argv[0]):
            raise subprocess.SubprocessError(f"not an absolute path: {argv[0]}")
        sent = [i if fd is None else fd for i, fd in enumerate(stdio)]
        sent += [*pass_fds, *keep_fds]
        targets = [0, 1, 2, *pass_fds, *keep_fds]
        limits = [
            (r, *resource.getrlimit(r))
            for name in dir(resource)
            if name.startswith("RLIMIT_") and (r := getattr(resource, name)) >= 0
        ]
        umask = os.umask(0)
        os.umask(umask)
        gated = gate is not None
        request = (list(argv), env, targets, 3 + len(pass_fds), umask, limits, setup, gated)
        body = marshal.dumps(request)
        if len(body) > _MAX_BODY or len(sent) > _MAX_FDS:
            self.release_child()
            raise subprocess.SubprocessError("request too large for a prepared child")
        reply = b""
        fds = struct.pack(f"{len(sent)}i", *sent)
        try:
            head = struct.pack("!I", len(body))
            msg = head + body
            n = self.sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            if n < len(msg):
                # Not after the last byte: the child may have exec'd by then
                # (its end closed), and a send of nothing would fail with EPIPE.
                self.sock.sendall(msg[n:])
            if gate is not None:
                try:
                    gate()
                except BaseException:
                    self.release_child()
                    raise
                self.sock.sendall(_GO)
            # The child's end is close-on-exec: EOF alone means bwrap was exec'd.
            while chunk := self.sock.recv(4096):
                reply += chunk[: 4096 - len(reply)]
        except OSError as exc:
            # Its reason, if it sent one before it went.
            with contextlib.suppress(OSError):
                self.sock.setblocking(False)
                reply += self.sock.recv(4096)
            status = self.release_child()
            why = reply.decode(errors="replace") or f"{exc} (status {status:#x})"
            raise subprocess.SubprocessError(f"the prepared child is gone: {why}") from exc
        finally:
            self.sock.close()
        if reply:
            self.release_child()
            raise subprocess.SubprocessError(reply.decode(errors="replace"))
        pid, self.pid = self.pid, -1
        return AdoptedChild(pid, argv)

    def release_child(self) -> int:
        """Kill and reap the child if it is still this object's (idempotent); its wait status."""
        status = -1
        if self.pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(self.pid, 0)
            self.pid = -1
        self.sock.close()
        return status

    def discard(self) -> None:
        """Kill the child and remove its cgroup."""
        self.release_child()
        with contextlib.suppress(CgroupError, OSError):
            self.cgroup.remove(timeout_s=2.0)


_slot: list[Prepared] = []


def prepare(parent: str = "corral") -> None:
    """Create the next sandbox's cgroup and park a child in it (best effort).

    Root only, as the namespace backend's idmapped start is (its uid lease
    comes from `prewarm`). Any failure leaves nothing prepared: the request
    then runs the normal path and reports the error there.
    """
    if _slot or os.geteuid() != 0:
        return
    from corral.sandbox.cgroup import Cgroup, detect_layout, sweep_stale
    from corral.sandbox.layers import cgroup_unwritable
    from corral.sandbox.spec import Limits

    layout = detect_layout()
    if layout is None or cgroup_unwritable(layout) is not None:
        return
    # Off the request path: what killed corrals (and workers) left behind, in every hierarchy.
    with contextlib.suppress(CgroupError, OSError):
        sweep_stale(layout, parent)
    if parent == "corral":
        layout = layout.without_v2_stand_ins()  # as NamespaceSandbox.start makes it
    try:
        cg = Cgroup.create(layout, f"{parent}/exec-{os.getpid()}-{os.urandom(4).hex()}", Limits())
    except (CgroupError, OSError):
        return
    try:
        prepared = _fork(cg, parent)
    except BaseException:
        with contextlib.suppress(CgroupError, OSError):
            cg.remove(timeout_s=2.0)
        raise
    if prepared is not None:
        _slot.append(prepared)


def _fork(cg: Cgroup, parent: str) -> Prepared | None:
    try:
        attach = cg.open_attach_fds()
    except CgroupError:
        cg.remove(timeout_s=2.0)
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    worker = os.getpid()
    try:
        with open("/proc/self/comm", "rb") as fh:
            comm = fh.read().strip()
        # Born with its name (comm is copied at fork): never taken for a warm worker.
        _set_comm(SPAWN_COMM.encode())
        try:
            pid = os.fork()
        finally:
            if os.getpid() == worker:
                _set_comm(comm)
        if pid == 0:
            mine.close()
            _child(theirs, attach, worker)  # never returns
    except OSError:
        mine.close()
        cg.remove(timeout_s=2.0)
        return None
    finally:
        if os.getpid() == worker:
            theirs.close()
            for fd in attach:
                os.close(fd)
    prepared = Prepared(cg, parent, pid, mine)
    # "R" once it is in every hierarchy: the grace period is paid here, not on the request.
    try:
        ready = mine.recv(1)
    except OSError:
        ready = b""
    if ready != b"R":
        prepared.discard()
        return None
    return prepared


def _set_comm(name: bytes) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NAME): {os.strerror(err)}")


def _child(sock: socket.socket, attach: list[int], worker: int) -> None:
    """The parked child: join the cgroup, wait for the request, set up, exec bwrap."""
    status = 127
    try:
        from corral.sandbox import namespace

        namespace.set_pdeathsig(signal.SIGKILL)
        # The worker may have died before PDEATHSIG was armed.
        if os.getppid() != worker:
            os._exit(125)
        keep = {0, 1, 2, sock.fileno(), *attach}
        for fd in _open_fds():
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for fd in attach:
            os.write(fd, b"0")
            os.close(fd)
        from corral.sandbox import mounts

        # The sandbox's network namespace, ahead too: creating one takes the
        # kernel's rtnl lock, which a namespace being torn down can hold for
        # tens of milliseconds.
        mounts.make_net_ns()
        sock.sendall(b"R")
        (argv, env, umask, limits, setup, gated), sock = _receive(sock)
        _set_comm(SETUP_COMM.encode())
        import resource

        for res, soft, hard in limits:
            resource.setrlimit(res, (soft, hard))
        os.umask(umask)
        os.chdir("/")
        # What Popen's restore_signals does; the worker ignores SIGPIPE.
        for s in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(s, signal.SIG_DFL)
        is_root, binds, userns_fd, host_uid, host_gid, parent, unix_half, err_w, etc, selfs = setup
        unix = None
        if unix_half is not None:
            from corral.sandbox.unix_supervisor import ChildInstaller

            unix = ChildInstaller.child_half(*unix_half)
        from corral.sandbox import stage

        namespace.child_setup(
            attach_fds=(), is_root=is_root, binds=binds, userns_fd=userns_fd, host_uid=host_uid,
            host_gid=host_gid, parent=parent, unix=unix, err_w=err_w,
            etc_stage=None if etc is None else stage.EtcStage.from_tuple(etc),
            self_binds=[(r, rel, w, n) for r, rel, w, n in selfs], make_net=False,
            gate=(lambda: _await_go(sock)) if gated else None,
        )  # fmt: skip
        os.execve(argv[0], argv, env)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            sock.sendall((str(exc) or type(exc).__name__).encode()[:4000] or b"?")
    finally:
        os._exit(status)


def _await_go(sock: socket.socket) -> None:
    """Block until the worker has made the placeholders the self-binds need."""
    if sock.recv(1) != _GO:
        raise OSError("the worker stopped before the placeholders were made")


def _open_fds() -> list[int]:
    return [int(n) for n in os.listdir("/proc/self/fd")]


#: is_root, binds, userns_fd, host_uid, host_gid, parent pid, (unix filter, its fd) | None, err_w,
#: the staged /etc (`EtcStage.as_tuple`) | None, the guards' self-binds (`stage.SelfBind`)
Setup = tuple[
    bool, list[tuple[str, bool]], int, int, int, int, tuple[bytes, int] | None, int,
    "EtcTuple | None", list[tuple[str, str, bool, str]],
]  # fmt: skip
_Request = tuple[list[str], dict[str, str], int, list[tuple[int, int, int]], Setup, bool]


def _receive(sock: socket.socket) -> tuple[_Request, socket.socket]:
    """The request, its descriptors moved to the numbers it names."""
    data, anc, flags, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(4 * _MAX_FDS))
    got: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            n = len(payload) // 4
            got += struct.unpack(f"{n}i", payload[: 4 * n])
    if flags & socket.MSG_CTRUNC or len(data) < 4:
        raise OSError("truncated request")
    (length,) = struct.unpack("!I", data[:4])
    if length > _MAX_BODY:
        raise OSError("request too large")
    body = bytearray(data[4:])
    while len(body) < length:
        chunk = sock.recv(min(1 << 20, length - len(body)))
        if not chunk:
            raise OSError("truncated request")
        body += chunk
    argv, env, targets, n_inherit, umask, limits, setup, gated = marshal.loads(bytes(body))
    if len(targets) != len(got):
        raise OSError("descriptor count mismatch")
    # Out of the way first: a received descriptor (or this socket) may sit on
    # a number another one must take.
    floor = max([*targets, *got, sock.fileno()]) + 1
    high = [_dupfd(fd, floor) for fd in got]
    for fd in got:
        os.close(fd)
    if sock.fileno() in targets:
        moved = socket.socket(fileno=_dupfd(sock.fileno(), floor))
        sock.close()
        sock = moved
    for i, (src, dst) in enumerate(zip(high, targets, strict=True)):
        os.dup2(src, dst, inheritable=i < n_inherit)
    for fd in high:
        os.close(fd)
    return (argv, env, umask, limits, setup, bool(gated)), sock


def _dupfd(fd: int, floor: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


def take(layout: CgroupLayout, parent: str, limits: Limits) -> Prepared | None:
    """The parked child and its cgroup, the request's limits applied, when the request fits.

    A child prepared for another layout or cgroup parent, one that died, or
    a cgroup that refuses the limits is discarded (killed, cgroup removed):
    the caller then runs the normal path.
    """
    if not _slot:
        return None
    prepared = _slot.pop()
    if prepared.parent != parent or prepared.cgroup.layout != layout or not prepared.alive():
        prepared.discard()
        return None
    try:
        prepared.cgroup.apply_limits(limits)
    except (CgroupError, OSError):
        prepared.discard()
        return None
    return prepared


def discard() -> None:
    """Kill what was prepared and never used, and remove its cgroup."""
    while _slot:
        _slot.pop().discard()
