"""Journal rows for the Landlock and seccomp denials kernel audit reports (`landlock`, `seccomp`).

`KernelDenialWatch.open(journal)` binds the audit multicast group when kernel
audit is on (corral never turns it on) and reads it on one thread; each
sandbox is registered with `watch(relpath, identity, pids)` and every denial
attributed to its cgroup (`sandbox/kaudit.py`) becomes one row, at most
`MAX_ROWS_PER_SANDBOX` per sandbox (the rest are counted in a last row).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.sandbox import kaudit

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.broker.actions import Identity, Observation
    from corral.broker.journal import Journal

__all__ = [
    "MAX_ROWS_PER_SANDBOX",
    "KernelDenialWatch",
    "denial_observation",
    "open_watch",
    "unavailable_reason",
]

MAX_ROWS_PER_SANDBOX = 1000
_MAX_KNOWN_PIDS = 65536
_TICK_S = 0.05


def unavailable_reason() -> str | None:
    """Why kernel denials cannot be journaled here, or None when they can."""
    enabled = kaudit.audit_enabled()
    if enabled is None:
        return (
            "the kernel audit subsystem cannot be queried"
            " (no audit support or no CAP_AUDIT_CONTROL)"
        )
    if not enabled:
        return "kernel audit is disabled (enable it with `auditctl -e 1`)"
    return None


def _syscall_name(nr: int | None) -> str:
    if nr is None:
        return "syscall ?"
    try:
        import pyseccomp

        return str(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, nr).decode())[:64]
    # Any failure of the name lookup (no libseccomp, unknown number) leaves the number.
    except Exception:
        return f"syscall {nr}"


def denial_observation(denial: kaudit.KernelDenial, identity: Identity) -> Observation:
    """The journal row of one kernel-reported denial (the path sanitized: sandbox text)."""
    from corral.broker.actions import LandlockDenial, Observation, SeccompDenial
    from corral.display import show

    detail: dict[str, object] = {"audit_serial": denial.serial}
    if denial.kind == "seccomp":
        name = _syscall_name(denial.syscall)
        return Observation.of(
            SeccompDenial(syscall=name, nr=denial.syscall, pid=denial.pid),
            identity,
            decision="deny",
            rule=name,
            reason=f"the seccomp filter refused {name} (reported by kernel audit)",
            detail=detail,
        )
    path = show(os.fsdecode(denial.target), 1024) if denial.target else "?"
    access = show(denial.access, 120) or "?"
    if denial.domain:
        detail["landlock_domain"] = denial.domain
    return Observation.of(
        LandlockDenial(access=access, path=path, pid=denial.pid),
        identity,
        decision="deny",
        rule=access,
        reason=f"Landlock refused {access} on {path} (reported by kernel audit)",
        detail=detail,
    )


@dataclass
class _Watched:
    identity: Identity
    pids: Callable[[], set[int]]
    rows: int = 0
    dropped: int = 0
    known: set[int] = field(default_factory=set)


class KernelDenialWatch:
    """One reader of kernel audit for any number of sandboxes; `close()` stops it."""

    def __init__(self, journal: Journal, sock: kaudit.AuditSocket) -> None:
        self._journal = journal
        self._sock = sock
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._stop = threading.Event()
        self._seen = 0
        self._correlator = kaudit.Correlator(self._lookup)
        self._thread = threading.Thread(target=self._loop, name="corral-kaudit", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, journal: Journal) -> KernelDenialWatch | None:
        """A running watch, or None when kernel audit is off or unreadable."""
        if unavailable_reason() is not None:
            return None
        try:
            sock = kaudit.AuditSocket()
        except OSError:
            return None
        return cls(journal, sock)

    def watch(self, relpath: str, identity: Identity, pids: Callable[[], set[int]]) -> None:
        """Attribute denials in cgroup `relpath` (and below) to `identity`.

        `pids()` lists the cgroup's processes; it is polled so that a denial
        whose process is gone when its record is read is still attributed
        (by the pid the kernel logged, e.g. the Landlock domain's creator).
        """
        with self._lock:
            self._watched[relpath.strip("/")] = _Watched(identity, pids)
        self._poll_pids()

    def watch_running(self, running: object, identity: Identity) -> None:
        """`watch` the cgroup of a sandbox handle (a handle without one: nothing)."""
        cgroup = getattr(running, "cgroup", None)
        relpath = getattr(cgroup, "relpath", None)
        pids = getattr(cgroup, "pids", None)
        if isinstance(relpath, str) and callable(pids):
            self.watch(relpath, identity, pids)

    def unwatch_running(self, running: object) -> None:
        """`unwatch` the cgroup of a sandbox handle."""
        relpath = getattr(getattr(running, "cgroup", None), "relpath", None)
        if isinstance(relpath, str):
            self.unwatch(relpath)

    def unwatch(self, relpath: str) -> None:
        """Read what the kernel already queued, then forget `relpath` (journals the overflow)."""
        self.settle()
        with self._lock:
            w = self._watched.pop(relpath.strip("/"), None)
        if w is not None and w.dropped:
            self._journal.append(self._overflow(w))

    def settle(self, quiet_s: float = 0.2, limit_s: float = 2.0) -> None:
        """Wait until no record arrived for `quiet_s` (kauditd delivers asynchronously)."""
        import time

        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with self._lock:
                seen = self._seen
            time.sleep(quiet_s)
            with self._lock:
                if self._seen == seen:
                    break
        with self._lock:
            pending = self._correlator.flush()
        self._journal_all(pending)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._sock.close()

    # -- the reader thread --------------------------------------------------
    def _lookup(self, pid: int) -> tuple[str, ...] | None:
        paths = kaudit.proc_cgroup(pid)
        if paths is not None:
            return paths
        for rel, w in self._watched.items():
            if pid in w.known:
                return (rel,)
        return None

    def _poll_pids(self) -> None:
        with self._lock:
            items = list(self._watched.values())
        for w in items:
            with contextlib.suppress(Exception):
                fresh = w.pids()
                if len(w.known) + len(fresh) <= _MAX_KNOWN_PIDS:
                    w.known |= fresh

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._sock.read(_TICK_S)
            except OSError:
                # ENOBUFS: the kernel dropped records for this socket; keep reading.
                records = []
            self._poll_pids()
            out = []
            with self._lock:
                for rec in records:
                    self._seen += 1
                    out += self._correlator.feed(rec)
            self._journal_all(out)

    def _journal_all(self, found: list[tuple[kaudit.KernelDenial, tuple[str, ...] | None]]) -> None:
        for denial, paths in found:
            if paths is None:
                continue
            with self._lock:
                target = next(
                    (w for rel, w in self._watched.items() if kaudit.in_cgroup(paths, rel)), None
                )
                if target is None:
                    continue
                if target.rows >= MAX_ROWS_PER_SANDBOX:
                    target.dropped += 1
                    continue
                target.rows += 1
            try:
                self._journal.append(denial_observation(denial, target.identity))
            except Exception:
                # A record the journal cannot take must not stop the reader thread.
                continue

    def _overflow(self, w: _Watched) -> Observation:
        from corral.broker.actions import Observation, ProcessEvent

        return Observation.of(
            ProcessEvent(event="kernel_denials_dropped"),
            w.identity,
            decision="observe",
            rule=None,
            reason=f"{w.dropped} more kernel-reported denial(s) not journaled "
            f"(limit {MAX_ROWS_PER_SANDBOX} per sandbox)",
            detail={"dropped": w.dropped},
        )


# --- what `corral exec` and a run's session call --------------------------------


def open_watch(stack: contextlib.ExitStack, journal: Journal | None) -> KernelDenialWatch | None:
    """A watch closed by `stack`, opened before the sandbox starts (so no early
    denial is missed); None without a journal or when kernel audit is off."""
    if journal is None:
        return None
    watch = KernelDenialWatch.open(journal)
    if watch is not None:
        stack.callback(watch.close)
    return watch
