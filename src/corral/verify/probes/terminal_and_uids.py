"""M14 terminal and M15 cross-sandbox probes.

M14: the probe has a terminal on stdin (the runner's pty, the caller's
terminal as far as the backend knows) and attacks it with the ioctls that act
on the terminal itself rather than on the bytes through it: a window size
change (which signals the terminal's foreground process group), a termios
change that outlives the sandbox (echo off), and exclusive mode (nobody else
may open the terminal). The host compares the terminal's state after the run
with its state before it. On the bare host each attack works; a backend that
relays a pty of its own (corral) leaves the caller's terminal as it was.

M15: a second sandbox of the same backend runs alongside the probe. The
kernel keeps per-user quotas (inotify instances, pipe buffers, RLIMIT_NPROC,
keyrings) by host uid, so two sandboxes that share one can starve each
other. The host reads both sandboxes' processes' uids from /proc.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.verify.model import Evidence, Judgement, Probe, TtyChanged
from corral.verify.oracles import Fact
from corral.verify.probes._dsl import code

__all__ = ["PROBES", "SharedHostUid"]


@dataclass(frozen=True, slots=True)
class SharedHostUid:
    """Allowed (quotas shared) when, seen from the host while both ran, a
    process of the probe and a process of the neighbour sandbox had the same
    effective uid."""

    def judge(self, ev: Evidence) -> Judgement:
        mine = _uids(ev.facts.get("host_status"))
        theirs = _uids(ev.facts.get("neighbour_status"))
        if not mine:
            return Judgement("error", "the host saw no process of the probe to inspect")
        if not theirs:
            return Judgement("error", "the neighbour sandbox did not come up")
        shared = mine & theirs
        if shared:
            return Judgement(
                "allowed",
                f"host: both sandboxes run as uid {min(shared)}, sharing its kernel quotas",
            )
        return Judgement(
            "denied",
            f"host: the probe runs as uid {sorted(mine)}, the neighbour as {sorted(theirs)}",
        )


def _uids(rows: object) -> set[int]:
    out: set[int] = set()
    if not isinstance(rows, list):
        return out
    for row in rows:
        fields = str(row.get("Uid", "")).split() if isinstance(row, dict) else []
        if len(fields) > 1:
            out.add(int(fields[1]))
    return out


def _tty(pid: str, desc: str, body: str, changed: str) -> Probe:
    return Probe(
        pid,
        "host-integrity",
        "M14",
        desc,
        code(body),
        Fact("changed", changed),
        needs=frozenset({"pty"}),
        checks=(TtyChanged("changed"),),
        serial=True,
    )


PROBES: list[Probe] = [
    _tty(
        "term-winsize",
        "resize the caller's terminal with TIOCSWINSZ (SIGWINCH to its foreground group)",
        """
        import fcntl, struct, termios
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 7, 13, 0, 0))
            result(True)
        except OSError as e:
            result(False, errno=errname(e.errno))
        """,
        "the caller's terminal changed",
    ),
    _tty(
        "term-echo-off",
        "turn echo and canonical mode off on the caller's terminal (TCSETS outlives the sandbox)",
        """
        import termios
        try:
            a = termios.tcgetattr(0)
            a[3] ^= termios.ECHO | termios.ICANON
            a[0] ^= termios.ICRNL
            termios.tcsetattr(0, termios.TCSANOW, a)
            result(True)
        except (OSError, termios.error) as e:
            result(False, error=str(e))
        """,
        "the caller's terminal changed",
    ),
    _tty(
        "term-exclusive",
        "lock the caller out of their terminal with TIOCEXCL",
        """
        import fcntl, termios
        try:
            fcntl.ioctl(0, termios.TIOCEXCL)
            result(True)
        except OSError as e:
            result(False, errno=errname(e.errno))
        """,
        "the caller's terminal changed",
    ),
    Probe(
        "cross-shared-uid",
        "resources",
        "M15",
        "share a host uid (and its inotify, pipe, process and keyring quotas) with a "
        "concurrently running sandbox",
        code("ready()\ntime.sleep(1.5)"),
        SharedHostUid(),
        needs=frozenset({"neighbour"}),
        during="inspect",
    ),
]
