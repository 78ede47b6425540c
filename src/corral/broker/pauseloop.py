"""The broker's event loop on the run's clock: its timers stop while the run is paused.

A session broker of `corral run` is in the run cgroup, so `corral pause`
freezes it with the sandbox it serves. Its timers (idle, header, body,
upstream, tunnel idle, connect) are asyncio timers on CLOCK_MONOTONIC,
which runs on through a freeze: on the thaw asyncio sees every deadline
passed and fires them all at once, so a model call in flight across a
pause longer than `upstream_timeout_s` became a 504 and every idle
keep-alive connection was closed.

`PausableEventLoop.time()` is CLOCK_MONOTONIC minus the time the run spent
paused, read from the run's published pauses (`tools/pauses.json`, written
by corral before a freeze and after the thaw: `corral.run.pause`). Every
asyncio deadline (`asyncio.timeout`, `wait_for`, `call_later`, `sleep`) is
on `loop.time()`, so all of them stand still while the run is paused, and
nothing else changes: unpaused, a timeout fires exactly as before.

Reading the file cheaply: `time()` is called a few times per loop
iteration, so the file is looked at (one `stat`) at most every
`RECHECK_S` of real time and read again only when its identity, size or
mtime changed (corral replaces it whole by rename). A pause can only
begin or end while the broker is frozen or between two looks; right after
a thaw CLOCK_MONOTONIC has jumped by the pause, so the first `time()` looks
at once. The file is corral's (no sandbox can write it) but is parsed
bounded anyway; a file that cannot be read or is not the host's format
leaves the last good reading in force (never a jump of the clock).

Limit: an open pause counts until corral rewrites the file after the thaw
(milliseconds). If that rewrite failed, the broker's timers would stand
still until the next publish (before the session's checks); the session's
`wall_time`, enforced by the coordinator on the durable record, still
bounds the session.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from corral.pauseclock import Clock, PausableClock

__all__ = [
    "MAX_PAUSES",
    "MAX_PAUSES_BYTES",
    "RECHECK_S",
    "PausableEventLoop",
    "PauseFile",
    "loop_factory",
    "parse_pauses",
]

#: Largest pauses file read (corral writes at most 1000 intervals, ~40 KiB).
MAX_PAUSES_BYTES = 1 << 16
MAX_PAUSES = 1000
#: Real seconds between two looks at the pauses file.
RECHECK_S = 0.05

Interval = tuple[float, float | None]


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"not finite: {value!r}")
    return out


def parse_pauses(data: bytes) -> tuple[Interval, ...]:
    """`[[start, end|null], ...]` (CLOCK_MONOTONIC seconds) from the file's bytes (pure).

    ValueError unless it is what corral writes: at most `MAX_PAUSES_BYTES`
    and `MAX_PAUSES` intervals, finite numbers, each end at or after its
    start, only the last one open.
    """
    if len(data) > MAX_PAUSES_BYTES:
        raise ValueError(f"pauses file over {MAX_PAUSES_BYTES} bytes")
    doc = json.loads(data)
    if not isinstance(doc, list) or len(doc) > MAX_PAUSES:
        raise ValueError("pauses are a list of at most 1000 intervals")
    out: list[Interval] = []
    for i, item in enumerate(doc):
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError("a pause is [start, end|null]")
        start = _finite(item[0])
        if item[1] is None:
            if i != len(doc) - 1:
                raise ValueError("only the last pause may be open")
            out.append((start, None))
            continue
        end = _finite(item[1])
        if end < start:
            raise ValueError("a pause ends before it starts")
        out.append((start, end))
    return tuple(out)


def _read_bounded(path: Path) -> bytes:
    # Non-blocking and regular files only: the loop must never wait on a FIFO.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return os.read(fd, MAX_PAUSES_BYTES + 1)
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class PauseFile:
    """`paused_s(since, now)` of the pauses published at `path` (a `PausedSeconds`).

    `look` (a stat) and `read` are the file system (injected by tests); `recheck_s`
    is the least real time between two looks at the file.
    """

    __slots__ = (
        "_closed",
        "_closed_for",
        "_intervals",
        "_last_end",
        "_looked",
        "_path",
        "_read",
        "_recheck_s",
        "_seen",
        "_stat",
    )

    def __init__(
        self,
        path: Path,
        *,
        recheck_s: float = RECHECK_S,
        look: Callable[[Path], os.stat_result] = os.stat,
        read: Callable[[Path], bytes] = _read_bounded,
    ) -> None:
        self._path = path
        self._recheck_s = recheck_s
        self._stat = look
        self._read = read
        self._looked: float | None = None
        self._seen: tuple[int, int, int, int] | None = None
        self._intervals: tuple[Interval, ...] = ()
        # The closed pauses' sum over [since, ∞), cached for one `since`.
        self._closed_for: float | None = None
        self._closed = 0.0
        self._last_end = -math.inf

    @property
    def path(self) -> Path:
        return self._path

    def _look(self, now: float) -> None:
        if self._looked is not None and now - self._looked < self._recheck_s:
            return
        self._looked = now
        try:
            seen = _identity(self._stat(self._path))
            if seen == self._seen:
                return
            intervals = parse_pauses(self._read(self._path))
        except (OSError, ValueError):
            # Keep the last good reading: dropping pauses already counted
            # would jump the clock forward and fire every timer at once.
            return
        self._seen = seen
        self._intervals = intervals
        self._closed_for = None

    def paused_s(self, since: float, now: float) -> float:
        """Seconds of [since, now] the run spent paused, as far as the file says."""
        self._look(now)
        if self._closed_for != since:
            closed = [(max(s, since), e) for s, e in self._intervals if e is not None]
            self._closed = sum(max(e - s, 0.0) for s, e in closed)
            self._last_end = max((e for _, e in closed), default=-math.inf)
            self._closed_for = since
        if now >= self._last_end:
            total = self._closed
        else:
            # A reading before the end of a closed pause (not seen in
            # practice: both are CLOCK_MONOTONIC): clip each to `now`.
            total = sum(
                max(min(e, now) - max(s, since), 0.0) for s, e in self._intervals if e is not None
            )
        if self._intervals and self._intervals[-1][1] is None:
            total += max(now - max(self._intervals[-1][0], since), 0.0)
        return total


class PausableEventLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` stands still while the run is paused."""

    def __init__(self, pauses: PauseFile, now: Clock = time.monotonic) -> None:
        self._clock = PausableClock(pauses.paused_s, now)
        self.pauses_path = str(pauses.path)
        super().__init__()

    def time(self) -> float:
        return self._clock()


def loop_factory(pauses: str | None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The broker's loop for a run's pauses file; None (asyncio's own) without one."""
    if pauses is None:
        return None
    path = Path(pauses)
    return lambda: PausableEventLoop(PauseFile(path))
