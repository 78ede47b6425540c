"""The broker's control channel: live rule changes from the host user only (I/O shell).

A broker started with `--control PATH` listens on a pathname unix socket in
a host-private directory (mode 0700, owned by the broker's uid, never bound
into a sandbox: the run's `control/` directory, or a per-user runtime
directory for `corral exec --run ID`). The socket is 0600 and, whatever the
file modes end up being, every connection's SO_PEERCRED uid must be the
broker's own: a connection from any other uid is refused and journaled.

One request per connection, one JSON line each way (at most 64 KiB):

    {"op": "add_rule", "rule": {RuleConfig}, "proposal": "<id>" | null}
    {"ok": true, "journal_id": N, "rule": "<rule id>"}   /   {"ok": false, "error": "..."}
    {"op": "info"} -> {"ok": true, "journal": PATH, "run", "session", "env", "rules": [ids]}

A change is journaled (kind `policy`, the peer's uid and user name, the
rule) and committed *before* the broker's policy is swapped, so no request
is ever decided by a rule the journal does not show. The next request is
decided by the new policy; connections in flight keep the decision they got.

The socket is removed when the broker stops (SIGTERM, or the parent's death
through PR_SET_PDEATHSIG). A SIGKILLed broker leaves the file, but nothing
listens on it: a connect is refused, and the next bind at that path (or
`corral allow`) removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import socket
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.broker.actions import Identity, Observation
from corral.broker.config import BrokerConfig, RuleConfig
from corral.broker.journal import GroupCommitJournal
from corral.broker.livepolicy import rule_id
from corral.broker.privdir import check_private_dir, make_private_dirs, peer_uid, short_path
from corral.errors import BrokerError

__all__ = [
    "MAX_MESSAGE",
    "ControlServer",
    "bind_control_socket",
    "check_private_dir",
    "exec_control_dir",
    "request",
    "run_control_dir",
    "socket_name",
]

MAX_MESSAGE = 64 << 10
_TIMEOUT_S = 10.0
_RUN_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def run_control_dir(run_root: Path) -> Path:
    """Where a `corral run` run's brokers put their control sockets."""
    return run_root / "control"


def exec_control_dir(run_id: str) -> Path:
    """Where `corral exec --run ID`'s broker puts its control socket (per host user)."""
    if not _RUN_ID.match(run_id):
        raise BrokerError(f"run id {run_id!r} cannot name a control directory")
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) if runtime.startswith("/") else Path(tempfile.gettempdir())
    return base / f"corral-{os.getuid()}" / "exec" / run_id


def socket_name(session: str | None, env: str) -> str:
    """A control socket's file name for one broker of a run."""
    stem = _UNSAFE.sub("_", session or "run")[:64]
    return f"{stem}-{env}.sock"


def bind_control_socket(path: Path) -> socket.socket:
    """A listening 0600 unix socket at `path` in a private directory (stale file replaced)."""
    make_private_dirs(path.parent)
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise BrokerError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with short_path(path) as where:
                probe.connect(where)
        except ConnectionRefusedError:
            # A SIGKILLed broker's leftover: nothing listens on it.
            os.unlink(path)
        else:
            raise BrokerError(f"{path}: another broker is listening")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        with short_path(path) as where:
            sock.bind(where)
    except OSError as exc:
        sock.close()
        raise BrokerError(f"cannot bind control socket {path}: {exc}") from exc
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(8)
    sock.setblocking(False)
    return sock


