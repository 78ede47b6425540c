"""The processes of a running gVisor sandbox, from the host: runsc's listing and its host tasks.

No command of the sandbox is a host process: `runsc ps` asks the sentry
(gVisor's kernel, outside the command's reach) for the container's
processes. runsc finds the sandbox by the pid it recorded, a pid of the PID
namespace `unshare` made, over an abstract control socket of runsc's
network namespace, so the listing runs `nsenter`ed into both (and the mount
namespace, whose /proc is that PID namespace's).

`find_sandboxes(owner)` locates the sandboxes a `corral exec` process
started (its `unshare` children) for hosts that only know that pid, such as
`corral verify`.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

__all__ = [
    "Located",
    "container_pids",
    "find_sandboxes",
    "host_tasks",
    "parse_ps",
    "ps_argv",
    "runsc_argv",
    "sandbox_pid1",
]

#: runsc ps output is read up to this size (a list of pids).
_MAX_PS = 1 << 20


@dataclass(frozen=True, slots=True)
class Located:
    """A running sandbox: runsc's state, its container id, the `unshare` holding it."""

    runsc: str
    state_dir: str
    container_id: str
    holder: int


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                out += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read(65536).split(b"\0")
    except OSError:
        return []


def sandbox_pid1(holder: int) -> int | None:
    """The host pid of pid 1 of the namespace `unshare` (pid `holder`) made."""
    kids = _children(holder)
    return kids[0] if kids else None


def runsc_argv(
    runsc: str, state_dir: str, pid1: int, *args: str, nsenter: str = "nsenter"
) -> list[str]:
    """`runsc --root state_dir ARGS` run in the network, pid and mount namespaces of
    host pid `pid1`, where runsc's sandbox was started (pure)."""
    return [
        nsenter,
        "-t",
        str(pid1),
        "-n",
        "-p",
        "-m",
        runsc,
        "--root",
        state_dir,
        "--ignore-cgroups",
        *args,
    ]


def ps_argv(target: Located, pid1: int, *, table: bool = False) -> list[str]:
    """`runsc ps` for one sandbox, in its namespaces (pure); `table`: runsc's
    UID PID PPID ... table instead of the JSON list of pids."""
    fmt = "table" if table else "json"
    return runsc_argv(
        target.runsc, target.state_dir, pid1, "ps", "--format", fmt, target.container_id
    )


def parse_ps(out: bytes) -> list[int] | None:
    """The pids of `runsc ps --format json` (a JSON list of ints); None when malformed (pure)."""
    if len(out) > _MAX_PS:
        return None
    try:
        value = json.loads(out)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in value
    ):
        return None
    return value


def _ps(target: Located, timeout_s: float, *, table: bool) -> bytes | None:
    pid1 = sandbox_pid1(target.holder)
    if pid1 is None:
        return None
    try:
        proc = subprocess.run(
            ps_argv(target, pid1, table=table),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def container_pids(target: Located, timeout_s: float = 10.0) -> list[int] | None:
    """The sandbox's processes (gVisor pids) as the sentry lists them; None if it is gone."""
    out = _ps(target, timeout_s, table=False)
    return None if out is None else parse_ps(out)


def find_sandboxes(owner: int) -> list[Located]:
    """The gVisor sandboxes `corral exec` process `owner` runs (its `unshare` children)."""
    out: list[Located] = []
    for pid in _children(owner):
        argv = _cmdline(pid)
        if not argv or not argv[0].endswith(b"/unshare") or b"--root" not in argv:
            continue
        i = argv.index(b"--root")
        runsc = next((a for a in argv if a.endswith(b"/runsc")), None)
        if runsc is None or i + 1 >= len(argv) or b"run" not in argv:
            continue
        state = argv[i + 1].decode(errors="replace")
        out.append(
            Located(
                runsc=runsc.decode(errors="replace"),
                state_dir=state,
                container_id=os.path.basename(os.path.dirname(state)),
                holder=pid,
            )
        )
    return out


def host_tasks(target: Located) -> list[int]:
    """Host pids that execute the sandbox's code: the sentry (`runsc-sandbox`) and,
    below it, its platform stubs; runsc and the gofer (root, host code) excluded."""
    found: list[int] = []
    todo = list(_children(target.holder))
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        argv = _cmdline(pid)
        if argv and argv[0] == b"runsc-sandbox":
            stack = [pid]
            while stack:
                p = stack.pop()
                found.append(p)
                stack += _children(p)
            continue
        todo += _children(pid)
    return sorted(set(found))
