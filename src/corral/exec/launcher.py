"""The resident launcher: a warm `corral exec` that forks one worker per request (host code).

A fresh interpreter spends most of `corral exec -- true`'s time starting and
importing. The launcher (one per user and corral source tree, started on
demand) imports the exec path once and then, for each request on its unix
socket, forks a worker that runs the very same `run_exec` with the client's
argv, environment, umask, resource limits, working directory and standard
streams.

Wire (client -> launcher), on one SOCK_STREAM connection:

    "CRL1" u32-be LENGTH, with SCM_RIGHTS [stdin, stdout, stderr, cwd (O_DIRECTORY)]
    LENGTH bytes: NUL-terminated fields
        BUILD_ID, UMASK (octal), RLIMITS ("RES:SOFT:HARD,...", -1 = unlimited),
        ARGC, ARGV[0..ARGC) ("exec", options, "--", cmd...), ENV...
    then, at any time: one byte per signal the client received (SIGINT/SIGTERM/SIGHUP)

    launcher -> client: "R <reason>\\n" refused before anything ran (the client
    runs the Python CLI instead) | "A\\n" accepted, then "X <status>\\n" at the end.

Guarantees: only the launcher's own uid is served (SO_PEERCRED); every size
and the fd count are bounded; the worker watches the connection (O_ASYNC:
SIGIO) and treats EOF (client killed) like a signal to `corral exec`: the
sandbox is torn down. Relayed signals reach `run_exec` exactly as signals do.
The launcher stays single-threaded (it forks) and serves a request only while
the corral source tree is unchanged since it started (inotify on every
package directory, or a stamp of every file's name, size and mtime): after an
edit it refuses with "stale", removes its socket and exits, so stale code
never runs silently. Killing the launcher leaves its workers (each owns its
own sandbox and client) running to the end.

Warm worker: while no request is being served, the launcher keeps one worker
forked ahead (named `corral-warm` in /proc/PID/comm once set up), its post-fork set-up
done, blocked on a socketpair only the launcher holds. An accepted connection
that passed the uid and staleness checks is handed to it (SCM_RIGHTS) instead
of forking then: the fork is off the request path. Before it waits it
rehearses that path once on a request of its own (`_rehearse`), so the
copy-on-write faults its first run takes are off the path too. It is a fork of the
launcher, so it runs exactly the code the staleness check vouched for; when
the launcher goes (stale, idle, SIGTERM, SIGKILL) the socketpair closes and an
unused warm worker exits without serving. A request that finds none (another
is being served) is forked for as before.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import select
import signal
import socket
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from corral.errors import CorralError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

__all__ = [
    "BUILD_ID",
    "MAX_BODY",
    "MAX_FIELDS",
    "LaunchRequest",
    "LaunchRequestError",
    "TreeWatch",
    "launcher_socket",
    "parse_request",
    "serve",
    "source_root",
    "start_in_background",
    "start_private",
    "tree_stamp",
]

PROTOCOL = "corral-launcher-2"
MAGIC = b"CRL1"
#: The request body (argv + environment): the kernel's own ARG_MAX for a whole execve.
MAX_BODY = 2 << 20
MAX_FIELDS = 16384
#: stdin, stdout, stderr, cwd.
NFDS = 4
_RELAYED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
_REQUEST_TIMEOUT_S = 10.0

_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from corral.exec.launcher import main; raise SystemExit(main(sys.argv[1:]))"
)


class LaunchRequestError(CorralError, ValueError):
    """A launcher request that is malformed, too large, or for other code."""


def source_root() -> str:
    """The directory holding the `corral` package this launcher runs."""
    return _SOURCE_ROOT


def tag(root: str | None = None, python: str | None = None) -> str:
    """Names one launcher: this source tree under this interpreter."""
    code = f"{root or _SOURCE_ROOT}\0{python or sys.executable}".encode()
    return hashlib.sha256(code).hexdigest()[:16]


BUILD_ID = f"{PROTOCOL} {tag()}"


def launcher_socket(environ: dict[str, str] | None = None) -> Path:
    """The launcher's socket: `$CORRAL_LAUNCHER_SOCKET`, else in the per-user 0700 directory.

    The base directory follows `sockdirs.runtime_base`, the rule the compiled
    front end applies too (`_frontend/frontend.c`).
    """
    from corral.exec.sockdirs import launcher_dir

    env = os.environ if environ is None else environ
    override = env.get("CORRAL_LAUNCHER_SOCKET", "")
    if override.startswith("/"):
        return Path(override)
    return Path(launcher_dir(env)) / f"{tag()}.sock"


def _package_dirs(root: str) -> list[str]:
    out: list[str] = []
    stack = [os.path.join(root, "corral")]
    while stack:
        d = stack.pop()
        out.append(d)
        with contextlib.suppress(OSError), os.scandir(d) as it:
            for e in it:
                if e.name != "__pycache__" and e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return out


def tree_stamp(root: str | None = None) -> int:
    """A checksum of the name, size and mtime of every file of the `corral` package.

    An edit in place changes a file's mtime, an added or removed module the
    listing; both change the stamp. About 240 stats: the fallback when
    inotify is unavailable (`TreeWatch`).
    """
    crc = 0
    for d in sorted(_package_dirs(root or _SOURCE_ROOT)):
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            crc = zlib.crc32(f"!{d}".encode(), crc)
            continue
        for e in entries:
            if e.name == "__pycache__":
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            crc = zlib.crc32(f"{e.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode(), crc)
    return crc


# inotify(7): any change to a file or directory of the package, or the queue's overflow.
_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_MASK = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE
    | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
)  # fmt: skip


def _event_names(data: bytes) -> list[bytes]:
    """The names in a buffer of inotify events (b"" for an event on the directory itself)."""
    names: list[bytes] = []
    off = 0
    while off + 16 <= len(data):
        _wd, _mask, _cookie, length = struct.unpack_from("iIII", data, off)
        names.append(data[off + 16 : off + 16 + length].rstrip(b"\0"))
        off += 16 + length
    return names


class TreeWatch:
    """Has the `corral` package changed since this watch was opened?

    Opened before the launcher imports anything, so an edit during the imports
    counts too. The interpreter's own `__pycache__` directories do not count
    (their first creation would otherwise retire a fresh launcher at once).
    With inotify a check is one non-blocking read; without it (no watches
    left), the check recomputes `tree_stamp`.
    """

    def __init__(self, root: str | None = None) -> None:
        self.root = root or _SOURCE_ROOT
        self._changed = False
        self._fd = -1
        self._stamp = 0
        try:
            self._fd = self._inotify()
        except OSError:
            self._stamp = tree_stamp(self.root)

    def _inotify(self) -> int:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        try:
            for d in _package_dirs(self.root):
                if libc.inotify_add_watch(fd, os.fsencode(d), _IN_MASK) < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"inotify_add_watch {d}: {os.strerror(err)}")
        except OSError:
            os.close(fd)
            raise
        return fd

    def changed(self) -> bool:
        if self._changed:
            return True
        if self._fd < 0:
            self._changed = tree_stamp(self.root) != self._stamp
            return self._changed
        while not self._changed:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return False
            self._changed = any(name != b"__pycache__" for name in _event_names(data))
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One client's `corral exec`: what the worker needs besides the four descriptors."""

    build_id: str
    umask: int
    rlimits: tuple[tuple[int, int, int], ...]
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def parse_request(body: bytes, nfds: int) -> LaunchRequest:
    """Decode and bound a request body (pure); raises LaunchRequestError."""
    if nfds != NFDS:
        raise LaunchRequestError(f"expected {NFDS} descriptors, got {nfds}")
    if len(body) > MAX_BODY:
        raise LaunchRequestError("request too long")
    if not body.endswith(b"\0"):
        raise LaunchRequestError("request not NUL-terminated")
    fields = body[:-1].split(b"\0")
    if len(fields) > MAX_FIELDS:
        raise LaunchRequestError("too many fields")
    if len(fields) < 4:
        raise LaunchRequestError("request too short")
    build_id = fields[0].decode("ascii", "replace")
    try:
        umask = int(fields[1], 8)
        rlimits = _rlimits(fields[2])
        argc = int(fields[3])
    except ValueError:
        raise LaunchRequestError("bad umask, rlimits or argc") from None
    if not 0 <= umask <= 0o777:
        raise LaunchRequestError("bad umask")
    if not 1 <= argc <= len(fields) - 4:
        raise LaunchRequestError("bad argc")
    argv = tuple(os.fsdecode(f) for f in fields[4 : 4 + argc])
    if argv[0] != "exec":
        raise LaunchRequestError("the launcher serves only `corral exec`")
    env: list[tuple[str, str]] = []
    for raw in fields[4 + argc :]:
        name, eq, value = raw.partition(b"=")
        if not eq or not name:
            continue  # execve keeps such entries; os.environ cannot hold them
        env.append((os.fsdecode(name), os.fsdecode(value)))
    return LaunchRequest(build_id=build_id, umask=umask, rlimits=rlimits, argv=argv, env=tuple(env))


