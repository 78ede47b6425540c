"""The resident broker: one warm process serving many sandboxes (I/O shell).

`python -m corral.broker resident --socket PATH` binds a host-private control
socket (0600 in a 0700 directory, `control.bind_control_socket`) and serves
*attachments*. A client (`broker/resident.py`) sends, on one connection, one
request with the sandbox's listening socket attached (SCM_RIGHTS) and closes
its own copy; from then on this process holds the only reference, as a
cold broker would:

    u32 length, JSON {"op": "attach", "config": BrokerConfig JSON, "journal": PATH,
                      "run", "session", "env", "control": PATH | null, "environ": {...}}
    <- one JSON line {"ok": true, "pid", "listen", "journal"} | {"ok": false, "error"}
    ... the connection stays open while the sandbox runs ...
    client SHUT_WR (detach) or dies -> listener shut, connections cut, journal
    flushed -> {"ok": true, "stopped": true} -> close.

Each attachment has its own listener, policy, journal and identity; the
identity comes from the request on the host-private socket, never from the
sandbox, so a sandbox cannot be journaled as another one: whatever arrives on
a listener is decided and attributed by that listener's attachment alone.
Every connection's SO_PEERCRED uid must be this process's own.

Death (SIGKILL included) closes every listener and every tunnel at once; each
client sees EOF on its attachment connection. After `idle_s` with no
attachment the process removes its socket and exits, so nothing outlives its
last sandbox by more than that.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import ssl
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.broker.actions import Identity, Observation, ProcessEvent
from corral.broker.config import BrokerConfig
from corral.broker.control import ControlServer, bind_control_socket
from corral.broker.journal import GroupCommitJournal, Journal
from corral.broker.pauseloop import PausableEventLoop
from corral.broker.pgjournal import open_journal
from corral.broker.policy import Policy
from corral.broker.privdir import peer_uid
from corral.broker.proxy import BrokerState, ProxyServer
from corral.broker.server import _describe, _tls_context, prepare
from corral.errors import BrokerError, ConfigError, CorralError

__all__ = ["MAX_REQUEST", "ResidentOptions", "serve_resident"]

#: An attach request (the config and the caller's environment) is at most this long.
MAX_REQUEST = 4 << 20
_ENVS = ("exec", "agent", "product", "verifier")


@dataclass(frozen=True, slots=True)
class ResidentOptions:
    """What `python -m corral.broker resident` was asked to do."""

    socket: Path
    idle_s: float = 30.0
    ready_fd: int | None = None
    pauses: str | None = None
    """A run's pauses file: the resident of that run keeps its timers on the run's clock."""


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _recvmsg(sock: socket.socket, n: int) -> tuple[bytes, list[int]]:
    # asyncio has no recvmsg: wait for readability, then read without blocking.
    loop = asyncio.get_running_loop()
    fds = array.array("i")
    while True:
        try:
            data, ancdata, _flags, _addr = sock.recvmsg(n, socket.CMSG_SPACE(4 * fds.itemsize))
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
            continue
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        return data, list(fds)


class _Attachment:
    """One sandbox's listener, served until its client detaches or dies."""

    def __init__(self, conn: socket.socket, resident: _Resident) -> None:
        self.conn = conn
        self.resident = resident

    async def run(self) -> None:
        fds: list[int] = []
        try:
            head, fds = await _recvmsg(self.conn, 4)
            if len(head) != 4:
                return
            (length,) = struct.unpack("!I", head)
            if length > MAX_REQUEST:
                await self._reply({"ok": False, "error": "request too long"})
                return
            body = bytearray()
            while len(body) < length:
                chunk, more = await _recvmsg(self.conn, min(1 << 16, length - len(body)))
                fds += more
                if not chunk:
                    return
                body += chunk
            await self._serve(bytes(body), fds)
            fds = []
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _reply(self, payload: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            await loop.sock_sendall(self.conn, (json.dumps(payload) + "\n").encode())

    async def _serve(self, body: bytes, fds: list[int]) -> None:
        if len(fds) != 1:
            await self._reply(
                {"ok": False, "error": f"expected one listening socket, got {len(fds)}"}
            )
            return
        try:
            lsock = socket.socket(fileno=fds[0])
        except OSError as exc:
            os.close(fds[0])
            await self._reply({"ok": False, "error": f"not a socket: {exc}"})
            return
        journal: Journal | None = None
        control_sock: socket.socket | None = None
        control_path: Path | None = None
        try:
            try:
                request = json.loads(body)
                if not isinstance(request, dict) or request.get("op") != "attach":
                    raise ConfigError("not an attach request")
                if not lsock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    raise BrokerError("the socket is not listening")
                env = request.get("env", "exec")
                if env not in _ENVS:
                    raise ConfigError(f"unknown environment kind {env!r}")
                environ = request.get("environ") or {}
                if not isinstance(environ, dict):
                    raise ConfigError("environ must be an object")
                config = BrokerConfig.from_json(str(request["config"]))
                caller_env = {str(k): str(v) for k, v in environ.items()}
                prepared = prepare(config, caller_env, self.resident.tls)
                identity = Identity(run=request.get("run"), session=request.get("session"), env=env)
                journal_path = Path(str(request["journal"]))
                # As a broker process of the caller would: a fleet worker's
                # environment names the shared journal every row also goes to.
                journal = open_journal(journal_path, config.journal_synchronous, caller_env)
                if request.get("control") is not None:
                    control_path = Path(str(request["control"]))
                    control_sock = bind_control_socket(control_path)
            except (CorralError, OSError, ValueError, KeyError, TypeError) as exc:
                await self._reply({"ok": False, "error": str(exc) or type(exc).__name__})
                return
            lsock.setblocking(False)
            state = prepared.state(GroupCommitJournal(journal), identity, [lsock])
            await self._serve_state(
                config=config,
                state=state,
                lsock=lsock,
                journal_path=journal_path,
                control_sock=control_sock,
                control_path=control_path,
            )
        finally:
            lsock.close()
            if control_sock is not None and control_path is not None:
                control_sock.close()
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(os.lstat(control_path).st_mode):
                        os.unlink(control_path)
            if journal is not None:
                journal.close()

    async def _serve_state(
        self,
        *,
        config: BrokerConfig,
        state: BrokerState,
        lsock: socket.socket,
        journal_path: Path,
        control_sock: socket.socket | None,
        control_path: Path | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        failures: list[BaseException] = []
        gone = asyncio.Event()

        def fatal(exc: BaseException) -> None:
            failures.append(exc)
            gone.set()

        server = ProxyServer(state, fatal)
        listen = [_describe(lsock)]
        pid = os.getpid()
        await state.journal.append(
            Observation.of(
                ProcessEvent(event="broker_start", pid=pid, name="corral-broker"),
                state.identity,
                decision="observe",
                rule=None,
                reason="broker started",
                detail={
                    "config_sha256": hashlib.sha256(config.to_json().encode()).hexdigest(),
                    "listen": listen,
                    "rules": [r.id for r in config.rules],
                    "routes": sorted(config.routes),
                    "tcp": [t.id for t in config.tcp],
                    "host_services": {h.name: h.port for h in config.host_services},
                    "resident": True,
                    # A run's resident runs on the run's clock (`pauseloop`).
                    **({"pauses": loop.pauses_path} if isinstance(loop, PausableEventLoop) else {}),
                },
            )
        )
        control: ControlServer | None = None
        if control_sock is not None and control_path is not None:
            hooks = state.policy.hooks

            def apply(new: BrokerConfig) -> None:
                state.policy = Policy.from_config(new, hooks)

            control = ControlServer(
                control_sock,
                control_path,
                config=config,
                apply=apply,
                journal=state.journal,
                identity=state.identity,
                journal_path=journal_path,
            )
            await control.start()
        server.start([lsock])
        await self._reply({"ok": True, "pid": pid, "listen": listen, "journal": str(journal_path)})

        async def until_detached() -> None:
            # Any byte or EOF from the client ends the attachment: it has
            # nothing more to say once attached.
            with contextlib.suppress(OSError):
                await loop.sock_recv(self.conn, 1)
            gone.set()

        watcher = asyncio.create_task(until_detached())
        stopping = asyncio.create_task(self.resident.stopping.wait())
        waiter = asyncio.create_task(gone.wait())
        await asyncio.wait({waiter, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (watcher, stopping, waiter):
            task.cancel()
        if control is not None:
            await control.aclose()
        await server.stop_accepting()
        # Refuse new connections at once, before in-flight ones are cut.
        with contextlib.suppress(OSError):
            lsock.shutdown(socket.SHUT_RDWR)
        await server.aclose()
        lsock.close()
        reason = f"broker stopped: listener failed: {failures[0]}" if failures else "broker stopped"
        with contextlib.suppress(Exception):
            await state.journal.append(
                Observation.of(
                    ProcessEvent(event="broker_stop", pid=pid, name="corral-broker"),
                    state.identity,
                    decision="observe",
                    rule=None,
                    reason=reason,
                )
            )
        state.journal.flush()
        await self._reply({"ok": True, "stopped": True, "failed": bool(failures)})


class _Resident:
    def __init__(self, options: ResidentOptions) -> None:
        self.options = options
        self.stopping = asyncio.Event()
        self.active = 0
        self._tls: dict[tuple[str | None, bool], ssl.SSLContext] = {}

    def tls(self, config: BrokerConfig) -> ssl.SSLContext:
        # Loading the host's CA store costs milliseconds per sandbox; the
        # context is not modified after creation, so attachments share it.
        key = (config.upstream_tls.ca_bundle, config.upstream_tls.verify)
        ctx = self._tls.get(key)
        if ctx is None:
            ctx = self._tls[key] = _tls_context(config)
        return ctx

    async def handle(self, conn: socket.socket) -> None:
        self.active += 1
        try:
            if peer_uid(conn) != os.getuid():
                return
            await _Attachment(conn, self).run()
        except (OSError, CorralError) as exc:
            print(f"corral broker: attachment failed: {exc}", file=sys.stderr)
        finally:
            conn.close()
            self.active -= 1

    async def main(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        tasks: set[asyncio.Task[None]] = set()

        async def accept() -> None:
            while True:
                conn, _ = await loop.sock_accept(lsock)
                conn.setblocking(False)
                task = asyncio.create_task(self.handle(conn))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        acceptor = asyncio.create_task(accept())
        _write_ready(
            self.options.ready_fd, {"pid": os.getpid(), "socket": str(self.options.socket)}
        )
        idle_since = loop.time()
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=0.2)
            if self.active or tasks:
                idle_since = loop.time()
            elif loop.time() - idle_since >= self.options.idle_s:
                break
        # Unlink first: a client arriving now spawns a fresh resident instead
        # of queueing on a socket nobody will accept from.
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(self.options.socket).st_mode):
                os.unlink(self.options.socket)
        acceptor.cancel()
        with contextlib.suppress(OSError):
            lsock.shutdown(socket.SHUT_RDWR)
        self.stopping.set()
        await asyncio.gather(acceptor, *tasks, return_exceptions=True)


def _write_ready(fd: int | None, payload: dict[str, Any]) -> None:
    if fd is None:
        return
    view = memoryview(("ready " + json.dumps(payload) + "\n").encode())
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


def serve_resident(options: ResidentOptions) -> int:
    """Serve attachments until idle or SIGTERM; the exit status (1: cannot start)."""
    try:
        lsock = bind_control_socket(options.socket)
    except (CorralError, OSError) as exc:
        print(f"corral broker: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        # The socket file is removed by main() before it stops accepting; a
        # file left by a crash is replaced by the next bind (nothing answers it).
        from corral.broker.pauseloop import loop_factory

        with asyncio.Runner(loop_factory=loop_factory(options.pauses)) as runner:
            runner.run(_Resident(options).main(lsock))
    finally:
        lsock.close()
    return 0
