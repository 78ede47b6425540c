"""Attaching a sandbox's listener to the resident broker (the launcher's side).

A cold broker is a fresh interpreter per sandbox that spends 0.35-0.7 s
importing before it listens; the resident broker (`resident_server.py`) is
started once per host user, lazily, and serves each sandbox on that
sandbox's own listening socket with that sandbox's own policy and journal.

    att = attach_resident(lsock, config_json, journal, run=..., session=..., env=...)
    lsock.close()          # after the reply: the broker holds the only copy
    ...
    att.alive()            # False once the resident died (EOF on the attachment)
    att.detach()           # listener shut, journal flushed; False if it had died

Kept free of pydantic and of the broker's server modules: this runs on
`corral exec`'s start path. The environment goes along with the request
(over the 0600, SO_PEERCRED-checked socket), so `env:NAME` secrets are read
from the launcher's environment exactly as a cold broker would read its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral.broker.privdir import make_private_dirs, peer_uid, short_path
from corral.errors import BrokerError

__all__ = ["Attachment", "attach_resident", "resident_socket"]

_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = (
    "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module('corral.broker', run_name='__main__', alter_sys=True)"
)


def resident_socket() -> Path:
    """The per-user resident broker's control socket (in a 0700 directory).

    Named after this corral's source tree and interpreter: a launcher never
    hands its sandboxes to a resident running other code (an older install,
    another checkout).
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) if runtime.startswith("/") else Path(tempfile.gettempdir())
    code = f"{_SOURCE_ROOT}\0{sys.executable}\0{_code_stamp()}".encode()
    tag = hashlib.sha256(code).hexdigest()[:16]
    return base / f"corral-{os.getuid()}" / "broker" / f"resident-{tag}.sock"


def _code_stamp() -> str:
    # Edits to the broker's code (a git checkout, an upgrade) change the
    # directory's mtime only for added/removed files; the files' own mtimes
    # catch edits in place.
    here = Path(__file__).resolve().parent
    try:
        return str(max(p.stat().st_mtime_ns for p in here.glob("*.py")))
    except (OSError, ValueError):
        return "0"


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with short_path(path) as where:
            sock.connect(where)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise BrokerError(f"resident broker {path}: {exc.strerror or exc}") from exc
    if peer_uid(sock) != os.getuid():
        # The directory is private, so this means it was tampered with.
        sock.close()
        raise BrokerError(f"resident broker {path} is not run by uid {os.getuid()}")
    return sock


