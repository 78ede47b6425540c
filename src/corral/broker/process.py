"""Starting and stopping the broker process from the launcher.

    proc = start_broker(config, journal_path, listen_fds=[lsock.fileno()], run="r1")
    lsock.close()                      # the broker must own the only copy
    ready = proc.wait_ready(5.0)       # BrokerError if it failed to start
    env.update(proxy_env(port))        # for the sandbox
    ...
    proc.stop()                        # SIGTERM, journal flushed; SIGKILL after a grace

Fail-closed egress depends on the parent closing its copies of the
listening sockets right after `start_broker`: while another process holds
one, a dead broker's socket keeps accepting connections into its backlog
(they hang instead of being refused).

The configuration travels on the broker's stdin (no file to clean up);
secrets stay in the broker's environment (`env=`), never in the config.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from corral.broker.config import BrokerConfig
from corral.broker.proxy_env import proxy_env
from corral.errors import BrokerError

__all__ = ["BrokerProcess", "ReadyInfo", "broker_argv", "proxy_env", "start_broker"]


@dataclass(frozen=True, slots=True)
class ReadyInfo:
    """What the broker reported when it became ready."""

    pid: int
    listen: tuple[dict[str, Any], ...]
    journal: str

    @property
    def tcp_ports(self) -> tuple[int, ...]:
        return tuple(int(entry["port"]) for entry in self.listen if entry["family"] == "tcp")


_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = (
    "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module('corral.broker', run_name='__main__', alter_sys=True)"
)


def broker_argv(
    journal_path: str | Path,
    *,
    run: str | None = None,
    session: str | None = None,
    env: str = "exec",
    listen_fds: Sequence[int] = (),
    listen: Sequence[str] = (),
    listen_unix: Sequence[str] = (),
    ready_fd: int | None = None,
    parent_pid: int | None = None,
    python: str = sys.executable,
    source: str | None = None,
    control: str | Path | None = None,
) -> list[str]:
    """The command line of a broker that reads its config from stdin (pure).

    `-I` keeps the environment's PYTHONPATH and the cwd off the broker's
    path; `source` (default: where this corral is imported from) is put first
    explicitly, so the broker runs the launcher's own corral, not whichever
    one the interpreter's site-packages point at.
    """
    src = source if source is not None else _SOURCE_ROOT
    argv = [python, "-I", "-c", _BOOT, src, "serve", "--config", "-"]
    argv += ["--journal", str(journal_path), "--env", env]
    if run is not None:
        argv += ["--run", run]
    if session is not None:
        argv += ["--session", session]
    for fd in listen_fds:
        argv += ["--listen-fd", str(fd)]
    for hostport in listen:
        argv += ["--listen", hostport]
    for path in listen_unix:
        argv += ["--listen-unix", path]
    if ready_fd is not None:
        argv += ["--ready-fd", str(ready_fd)]
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    if control is not None:
        argv += ["--control", str(control)]
    return argv


class BrokerProcess:
    """A running broker. Use `wait_ready()` before relying on it; `stop()` to end it."""

    def __init__(self, popen: subprocess.Popen[bytes], ready_fd: int, stderr: IO[bytes]) -> None:
        self._popen = popen
        self._ready_fd: int | None = ready_fd
        self._stderr = stderr
        self._buffer = b""
        self._stderr_final: str | None = None
        self.ready: ReadyInfo | None = None

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        """The exit status, or None while running."""
        return self._popen.poll()

    def stderr_text(self) -> str:
        """What the broker wrote to stderr so far."""
        if self._stderr_final is not None:
            return self._stderr_final
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def wait_ready(self, timeout: float = 10.0) -> ReadyInfo:
        """Block until the broker reports ready; its listening addresses.

        Raises BrokerError (with the broker's stderr) when it exits first or
        does not report within `timeout` - in which case it is killed.
        """
        if self.ready is not None:
            return self.ready
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._ready_fd is None:
                self.kill()
                raise BrokerError(f"broker not ready after {timeout:.1f}s: {self._tail()}")
            readable, _, _ = select.select([self._ready_fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(self._ready_fd, 4096)
            if not chunk:
                self._close_ready()
                status = self._popen.wait(5.0)
                self._release_stderr()
                raise BrokerError(f"broker exited with status {status}: {self._tail()}")
            self._buffer += chunk
        line = self._buffer.split(b"\n", 1)[0].decode("utf-8", "replace")
        self._close_ready()
        if not line.startswith("ready "):
            self.kill()
            raise BrokerError(f"unexpected broker output {line[:200]!r}")
        data = json.loads(line[len("ready ") :])
        self.ready = ReadyInfo(
            pid=int(data["pid"]), listen=tuple(data["listen"]), journal=str(data["journal"])
        )
        return self.ready

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, wait up to `timeout`, then SIGKILL; the exit status."""
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.send_signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
        self._close_ready()
        self._release_stderr()
        return self._popen.returncode

    def kill(self) -> int:
        """SIGKILL now (no flush is needed: acknowledged rows are committed)."""
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()
            self._popen.wait()
        self._close_ready()
        self._release_stderr()
        return self._popen.returncode

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _release_stderr(self) -> None:
        if self._stderr_final is None:
            self._stderr_final = self.stderr_text()
            self._stderr.close()

    def _close_ready(self) -> None:
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None

    def _tail(self) -> str:
        with contextlib.suppress(ValueError, OSError):
            text = self.stderr_text().strip()
            return text[-2000:] or "(no stderr)"
        return "(stderr unavailable)"


def start_broker(
    config: BrokerConfig,
    journal_path: str | Path,
    *,
    run: str | None = None,
    session: str | None = None,
    env: str = "exec",
    listen_fds: Sequence[int] = (),
    listen: Sequence[str] = (),
    listen_unix: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    die_with_parent: bool = True,
    python: str = sys.executable,
    control: str | Path | None = None,
) -> BrokerProcess:
    """Start `python -m corral.broker serve` and return at once.

    `listen_fds` are listening sockets the broker inherits (same numbers);
    close your copies afterwards. `environ` is the broker's environment
    (default: this process's), where `env:NAME` secrets are read. With
    `die_with_parent` the broker gets SIGTERM when the calling *thread* exits
    (PR_SET_PDEATHSIG semantics) - start it from a long-lived thread.
    Raises BrokerError if the process cannot be spawned.
    """
    ready_r, ready_w = os.pipe()
    # Owned by the returned BrokerProcess, which closes it in stop()/kill().
    stderr = tempfile.TemporaryFile(prefix="corral-broker-")  # noqa: SIM115
    argv = broker_argv(
        journal_path,
        run=run,
        session=session,
        env=env,
        listen_fds=listen_fds,
        listen=listen,
        listen_unix=listen_unix,
        ready_fd=ready_w,
        parent_pid=os.getpid() if die_with_parent else None,
        python=python,
        control=control,
    )
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            pass_fds=(ready_w, *listen_fds),
            env=dict(os.environ if environ is None else environ),
            close_fds=True,
        )
    except OSError as exc:
        os.close(ready_r)
        stderr.close()
        raise BrokerError(f"cannot start the broker: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.close(ready_w)
    assert popen.stdin is not None
    try:
        popen.stdin.write(config.to_json().encode())
        popen.stdin.close()
    except OSError:
        # The broker died before reading its config; wait_ready reports why.
        pass
    return BrokerProcess(popen, ready_r, stderr)
