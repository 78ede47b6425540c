"""One host uid/gid per live sandbox, from a configured range (root only).

The kernel keeps many per-user quotas by *host* uid: inotify instances and
watches, pipe buffer pages, RLIMIT_NPROC, user keyrings, message queue
bytes. Sandboxes sharing one host uid share those quotas, so one sandbox
could exhaust another's. Each live sandbox therefore gets its own uid (gid
the same number) from `CORRAL_UID_RANGE` (default 64000-64999).

A uid is taken by an exclusive `flock` on `/run/corral/uids/<uid>.lock`,
held by the launcher for the sandbox's lifetime. The kernel attaches a
flock to the open file description and drops it when the last descriptor
of it is closed, which process exit does on every path (SIGKILL and the
OOM killer included), so a crashed corral gives its uids back with no
cleanup step. The descriptor is close-on-exec: the sandbox never holds it.

The lock alone is not enough after a crash: the dead launcher's sandbox
may still be dying when its lock is already free. The lock file says
`in-use` while a sandbox holds the id and `closed` once its teardown proved
the sandbox empty (its cgroup removed). A new holder that finds anything
but `closed` (a crashed holder's `in-use`, a fresh file) scans /proc once
(about 10 ms on a busy host) and skips the uid if any process still runs with it as a real,
effective, saved or filesystem uid or gid (an unreaped zombie does not
count: it runs nothing and holds no file). The file is read and the scan
made *after* locking, and ids in the range are only ever taken by a
launcher that holds the lock, so no process can appear behind the check.

The range must not contain ids of /etc/passwd, /etc/group, /etc/subuid or
/etc/subgid (a host account or another user's namespaces would share the
quotas, or own the sandbox's files): such a range is refused.

When corral is not root there is no allocation: bubblewrap runs the
sandbox as the caller's own uid, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.errors import SandboxStartError

__all__ = [
    "DEFAULT_RANGE",
    "ENV_VAR",
    "LOCK_DIR",
    "UidLease",
    "UidRange",
    "allocate",
    "busy_ids",
    "configured_range",
    "range_conflict",
]

ENV_VAR = "CORRAL_UID_RANGE"
LOCK_DIR = "/run/corral/uids"
#: Far above the ids Debian hands to accounts (1000-59999) and below nobody.
DEFAULT_RANGE = "64000-64999"
_MIN_ID = 1000
_MAX_ID = 0xFFFFFFFE  # (uid_t)-1 means "unchanged" to setresuid
_MAX_SPAN = 1 << 20


@dataclass(frozen=True, slots=True)
class UidRange:
    """An inclusive range of host ids handed to sandboxes (uid and gid alike)."""

    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """`FIRST-LAST` (or one id); raises SandboxStartError naming the problem."""
        first_s, sep, last_s = text.strip().partition("-")
        try:
            first = int(first_s)
            last = int(last_s) if sep else first
        except ValueError:
            raise SandboxStartError(0, f"{ENV_VAR}={text!r} is not FIRST-LAST") from None
        if not _MIN_ID <= first <= last <= _MAX_ID:
            raise SandboxStartError(
                0, f"{ENV_VAR}={text!r}: need {_MIN_ID} <= FIRST <= LAST <= {_MAX_ID}"
            )
        if last - first + 1 > _MAX_SPAN:
            raise SandboxStartError(0, f"{ENV_VAR}={text!r} spans more than {_MAX_SPAN} ids")
        if first <= 65534 <= last:
            raise SandboxStartError(0, f"{ENV_VAR}={text!r} contains nobody (65534)")
        return cls(first, last)


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def _ids_of(path: str) -> Iterable[tuple[str, int]]:
    """(name, id) of each entry of passwd(5) or group(5); a missing file has none."""
    for line in _lines(path):
        parts = line.split(":")
        if len(parts) > 2:
            with contextlib.suppress(ValueError):
                yield parts[0], int(parts[2])


def _sub_ranges(path: str) -> Iterable[tuple[str, int, int]]:
    """(name, first, last) of each entry of subuid(5) or subgid(5)."""
    for line in _lines(path):
        parts = line.split(":")
        if len(parts) > 2:
            with contextlib.suppress(ValueError):
                start, count = int(parts[1]), int(parts[2])
                yield parts[0], start, start + count - 1


_DBS = ("passwd", "group", "subuid", "subgid")
#: A file changed this recently before it was read is never remembered as read:
#: timestamps come from a coarse clock (a change just after the read can carry
#: a time from just before it), so only an older ctime vouches that it did not change.
_SETTLED_NS = 2_000_000_000
#: (range, etc) -> (the files' identities when read, the answer): one entry, the last.
_answers: dict[tuple[int, int, str], tuple[tuple[tuple[int, ...] | None, ...], str | None]] = {}


def _identities(etc: str) -> tuple[tuple[int, ...] | None, ...]:
    out: list[tuple[int, ...] | None] = []
    for db in _DBS:
        try:
            st = os.stat(os.path.join(etc, db))
        except FileNotFoundError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def range_conflict(r: UidRange, etc: str = "/etc") -> str | None:
    """Why `r` overlaps host accounts or subordinate ranges, or None when it does not.

    The answer is remembered with the four files' identities (device, inode,
    size, mtime, ctime) and reused while a stat of each shows the same; a
    file changed within `_SETTLED_NS` before the read is read again next time.
    """
    key = (r.first, r.last, etc)
    before = _identities(etc)
    known = _answers.get(key)
    if known is not None and known[0] == before:
        return known[1]
    started = time.time_ns()
    answer = _range_conflict(r, etc)
    after = _identities(etc)
    _answers.clear()
    if after == before and all(i is None or i[4] < started - _SETTLED_NS for i in after):
        _answers[key] = (after, answer)
    return answer


def _range_conflict(r: UidRange, etc: str) -> str | None:
    for db, what in (("passwd", "user"), ("group", "group")):
        for name, ident in _ids_of(os.path.join(etc, db)):
            if ident in r:
                return f"{ENV_VAR} {r} contains host {what} {name!r} ({ident}) from /etc/{db}"
    for db in ("subuid", "subgid"):
        for name, start, end in _sub_ranges(os.path.join(etc, db)):
            if start <= r.last and r.first <= end:
                return f"{ENV_VAR} {r} overlaps {name!r}'s range {start}-{end} in /etc/{db}"
    return None


def configured_range(environ: dict[str, str] | None = None, etc: str = "/etc") -> UidRange:
    """The validated range from `CORRAL_UID_RANGE` (default 64000-64999)."""
    env = os.environ if environ is None else environ
    r = UidRange.parse(env.get(ENV_VAR) or DEFAULT_RANGE)
    conflict = range_conflict(r, etc)
    if conflict is not None:
        raise SandboxStartError(0, f"{conflict}; choose another range")
    return r


def busy_ids(r: UidRange, proc: str = "/proc") -> set[int]:
    """Ids of `r` that a live process uses as any of its uids or gids (one /proc pass)."""
    busy: set[int] = set()
    try:
        entries = os.listdir(proc)
    except OSError as exc:
        raise SandboxStartError(exc.errno, f"cannot scan {proc}: {exc.strerror}") from exc
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/status", "rb") as fh:
                status = fh.read()
        except OSError:  # exited meanwhile
            continue
        if _zombie(status):
            continue
        for key in (b"\nUid:", b"\nGid:"):
            at = status.find(key)
            if at < 0:
                continue
            end = status.find(b"\n", at + 1)
            for value in status[at + len(key) : end].split():
                with contextlib.suppress(ValueError):
                    ident = int(value)
                    if ident in r:
                        busy.add(ident)
    return busy


def _zombie(status: bytes) -> bool:
    """A dead single-threaded process not yet reaped: it runs nothing and holds no file.

    On a host whose pid 1 does not reap, a sandbox's namespace pid 1 can stay
    a zombie indefinitely; it must not keep its uid out of use. A zombie
    leader whose other threads still run is alive.
    """
    return b"\nState:\tZ" in status and b"\nThreads:\t1\n" in status


class UidLease:
    """A host uid/gid held for one sandbox; `close()` gives it back (idempotent)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self.gid = uid
        self._fd: int | None = fd

    def close(self, *, clean: bool = False) -> None:
        """Release the id; `clean` when teardown proved no process of it is left."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if clean:
                    _set_state(fd, _CLEAN)
            finally:
                os.close(fd)


# Same length, so a state is one pwrite over the other (ftruncate costs
# milliseconds on overlay filesystems).
_CLEAN = b"closed\n"
_IN_USE = b"in-use\n"


def _set_state(fd: int, state: bytes) -> None:
    if os.pwrite(fd, state, 0) != len(state):
        raise OSError(0, "short write to the uid lock file")


def _try_lock(lock_dir: str, uid: int) -> int | None:
    fd = os.open(
        os.path.join(lock_dir, f"{uid}.lock"),
        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
        0o600,
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def allocate(
    r: UidRange,
    lock_dir: str = LOCK_DIR,
    *,
    busy: Callable[[UidRange], set[int]] = busy_ids,
) -> UidLease:
    """Lock the first id of `r` that no launcher holds and no process uses.

    Raises SandboxStartError when every id is taken.
    """
    try:
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise SandboxStartError(exc.errno, f"cannot create {lock_dir}: {exc.strerror}") from exc
    in_use: set[int] = set()
    held = 0
    for uid in range(r.first, r.last + 1):
        if uid in in_use:
            continue
        try:
            fd = _try_lock(lock_dir, uid)
        except OSError as exc:
            raise SandboxStartError(exc.errno, f"cannot lock sandbox uid {uid}: {exc}") from exc
        if fd is None:
            held += 1
            continue
        try:
            # Read and scanned after locking: see the module docstring.
            if os.pread(fd, 64, 0) != _CLEAN:
                in_use |= busy(r)
            if uid not in in_use:
                _set_state(fd, _IN_USE)
                return UidLease(uid, fd)
        except OSError as exc:
            os.close(fd)
            raise SandboxStartError(exc.errno, f"cannot lock sandbox uid {uid}: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise SandboxStartError(
        0,
        f"no free sandbox uid in {r}: all {r.size} are held by running sandboxes "
        f"({held}) or still have processes ({r.size - held}); "
        f"set {ENV_VAR}=FIRST-LAST to a wider range",
    )