def _spawn(path: Path, idle_s: float, timeout_s: float, pauses: str | None = None) -> None:
    """Start a resident broker detached from the caller and wait until it listens.

    `pauses`: a run's pauses file, for a resident of that run (frozen with it):
    its timers then stop while the run is paused, as a session broker's do.
    """
    log = path.parent / "resident.log"
    ready_r, ready_w = os.pipe()
    argv = [sys.executable, "-I", "-c", _BOOT, _SOURCE_ROOT, "resident", "--socket", str(path)]
    argv += ["--idle-s", f"{idle_s:g}", "--ready-fd", str(ready_w)]
    if pauses is not None:
        argv += ["--pauses", pauses]
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            # A new session: no terminal's signals reach it, and it is nobody's
            # PR_SET_PDEATHSIG child: it outlives the exec that started it
            # until it has been idle for idle_s.
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=fd,
                pass_fds=(ready_w,),
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(fd)
    except OSError as exc:
        os.close(ready_r)
        os.close(ready_w)
        raise BrokerError(f"cannot start the resident broker: {exc}") from exc
    os.close(ready_w)
    try:
        deadline = time.monotonic() + timeout_s
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                popen.kill()
                raise BrokerError(f"resident broker not ready after {timeout_s:.1f}s (see {log})")
            readable, _, _ = select.select([ready_r], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(ready_r, 4096)
            if not chunk:
                status = popen.wait(5.0)
                if status == 1:
                    # Lost a race to another launcher's resident: use that one.
                    return
                raise BrokerError(f"resident broker exited with status {status} (see {log})")
            buffer += chunk
    finally:
        os.close(ready_r)
    # The process lives on as the caller's child until the caller exits; mark
    # the Popen as done so that its finalizer neither waits nor warns.
    popen.returncode = 0


def _run_pauses(config_json: str, socket_path: Path | None) -> str | None:
    """The pauses file named in the config, for a run's own resident only (the
    per-user one serves sandboxes of many runs, and none of them freezes it)."""
    if socket_path is None:
        return None
    try:
        pauses = json.loads(config_json).get("pauses")
    except (ValueError, AttributeError):
        return None
    return pauses if isinstance(pauses, str) and pauses.startswith("/") else None


class Attachment:
    """One sandbox served by the resident broker, until `detach()`."""

    def __init__(self, conn: socket.socket, ready: dict[str, Any]) -> None:
        self._conn: socket.socket | None = conn
        self.pid = int(ready["pid"])
        self.listen: tuple[dict[str, Any], ...] = tuple(ready.get("listen", ()))
        self.journal = str(ready.get("journal", ""))
        self.died = False

    def alive(self) -> bool:
        """Whether the resident still serves this listener (no EOF on the attachment)."""
        if self._conn is None:
            return False
        readable, _, _ = select.select([self._conn], [], [], 0)
        if readable:
            self.died = True
        return not self.died

    def detach(self, timeout_s: float = 10.0) -> bool:
        """Stop serving: listener shut, connections cut, journal flushed.

        True when the resident confirmed; False when it had died (then the
        listener closed with it and the sandbox had no egress since).
        """
        conn, self._conn = self._conn, None
        if conn is None:
            return not self.died
        try:
            if self.died:
                return False
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            line = _read_line(conn, timeout_s)
            if line is None:
                self.died = True
                return False
            return bool(json.loads(line).get("stopped"))
        finally:
            conn.close()


def _read_line(conn: socket.socket, timeout_s: float) -> bytes | None:
    deadline = time.monotonic() + timeout_s
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([conn], [], [], remaining)
        if not readable:
            continue
        try:
            chunk = conn.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        buffer += chunk
    return buffer.split(b"\n", 1)[0]


def _request(conn: socket.socket, body: bytes, listen_fd: int, timeout_s: float) -> bytes | None:
    head = struct.pack("!I", len(body))
    cmsg = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", listen_fd))]
    try:
        sent = conn.sendmsg([head, body], cmsg)
        view = memoryview(head + body)[sent:]
        while view:
            view = view[conn.send(view) :]
    except OSError:
        return None
    return _read_line(conn, timeout_s)


def attach_resident(
    listener: socket.socket,
    config_json: str,
    journal: Path,
    *,
    run: str | None,
    session: str | None,
    env: str,
    control: Path | None = None,
    socket_path: Path | None = None,
    idle_s: float = 30.0,
    timeout_s: float = 15.0,
) -> Attachment:
    """Hand `listener` to the resident broker (starting one if none runs).

    The caller keeps its copy of `listener` until this returns and must close
    it then. Raises BrokerError with the broker's reason when it refuses.
    """
    path = socket_path or resident_socket()
    body = json.dumps(
        {
            "op": "attach",
            "config": config_json,
            "journal": str(journal),
            "run": run,
            "session": session,
            "env": env,
            "control": None if control is None else str(control),
            "environ": dict(os.environ),
        }
    ).encode()
    for _attempt in range(3):
        conn = _connect(path)
        if conn is None:
            try:
                make_private_dirs(path.parent)
            except OSError as exc:
                raise BrokerError(f"resident broker directory {path.parent}: {exc}") from exc
            lock = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                # One launcher spawns; the others wait and use its resident.
                fcntl.flock(lock, fcntl.LOCK_EX)
                conn = _connect(path)
                if conn is None:
                    _spawn(path, idle_s, timeout_s, _run_pauses(config_json, socket_path))
                    conn = _connect(path)
            finally:
                os.close(lock)
            if conn is None:
                continue
        line = _request(conn, body, listener.fileno(), timeout_s)
        if line is None:
            # It stopped (idle, or killed) before answering: start afresh.
            conn.close()
            continue
        reply = json.loads(line)
        if not reply.get("ok"):
            conn.close()
            raise BrokerError(f"broker refused the sandbox: {str(reply.get('error'))[:500]}")
        return Attachment(conn, reply)
    raise BrokerError(f"the resident broker at {path} did not answer")