_MAX_RLIMITS = 32


def _rlimits(raw: bytes) -> tuple[tuple[int, int, int], ...]:
    """`RES:SOFT:HARD,...` (-1 = RLIM_INFINITY); ValueError when malformed."""
    if not raw:
        return ()
    out: list[tuple[int, int, int]] = []
    for item in raw.split(b","):
        res, soft, hard = (int(x) for x in item.split(b":"))
        if not 0 <= res < 64 or soft < -1 or hard < -1:
            raise ValueError(item)
        out.append((res, soft, hard))
    if len(out) > _MAX_RLIMITS:
        raise ValueError("too many rlimits")
    return tuple(out)


def _apply_rlimits(rlimits: tuple[tuple[int, int, int], ...]) -> None:
    """The caller's resource limits, as `corral exec` would have inherited them.

    A limit above the launcher's own hard limit cannot be raised (EPERM
    without CAP_SYS_RESOURCE): the request is refused then, as nothing ran yet.
    """
    import resource

    for res, soft, hard in rlimits:
        lim = (
            resource.RLIM_INFINITY if soft < 0 else soft,
            resource.RLIM_INFINITY if hard < 0 else hard,
        )
        try:
            resource.setrlimit(res, lim)
        except (OSError, ValueError) as exc:
            raise LaunchRequestError(f"rlimit {res}: {exc}") from exc