class ControlServer:
    """Serves the control socket inside the broker's event loop.

    `config` is the broker's current configuration and `apply(config)` makes
    a new one effective (the caller recompiles the policy); both live in the
    server so that each change builds on the last.
    """

    def __init__(
        self,
        sock: socket.socket,
        path: Path,
        *,
        config: BrokerConfig,
        apply: Callable[[BrokerConfig], None],
        journal: GroupCommitJournal,
        identity: Identity,
        journal_path: Path,
    ) -> None:
        self._sock = sock
        self._path = path
        self._ino = os.stat(path).st_ino
        self.config = config
        self._apply = apply
        self._journal = journal
        self._identity = identity
        self._journal_path = journal_path
        self._server: asyncio.Server | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, sock=self._sock)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._sock.close()
        self.unlink()

    def unlink(self) -> None:
        """Remove the socket file if it is still this server's."""
        with contextlib.suppress(OSError):
            if os.lstat(self._path).st_ino == self._ino:
                os.unlink(self._path)

    def _row(self, uid: int, decision: str, reason: str, detail: dict[str, Any]) -> Observation:
        return Observation(
            run=self._identity.run,
            session=self._identity.session,
            env=self._identity.env,
            kind="policy",
            target=str(detail.get("rule_id", "control")),
            decision="observe" if decision == "observe" else "deny",
            rule=None if decision == "observe" else "control-peer",
            reason=reason,
            detail={"uid": uid, "user": _user_name(uid), **detail},
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw_sock = writer.get_extra_info("socket")
            uid = peer_uid(raw_sock)
            if uid != os.getuid():
                await self._journal.append(
                    self._row(uid, "deny", f"control connection from uid {uid} refused", {})
                )
                await self._reply(writer, {"ok": False, "error": "permission denied"})
                return
            line = await asyncio.wait_for(reader.readline(), _TIMEOUT_S)
            if len(line) > MAX_MESSAGE or not line.endswith(b"\n"):
                await self._reply(writer, {"ok": False, "error": "request too long or cut"})
                return
            await self._reply(writer, await self._handle(uid, line))
        except Exception as exc:  # every failure leaves the policy as it was
            with contextlib.suppress(Exception):
                await self._reply(writer, {"ok": False, "error": str(exc)[:500]})
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, uid: int, line: bytes) -> dict[str, Any]:
        try:
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("op") == "info":
                return {
                    "ok": True,
                    "journal": str(self._journal_path),
                    "run": self._identity.run,
                    "session": self._identity.session,
                    "env": self._identity.env,
                    "rules": [r.id for r in self.config.rules],
                }
            if not isinstance(msg, dict) or msg.get("op") != "add_rule":
                return {"ok": False, "error": "unknown request"}
            rule = RuleConfig.model_validate(msg.get("rule"))
        except ValueError as exc:
            return {"ok": False, "error": f"bad request: {str(exc).splitlines()[0]}"}
        if rule.effect != "allow":
            return {"ok": False, "error": "live rules only allow"}
        proposal = msg.get("proposal")
        async with self._lock:
            if any(r.id == rule.id for r in self.config.rules):
                return {"ok": True, "journal_id": None, "rule": rule.id, "already": True}
            try:
                new = self.config.model_copy(update={"rules": (*self.config.rules, rule)})
                new = BrokerConfig.model_validate(new.model_dump())
            except ValueError as exc:
                return {"ok": False, "error": f"rule rejected: {str(exc).splitlines()[0]}"}
            detail = {
                "op": "add_rule",
                "rule_id": rule.id,
                "rule_hash": rule_id(rule),
                "rule": rule.model_dump(mode="json"),
                "proposal": proposal if isinstance(proposal, str) else None,
            }
            who = _user_name(uid)
            # Durable before effective: a journal that cannot take the row
            # leaves the policy as it was.
            obs_id = await self._journal.append(
                self._row(uid, "observe", f"rule {rule.id} added by {who} (uid {uid})", detail)
            )
            self._apply(new)
            self.config = new
        return {"ok": True, "journal_id": obs_id, "rule": rule.id}

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        writer.write(json.dumps(body).encode() + b"\n")
        await asyncio.wait_for(writer.drain(), _TIMEOUT_S)


def request(path: Path, body: dict[str, Any], timeout_s: float = _TIMEOUT_S) -> dict[str, Any]:
    """Send one control request and return the broker's answer (BrokerError if unreachable)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        with short_path(path) as where:
            sock.connect(where)
        with contextlib.suppress(BrokenPipeError):
            # A refusing broker answers and closes before reading; its answer is queued.
            sock.sendall(json.dumps(body).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n") and len(buf) <= MAX_MESSAGE:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    except OSError as exc:
        raise BrokerError(f"broker control {path}: {exc.strerror or exc}") from exc
    finally:
        sock.close()
    try:
        answer = json.loads(buf)
    except ValueError as exc:
        raise BrokerError(f"broker control {path}: unreadable answer") from exc
    if not isinstance(answer, dict):
        raise BrokerError(f"broker control {path}: unreadable answer")
    return answer
