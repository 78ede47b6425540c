"""corral's own per-run work as processes inside the run cgroup (coordinator side).

The synthetic provider parses what the agent posts and report rendering
imports matplotlib over the run's samples; both used to run in the
coordinator, where the kernel charged nothing to the run. Each is now a
`python -m corral.run.helper_main NAME ...` process that

* joins the run's `helpers-<name>` cgroup *before* Python starts (a shell
  prelude writes `0` to each `cgroup.procs`, then execs), so its first
  allocation is charged to the run and a join that fails exits 125 before
  anything runs: `spawn()` then raises HelperError naming the layer;
* dies with the coordinator (PR_SET_PDEATHSIG=SIGKILL, set first thing, then
  a check that the parent did not die before it was in place) and when its
  stdin closes;
* talks to the coordinator in short lines on a pipe, which the coordinator
  reads bounded (`_LINE_MAX`, with a deadline): the helper handles sandbox
  data, so what it says is not trusted to be short or well formed.

The coordinator keeps one `Helper` (a pipe pair and a pid) per helper.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from corral.errors import HelperError
from corral.pauseclock import Clock, Deadline

__all__ = ["Helper", "ProviderHelper", "render_report_in_helper"]

#: The longest line a helper may say; longer is a protocol error.
_LINE_MAX = 4096

#: As host git's prelude (hostgit.py): join, then exec, so no byte of the
#: helper is ever allocated outside the run. Exit 125 when a join fails.
_JOIN = (
    'IFS=:; for f in $CORRAL_JOIN_CGROUPS; do echo 0 > "$f" || exit 125; done; '
    'unset CORRAL_JOIN_CGROUPS IFS; exec "$@"'
)

_URL = re.compile(r"^http://127\.0\.0\.1:[0-9]{1,5}$")
_TOKENS = re.compile(r"^tokens [0-9]{1,18}$")


def _tail(path: Path, limit: int = 600) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit))
            data = fh.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text).strip()


class Helper:
    """One helper process in `helpers-<name>`; use `spawn()`, then `close()`."""

    def __init__(
        self, name: str, proc: subprocess.Popen[bytes], log: Path, clock: Clock = time.monotonic
    ) -> None:
        """`clock`: what `read_line` and `wait` time out on; the run's, which
        stops while the run (and this helper, frozen with it) is paused."""
        self.name = name
        self.proc = proc
        self.log = log
        self.clock = clock
        self._buf = b""

    @classmethod
    def spawn(
        cls,
        name: str,
        args: Sequence[str],
        cgroup_procs: Sequence[str],
        log: Path,
        pass_fds: Sequence[int] = (),
        *,
        clock: Clock = time.monotonic,
    ) -> Helper:
        """Start helper `name` inside the cgroup whose `cgroup.procs` files are given.

        `pass_fds`: descriptors the helper inherits (a control socket).
        Raises HelperError when there is no cgroup to join (the helper would
        run uncharged: refused) or the process cannot start.
        """
        if not cgroup_procs:
            raise HelperError(f"layer run cgroup: the {name} helper has no run cgroup to join")
        if any(":" in p for p in cgroup_procs):
            raise HelperError(f"layer run cgroup: cannot join {cgroup_procs!r}")
        env = dict(os.environ)
        env["CORRAL_JOIN_CGROUPS"] = ":".join(cgroup_procs)
        argv = [
            "/bin/sh",
            "-c",
            _JOIN,
            f"corral-helper-{name}",
            sys.executable,
            "-m",
            "corral.run.helper_main",
            name,
            str(os.getpid()),
            *args,
        ]
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log.open("ab") as err:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    close_fds=True,
                    pass_fds=tuple(pass_fds),
                )
        except OSError as exc:
            raise HelperError(f"the {name} helper could not start: {exc}") from exc
        return cls(name, proc, log, clock)

    def poll(self) -> int | None:
        return self.proc.poll()

    def failure(self, code: int) -> HelperError:
        """The error for a helper that ended with `code` (125: it could not join)."""
        if code == 125:
            why = f"layer run cgroup: the {self.name} helper could not join the run cgroup"
        elif code < 0:
            why = f"the {self.name} helper died (signal {-code})"
        else:
            why = f"the {self.name} helper exited {code}"
        tail = _tail(self.log, 300)
        return HelperError(f"{why}: {tail}" if tail else why)

    def read_line(self, timeout_s: float) -> str:
        """The helper's next line (without its newline), at most `_LINE_MAX` bytes."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = Deadline(timeout_s, self.clock)
        while b"\n" not in self._buf:
            if len(self._buf) > _LINE_MAX:
                raise HelperError(f"the {self.name} helper said a line over {_LINE_MAX} bytes")
            if deadline.expired():
                raise HelperError(f"the {self.name} helper did not answer within {timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], deadline.wait_s())
            if not ready:
                continue
            chunk = os.read(fd, _LINE_MAX + 1 - len(self._buf))
            if not chunk:
                code = self.proc.wait(timeout=5.0)
                raise self.failure(code)
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        if len(line) > _LINE_MAX:
            raise HelperError(f"the {self.name} helper said a line over {_LINE_MAX} bytes")
        return line.decode("ascii", errors="replace")

    def say(self, line: str) -> None:
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(line.encode("ascii") + b"\n")
            stdin.flush()
        except OSError as exc:
            code = self.proc.poll()
            raise (
                self.failure(code) if code is not None else HelperError(f"{self.name}: {exc}")
            ) from exc

    def wait(self, timeout_s: float) -> int:
        """The helper's exit code; killed (and HelperError) past `timeout_s`."""
        deadline = Deadline(timeout_s, self.clock)
        while True:
            try:
                return self.proc.wait(timeout=deadline.wait_s())
            except subprocess.TimeoutExpired:
                if deadline.expired():
                    break
        self.close()
        raise HelperError(f"the {self.name} helper did not finish within {timeout_s:g} s")

    def close(self, grace_s: float = 5.0) -> None:
        """End the helper: stdin closed (it exits), SIGKILL past `grace_s`."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ProviderHelper:
    """The synthetic provider in its helper: `start()` gives its URL."""

    def __init__(
        self,
        scenario: Path,
        transcript: Path,
        cgroup_procs: Sequence[str],
        log: Path,
        clock: Clock = time.monotonic,
    ) -> None:
        """`clock`: the run's, which stops while it is paused (a helper frozen
        with the run answers only once thawed)."""
        self._args = (str(scenario), str(transcript))
        self._cgroup_procs = tuple(cgroup_procs)
        self._log = log
        self._clock = clock
        self._helper: Helper | None = None
        self.last_tokens = 0
        """The last count the helper gave (what is known once it is gone)."""

    @property
    def pid(self) -> int | None:
        return self._helper.proc.pid if self._helper is not None else None

    def start(self, timeout_s: float = 30.0) -> str:
        self._helper = Helper.spawn(
            "provider", self._args, self._cgroup_procs, self._log, clock=self._clock
        )
        line = self._helper.read_line(timeout_s)
        url = line.removeprefix("ready ")
        if not line.startswith("ready ") or not _URL.match(url):
            raise HelperError(f"the provider helper did not report a loopback URL: {line[:80]!r}")
        return url

    def dead(self) -> HelperError | None:
        """Why the helper is gone, or None while it runs."""
        if self._helper is None:
            return None
        code = self._helper.poll()
        return None if code is None else self._helper.failure(code)

    @property
    def tokens_served(self) -> int:
        """What the provider's replies reported (HelperError if it is gone)."""
        assert self._helper is not None
        self._helper.say("tokens")
        line = self._helper.read_line(10.0)
        if not _TOKENS.match(line):
            raise HelperError(f"the provider helper gave no token count: {line[:80]!r}")
        self.last_tokens = int(line.split()[1])
        return self.last_tokens

    def stop(self) -> None:
        if self._helper is not None:
            self._helper.close()


def render_report_in_helper(
    run_dir: Path,
    cgroup_procs: Sequence[str],
    log: Path,
    timeout_s: float = 120.0,
    clock: Clock = time.monotonic,
) -> None:
    """Render report.md (and its plot) of `run_dir` in the `report` helper.

    Raises HelperError when it cannot join the run cgroup, fails or overruns
    `timeout_s` on `clock` (the run's: a pause does not count).
    """
    helper = Helper.spawn("report", (str(run_dir),), cgroup_procs, log, clock=clock)
    try:
        code = helper.wait(timeout_s)
    finally:
        helper.close()
    if code != 0:
        raise helper.failure(code)