def _recv_request(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The header with its descriptors, then the body; every received fd is returned."""
    fds: list[int] = []
    space = socket.CMSG_SPACE(struct.calcsize("i") * (NFDS + 4))
    head = b""
    while len(head) < 8:
        data, anc, flags, _ = conn.recvmsg(8 - len(head), space)
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                n = len(payload) // 4
                fds += struct.unpack(f"{n}i", payload[: 4 * n])
        if flags & socket.MSG_CTRUNC:
            raise _Refused(fds, "too many descriptors")
        if not data:
            raise _Refused(fds, "")
        head += data
    if head[:4] != MAGIC:
        raise _Refused(fds, "bad magic")
    (length,) = struct.unpack("!I", head[4:8])
    if length > MAX_BODY:
        raise _Refused(fds, "request too long")
    body = bytearray()
    while len(body) < length:
        chunk = conn.recv(min(1 << 16, length - len(body)))
        if not chunk:
            raise _Refused(fds, "")
        body += chunk
    return bytes(body), fds


class _Refused(Exception):
    def __init__(self, fds: list[int], reason: str) -> None:
        super().__init__(reason)
        self.fds = fds
        self.reason = reason


def _send(conn: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(line.encode() + b"\n")


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# --- the worker (a forked child of the launcher) ---------------------------------------------


class _ConnWatch:
    """SIGIO on the client connection: a relayed signal or EOF interrupts `run_exec`."""

    def __init__(self, conn: socket.socket, interrupt: Callable[[int], None]) -> None:
        self.conn = conn
        self.interrupt = interrupt
        self.gone = False

    def install(self) -> None:
        fd = self.conn.fileno()
        signal.signal(signal.SIGIO, self._on_sigio)
        fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_ASYNC | os.O_NONBLOCK)

    def stop(self) -> None:
        fd = self.conn.fileno()
        signal.signal(signal.SIGIO, signal.SIG_IGN)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~(os.O_ASYNC | os.O_NONBLOCK))

    def pending(self) -> int:
        """Read what arrived: the first relayed signal, SIGHUP on EOF, or 0."""
        if self.gone:
            return 0
        got = 0
        while True:
            try:
                data = self.conn.recv(64)
            except (BlockingIOError, InterruptedError):
                return got
            except OSError:
                data = b""
            if not data:
                # The client is gone (killed): tear down as for its terminal's hangup,
                # once; nothing more can arrive.
                self.gone = True
                self.stop()
                return got or signal.SIGHUP
            for b in data:
                if b in _RELAYED and not got:
                    got = b

    def _on_sigio(self, _signum: int, _frame: object) -> None:
        signum = self.pending()
        if signum:
            self.interrupt(signum)


def _admit(conn: socket.socket, apply: bool = True) -> tuple[LaunchRequest, list[int]] | None:
    """Receive and check one request (and apply its rlimits); None when refused.

    A refusal is sent and its descriptors closed here. `apply=False` (the
    rehearsal) leaves the process's resource limits alone.
    """
    try:
        conn.settimeout(_REQUEST_TIMEOUT_S)
        body, fds = _recv_request(conn)
    except _Refused as exc:
        _close_all(exc.fds)
        if exc.reason:
            _send(conn, f"R {exc.reason}")
        return None
    except OSError:
        return None
    try:
        req = parse_request(body, len(fds))
        if req.build_id != BUILD_ID:
            raise LaunchRequestError("version")
        import stat

        if not stat.S_ISDIR(os.fstat(fds[3]).st_mode):
            raise LaunchRequestError("cwd is not a directory")
        if apply:
            _apply_rlimits(req.rlimits)
    except (LaunchRequestError, OSError) as exc:
        _close_all(fds)
        _send(conn, f"R {exc}"[:200])
        return None
    conn.settimeout(None)
    return req, fds


def _worker(conn: socket.socket) -> int:
    """Serve one connection in the forked child; returns the status to `_exit` with."""
    admitted = _admit(conn)
    if admitted is None:
        return 0
    req, fds = admitted
    for i in range(3):
        os.dup2(fds[i], i)
    os.fchdir(fds[3])
    _close_all(fds)
    os.umask(req.umask)
    _set_environ(dict(req.env))
    import tempfile

    tempfile.tempdir = None  # gettempdir() caches $TMPDIR: the client's, not the launcher's
    sys.argv = ["corral", *req.argv]
    _send(conn, "A")

    from corral.exec import cli

    watch = _ConnWatch(conn, cli.interrupt)
    watch.install()
    code = _run(req.argv[1:], watch)
    with contextlib.suppress(OSError):
        watch.stop()
    _finish_threads()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        code = 120
    # The client exits on "X": nothing of this worker may still hold its streams.
    null = os.open(os.devnull, os.O_RDWR)
    for i in range(3):
        os.dup2(null, i)
    if not watch.gone:
        _send(conn, f"X {code}")
    return 0


def _set_environ(env: dict[str, str]) -> None:
    """Make os.environ (and the C environment) exactly `env`.

    Only what differs is changed: `os.environ.clear()` pops one item at a
    time through the generic MutableMapping code, and the client's
    environment is mostly the launcher's.
    """
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _run(args: tuple[str, ...], watch: _ConnWatch) -> int:
    from corral.exec.cli import _Interrupted, run_exec

    try:
        early = watch.pending()
        if early:
            return 128 + early
        return run_exec(args)
    except _Interrupted as exc:
        # Before any sandbox existed (while parsing the request's arguments).
        return 128 + exc.signum
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except BaseException:
        # What an uncaught exception does to `corral exec`: a traceback, status 1.
        import traceback

        traceback.print_exc()
        return 1


def _finish_threads() -> None:
    """What the interpreter's shutdown would do for `corral exec`: join threads, run atexit.

    The worker starts with none (`atexit._clear()` after the fork), so every
    one here is its own (egress through the broker registers some).
    """
    import threading

    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    if atexit._ncallbacks():
        atexit._run_exitfuncs()


_PR_SET_NAME = 15
WARM_COMM = "corral-warm"
#: A warm worker's name from its fork until its set-up is done.
WARMING_COMM = "corral-warming"
WORKER_COMM = "corral-worker"


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's prctl, looked up once: the launcher's lookup serves its forks too."""
    import ctypes

    fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return fn


def _set_comm(name: str) -> None:
    """prctl(PR_SET_NAME): how tests and `ps -o comm` tell a warm worker from a serving one."""
    import ctypes

    if _prctl()(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NAME): {os.strerror(err)}")


def _after_fork(socks: list[socket.socket], fds: list[int]) -> None:
    """A new worker's set-up: none of the launcher's descriptors, handlers or exit hooks."""
    signal.set_wakeup_fd(-1)
    for sock in socks:
        sock.close()
    _close_all(fds)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.setsid()
    # The launcher's exit handlers are not the worker's to run.
    atexit._clear()


def _rehearsal_request() -> tuple[bytes, bytes]:
    """A request's header and body as the front end sends them: this process's own
    environment, resource limits and umask, for `corral exec -- true`."""
    import resource

    limits = []
    for res in range(16):
        soft, hard = resource.getrlimit(res)
        soft = -1 if soft == resource.RLIM_INFINITY else soft
        hard = -1 if hard == resource.RLIM_INFINITY else hard
        limits.append(f"{res}:{soft}:{hard}")
    mask = os.umask(0o022)
    os.umask(mask)
    argv = ("exec", "--", "true")
    fields = [BUILD_ID.encode(), f"{mask:o}".encode(), ",".join(limits).encode()]
    fields += [str(len(argv)).encode(), *(a.encode() for a in argv)]
    fields += [name + b"=" + value for name, value in os.environb.items()]
    body = b"".join(f + b"\0" for f in fields)
    return MAGIC + struct.pack("!I", len(body)), body


def _rehearse() -> None:
    """Run a warm worker's request path once on a request of its own, before it waits.

    Every page a request's hand-off, decoding and set-up writes to (reference
    counts of the objects it uses, the allocator's free lists, the
    interpreter's frames) is still shared with the launcher after the fork:
    its first write costs a copy-on-write fault (~2 us each here, ~200 of
    them). Taken here, off the request path. Nothing of it stays: the
    environment is set to itself, no rlimit is applied, every descriptor is
    closed and SIGIO is back to its default. Best effort: a failure only
    means the faults are taken by the request.
    """
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    fds: list[int] = []
    got: socket.socket | None = None
    try:
        # Never blocks: a body beyond the socket's buffer (a huge environment) ends it.
        client.setblocking(False)
        head, body = _rehearsal_request()
        fds = [os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for _ in range(NFDS)]
        socket.send_fds(client, [head], fds)
        _close_all(fds)
        fds = []
        client.sendall(body)
        _Warm(0, mine).hand(server)
        server.close()
        got = _await_handoff(theirs)
        admitted = None if got is None else _admit(got, apply=False)
        if got is None or admitted is None:
            return
        req, fds = admitted
        env = dict(req.env)
        if env == dict(os.environ):  # what it decoded is this process's own: a no-op
            _set_environ(env)
        _send(got, "A")
        watch = _ConnWatch(got, lambda _signum: None)
        watch.install()
        watch.pending()
        watch.stop()
    except Exception:
        return
    finally:
        signal.signal(signal.SIGIO, signal.SIG_DFL)
        _close_all(fds)
        for sock in (client, server, mine, theirs, got):
            if sock is not None:
                sock.close()


def _await_handoff(handoff: socket.socket) -> socket.socket | None:
    """The connection the launcher hands this warm worker, or None when the launcher is gone."""
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(handoff, 1, 1)
    except OSError:
        return None
    finally:
        handoff.close()
    if not fds:
        return None  # EOF: the launcher exited (or retired this worker)
    return socket.socket(fileno=fds[0])


class _Warm:
    """The launcher's side of a warm worker: its pid and the socketpair end it waits on."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    def hand(self, conn: socket.socket) -> bool:
        """Pass `conn` on; False when the worker cannot take it (it died)."""
        try:
            socket.send_fds(self.sock, [b"c"], [conn.fileno()])
        except OSError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


# --- the launcher process --------------------------------------------------------------------


#: What `corral exec` imports (measured: the modules a worker still imported when this
#: list was shorter), egress and journal paths included: a module first imported in a
#: worker is imported again by every worker. pydantic (the broker's config) is the
#: largest: 0.35-0.45 s per `--allow` exec from a cold interpreter.
_PREIMPORT = (
    "corral.exec.cli", "corral.exec.compose", "corral.exec.sockdirs",
    "corral.sandbox.backend_config", "corral.sandbox.namespace", "corral.sandbox.nodns",
    "corral.sandbox.protect", "corral.sandbox.reaper", "corral.sandbox.seccomp",
    "corral.sandbox.setid", "corral.sandbox.initbin", "corral.sandbox.kaudit",
    "corral.sandbox.landlock", "corral.sandbox.layers", "corral.sandbox.netns",
    "corral.sandbox.placement", "corral.sandbox.uids", "corral.sandbox.unix_supervisor",
    "corral.sandbox.terminal", "corral.sandbox.prewarm", "corral.sandbox.prefork",
    "corral.broker.actions", "corral.broker.attach", "corral.broker.config",
    "corral.broker.credentials", "corral.broker.hosts", "corral.broker.journal",
    "corral.broker.kernel_denials", "corral.broker.policy", "corral.broker.privdir",
    "corral.broker.proxy_env", "corral.broker.resident", "corral.broker.tcp",
    "corral.broker.tls_setup", "corral.broker.unix_journal", "corral.broker.wire",
    "corral.sqlrows", "_sha256", "encodings.ascii", "resource",
)  # fmt: skip


def _preimport() -> None:
    """Load `_PREIMPORT` once for every worker, then freeze the heap for the forks.

    gc.freeze(): a collection in a worker would otherwise touch (and so copy,
    page by page) every object the launcher holds: ~11 ms of CPU per fork.
    """
    import gc
    from importlib import import_module

    for name in _PREIMPORT:
        import_module(name)
    # The seccomp program, kept by `cached_bpf` with its files' identities: a
    # worker then checks two stats instead of reading, hashing and validating
    # it. Best effort: a request that finds no program makes it and says why not.
    with contextlib.suppress(Exception):
        from corral.sandbox import namespace, seccomp

        seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, namespace.cache_dir())
    gc.collect()
    gc.freeze()


def _reap(children: set[int]) -> list[int]:
    """Reap every exited child (workers and a warm worker alike); returns their pids."""
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return reaped
        if pid == 0:
            return reaped
        children.discard(pid)
        reaped.append(pid)


def _same_socket(path: Path, ident: tuple[int, int]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def serve(path: Path, *, idle_s: float = 300.0, ready_fd: int | None = None) -> int:
    """Run the launcher on `path` until idle for `idle_s`, stale, or SIGTERM; returns a status.

    Status 1 when another launcher already serves `path` (a lost start race).
    """
    from corral.broker.privdir import make_private_dirs, peer_uid, short_path

    watch = TreeWatch()
    _preimport()
    make_private_dirs(path.parent)
    lock = os.open(
        path.parent / (path.name + ".lock"),
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        with short_path(path) as where:
            lsock.bind(where)
    finally:
        os.umask(old)
    st = os.lstat(path)
    ident = (st.st_dev, st.st_ino)
    lsock.listen(64)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    stopping: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, f"{os.getpid()}\n".encode())
        os.close(ready_fd)
    children: set[int] = set()
    warm: _Warm | None = None
    rewarm = True
    launcher_pid = os.getpid()
    with open("/proc/self/comm", encoding="utf-8", errors="replace") as fh:
        launcher_comm = fh.read().strip()
    idle_since = time.monotonic()

    def fork_worker(
        client: socket.socket | None,
        handoff: socket.socket | None = None,
        handoff_peer: socket.socket | None = None,
    ) -> int:
        """Fork a worker for `client`, or a warm one that waits on `handoff` for its connection."""
        sys.stdout.flush()
        sys.stderr.flush()
        if handoff is None:
            pid = os.fork()
        else:
            # Born with a name (comm is copied at fork): no observer ever sees
            # an unnamed warm worker and takes it for a serving one.
            _set_comm(WARMING_COMM)
            try:
                pid = os.fork()
            finally:
                if os.getpid() == launcher_pid:
                    _set_comm(launcher_comm)
        if pid:
            return pid
        status = 0
        try:
            # The launcher's ends of the socketpairs too: a warm worker must see EOF
            # once the launcher is gone, however it went.
            socks = [lsock, *(s.sock for s in (warm,) if s is not None)]
            _after_fork(socks + ([handoff_peer] if handoff_peer else []), [lock, wake_r, wake_w])
            watch.close()
            if client is not None:
                _set_comm(WORKER_COMM)
                status = _worker(client)
            elif handoff is not None:
                from corral.sandbox import prewarm

                prewarm.prepare()
                _rehearse()
                from corral.exec import cli

                # The exec path's checks too (`cli.rehearse`); nothing of it is kept.
                cli.rehearse()
                _set_comm(WARM_COMM)
                got = _await_handoff(handoff)
                if got is None:
                    prewarm.discard()
                else:
                    _set_comm(WORKER_COMM)
                    status = _worker(got)
                    prewarm.discard()  # a request that started no sandbox
        except BaseException:
            status = 1
        finally:
            os._exit(status)

    def spawn_warm() -> _Warm | None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            pid = fork_worker(None, theirs, mine)
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        return _Warm(pid, mine)

    try:
        while not stopping:
            for pid in _reap(children):
                if warm is not None and pid == warm.pid:
                    # Died unused: no new one until a request comes (no fork loop).
                    warm.close()
                    warm = None
                    rewarm = False
            if children:
                idle_since = time.monotonic()
            elif warm is None and rewarm and not watch.changed():
                # Only while nothing is served: a warm fork competes for the CPU otherwise.
                warm = spawn_warm()
            remaining = idle_s - (time.monotonic() - idle_since)
            if remaining <= 0:
                break
            try:
                readable, _, _ = select.select([lsock.fileno(), wake_r], [], [], remaining)
            except InterruptedError:
                continue
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            if lsock.fileno() not in readable:
                continue
            try:
                conn, _ = lsock.accept()
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EINTR):
                    continue
                raise
            idle_since = time.monotonic()
            rewarm = True
            with conn:
                if peer_uid(conn) != os.getuid():
                    continue  # refused: no reply, no worker
                if watch.changed():
                    # Make way for a launcher running the new code, then say so.
                    if _same_socket(path, ident):
                        with contextlib.suppress(OSError):
                            os.unlink(path)
                    os.close(lock)
                    lock = -1
                    _send(conn, "R stale")
                    break
                if warm is not None:
                    handed = warm.hand(conn)
                    warm.close()
                    if handed:
                        children.add(warm.pid)
                        warm = None
                        continue
                    warm = None  # it died: reaped by the loop
                try:
                    pid = fork_worker(conn)
                except OSError as exc:
                    # Nothing ran: the client runs the Python CLI instead.
                    _send(conn, f"R cannot fork: {exc.strerror}")
                    continue
                children.add(pid)
    finally:
        if warm is not None:
            # Unused: it sees EOF and exits without serving.
            warm.close()
        if _same_socket(path, ident):
            with contextlib.suppress(OSError):
                os.unlink(path)
        lsock.close()
        watch.close()
        if lock >= 0:
            os.close(lock)
    return 0


def start_in_background(path: Path | None = None, idle_s: float = 300.0) -> None:
    """Start a detached launcher for the next `corral exec` (does not wait for it)."""
    import subprocess

    from corral.broker.privdir import make_private_dirs

    path = path or launcher_socket()
    try:
        make_private_dirs(path.parent)
        log = os.open(
            path.parent / "launcher.log",
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
    except (OSError, CorralError):
        return
    try:
        argv = [sys.executable, "-I", "-c", _BOOT, _SOURCE_ROOT, "--socket", str(path)]
        argv += ["--idle-s", f"{idle_s:g}"]
        # A new session: no terminal's signals reach it; it outlives this exec
        # until idle. Its cwd is / so it holds no directory busy.
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
        popen.returncode = 0  # never waited for: it outlives this process
    except OSError:
        pass
    finally:
        os.close(log)


def main(argv: list[str]) -> int:
    """`python -c BOOT SRC --socket PATH [--idle-s N] [--ready-fd FD]`."""
    path: Path | None = None
    idle_s = 300.0
    ready_fd: int | None = None
    it = iter(argv)
    for word in it:
        value = next(it, None)
        if value is None:
            sys.stderr.write(f"corral launcher: {word} needs a value\n")
            return 2
        if word == "--socket":
            path = Path(value)
        elif word == "--idle-s":
            idle_s = float(value)
        elif word == "--ready-fd":
            ready_fd = int(value)
        else:
            sys.stderr.write(f"corral launcher: unknown option {word}\n")
            return 2
    if path is None:
        sys.stderr.write("corral launcher: --socket PATH is required\n")
        return 2
    try:
        return serve(path, idle_s=idle_s, ready_fd=ready_fd)
    except (OSError, CorralError) as exc:
        sys.stderr.write(f"corral launcher: {exc}\n")
        return 125


def start_private(
    path: Path, *, idle_s: float = 300.0, timeout_s: float = 60.0
) -> subprocess.Popen[bytes]:
    """Start a launcher on `path` (its directory already private) and wait until it
    listens. For callers that own its lifetime (`corral verify --backend fastpath`
    terminates and reaps it): it is not detached into the background."""
    import subprocess

    ready_r, ready_w = os.pipe()
    try:
        argv = [sys.executable, "-I", "-c", _BOOT, _SOURCE_ROOT, "--socket", str(path)]
        argv += ["--idle-s", f"{idle_s:g}", "--ready-fd", str(ready_w)]
        proc = subprocess.Popen(
            argv,
            pass_fds=(ready_w,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
        )
        os.close(ready_w)
        ready_w = -1
        got = b""
        if select.select([ready_r], [], [], timeout_s)[0]:
            got = os.read(ready_r, 64)
        if got.strip() != str(proc.pid).encode():
            proc.kill()
            proc.wait()
            raise LaunchRequestError(f"the launcher did not start on {path}")
        return proc
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
