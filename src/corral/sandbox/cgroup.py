"""One cgroup per sandbox, on cgroup v2 or on v1/hybrid hosts.

On v1 the sandbox gets a directory in each controller hierarchy (memory with
memsw, pids, cpu, cpuacct, freezer) and, where the hybrid cgroup2 tree is
mounted, one there too: its core files give `cgroup.kill` and `cpu.stat`
even with no controller attached. Processes are attached by writing "0"
(the writer itself) to every `cgroup.procs`, which the launcher does in the
child between fork and exec, so nothing the sandbox runs starts outside.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from corral.errors import CgroupError
from corral.sandbox.spec import Limits

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

__all__ = [
    "CPU_PERIOD_US",
    "Cgroup",
    "CgroupLayout",
    "CgroupUsage",
    "detect_layout",
    "parse_flat_keyed",
    "pid_alive",
    "socket_share",
    "sweep_stale",
]

CPU_PERIOD_US = 100_000
_V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
_OWNER_RE = re.compile(r"^[a-z]+-(\d+)-[0-9a-f]+$")


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the hierarchies are mounted. `kind` is 'v2' (unified only) or 'v1'."""

    kind: Literal["v1", "v2"]
    v1: tuple[tuple[str, str], ...]
    unified: str | None

    def v1_mount(self, controller: str) -> str | None:
        return dict(self.v1).get(controller)

    def without_v2_stand_ins(self) -> CgroupLayout:
        """This layout less the v1 hierarchies the hybrid cgroup2 tree stands in for.

        With cgroup2 mounted beside v1 (Linux >= 5.14, for `cgroup.kill`), a
        sandbox's usage comes from its `cpu.stat`, its kill from `cgroup.kill`
        and its freezing from `cgroup.freeze`: its own cpuacct and freezer
        directories serve nothing, and each hierarchy costs a mkdir, an attach
        (the child's first v1 attach waits an RCU grace period) and an rmdir.
        Without them the sandbox stays in its creator's cgroups of those two.
        """
        if self.kind != "v1" or not self.unified or _kernel() < (5, 14):
            return self
        keep = tuple(x for x in self.v1 if x[0] not in ("cpuacct", "freezer"))
        return CgroupLayout("v1", keep, self.unified)


def _kernel() -> tuple[int, int]:
    try:
        major, minor = os.uname().release.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    """What the kernel counted for one cgroup."""

    peak_memory_bytes: int
    cpu_s: float
    oom_kills: int
    pids_limit_hits: int
    memory_limit_hits: int


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Parse 'key value' lines (memory.events, cpu.stat, oom_control)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def detect_layout(mountinfo: str | None = None) -> CgroupLayout | None:
    """Find the cgroup mounts from /proc/self/mountinfo (or the given text)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8") as fh:
                mountinfo = fh.read()
        except OSError:
            return None
    v1: dict[str, str] = {}
    unified: str | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = right.split()
        if len(fields) < 3:
            continue
        fstype, opts = fields[0], fields[2]
        mnt = left.split()[4]
        if fstype == "cgroup2" and unified is None:
            unified = mnt
        elif fstype == "cgroup":
            for opt in opts.split(","):
                if opt in _V1_CONTROLLERS and opt not in v1:
                    v1[opt] = mnt
    if v1:
        return CgroupLayout("v1", tuple(sorted(v1.items())), unified)
    if unified:
        return CgroupLayout("v2", (), unified)
    return None


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(value)
    except OSError as exc:
        raise CgroupError(
            exc.errno, f"cannot write {value.strip()!r} to {path}: {exc.strerror}"
        ) from exc


def host_swap_bytes() -> int:
    """SwapTotal of the host (0 when it has none or /proc/meminfo is unreadable)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("SwapTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _require_no_swap(missing: str) -> None:
    """A memory limit must cover swap (M7): without swap accounting, refuse
    unless the host has no swap at all (then there is nothing to cover)."""
    if host_swap_bytes() > 0:
        raise CgroupError(
            errno.EOPNOTSUPP,
            f"the memory limit cannot include swap: {missing} is missing while the host has "
            "swap (enable swap accounting, e.g. boot with swapaccount=1, or turn swap off)",
        )


#: Largest socket-buffer share of a v1 memory cap (see `socket_share`).
SOCKET_SHARE_MAX = 64 << 20


def socket_share(memory_bytes: int) -> int:
    """How much of a v1 memory cap goes to socket buffers (`memory.kmem.tcp`).

    v1 keeps socket buffers in a counter of their own, beside the user
    counter, and charges them at all only once `memory.kmem.tcp.limit_in_bytes`
    was written; so the cap is split: an eighth (at most 64 MiB) for socket
    buffers, the rest for everything else, and the two together stay within
    the cap (plus the kernel's per-socket forced charge, docs/resources.md).
    """
    return min(memory_bytes // 8, SOCKET_SHARE_MAX)


def _enable_v2_controllers(directory: str) -> None:
    wanted = ("memory", "pids", "cpu")
    have = _read(os.path.join(directory, "cgroup.subtree_control")).split()
    missing = [c for c in wanted if c not in have]
    if missing:
        _write(
            os.path.join(directory, "cgroup.subtree_control"), " ".join(f"+{c}" for c in missing)
        )


class Cgroup:
    """A sandbox's cgroup in every mounted hierarchy, at `relpath` below each root."""

    def __init__(self, layout: CgroupLayout, relpath: str) -> None:
        self.layout = layout
        self.relpath = relpath.strip("/")
        dirs: dict[str, str] = {}
        for ctrl, mnt in layout.v1:
            dirs.setdefault(ctrl, os.path.join(mnt, self.relpath))
        if layout.unified:
            dirs["unified"] = os.path.join(layout.unified, self.relpath)
        self.dirs = dirs

    # -- creation ---------------------------------------------------------
    @classmethod
    def create(cls, layout: CgroupLayout, relpath: str, limits: Limits) -> Cgroup:
        cg = cls(layout, relpath)
        try:
            cg._mkdirs()
            cg._apply_limits(limits)
        except BaseException:
            # The reason creation failed is what the caller must see, not a
            # second failure while cleaning up.
            with contextlib.suppress(CgroupError):
                cg.remove(timeout_s=1.0)
            raise
        return cg

    def _unique_dirs(self) -> list[str]:
        seen: list[str] = []
        for d in self.dirs.values():
            if d not in seen:
                seen.append(d)
        return seen

    def _mkdirs(self) -> None:
        if self.layout.kind == "v2" and self.layout.unified:
            # cgroup v2 hands controllers down one level at a time.
            parts = self.relpath.split("/")
            cur = self.layout.unified
            _enable_v2_controllers(cur)
            for part in parts[:-1]:
                cur = os.path.join(cur, part)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(cur)
                _enable_v2_controllers(cur)
        for d in self._unique_dirs():
            try:
                os.makedirs(d, exist_ok=False)
            except FileExistsError:
                raise CgroupError(errno.EEXIST, f"cgroup {d} already exists") from None
            except OSError as exc:
                raise CgroupError(exc.errno, f"cannot create cgroup {d}: {exc.strerror}") from exc

    def apply_limits(self, limits: Limits) -> None:
        """Set `limits` on a cgroup created without them, for what already runs in it
        (a pre-booted gVisor sandbox, a parked namespace child: `prefork`)."""
        self._apply_limits(limits)

    def _apply_limits(self, limits: Limits) -> None:
        if self.layout.kind == "v2":
            d = self.dirs["unified"]
            if limits.memory_bytes is not None:
                _write(os.path.join(d, "memory.max"), str(limits.memory_bytes))
                swap = os.path.join(d, "memory.swap.max")
                if os.path.exists(swap):
                    _write(swap, "0")
                else:
                    _require_no_swap("memory.swap.max")
            if limits.pids is not None:
                _write(os.path.join(d, "pids.max"), str(limits.pids))
            if limits.cpus is not None:
                _write(
                    os.path.join(d, "cpu.max"),
                    f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}",
                )
            return
        if limits.memory_bytes is not None:
            d = self.dirs["memory"]
            sock = socket_share(limits.memory_bytes)
            user = limits.memory_bytes - sock
            _write(os.path.join(d, "memory.limit_in_bytes"), str(user))
            memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
            # memsw must be set after the memory limit (it may not be lower);
            # equal values mean the sandbox gets no swap at all.
            if os.path.exists(memsw):
                _write(memsw, str(user))
            else:
                _require_no_swap("memory.memsw.limit_in_bytes")
            # Without this write v1 does not charge socket buffers anywhere: a
            # sandbox could queue hundreds of MiB in loopback TCP under a 64 MiB
            # cap. (kmem.limit_in_bytes is a no-op since 5.16; slab is charged
            # to the user counter regardless, so it needs no write.)
            tcp = os.path.join(d, "memory.kmem.tcp.limit_in_bytes")
            if not os.path.exists(tcp):
                raise CgroupError(
                    errno.EOPNOTSUPP,
                    "the memory limit cannot include socket buffers: "
                    "memory.kmem.tcp.limit_in_bytes is missing (kernel booted with "
                    "cgroup.memory=nosocket or nokmem?)",
                )
            _write(tcp, str(sock))
        if limits.pids is not None:
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(limits.pids))
        if limits.cpus is not None:
            d = self.dirs["cpu"]
            _write(os.path.join(d, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(d, "cpu.cfs_quota_us"), str(int(limits.cpus * CPU_PERIOD_US)))

    def account_sockets(self) -> None:
        """Charge the socket buffers of this cgroup's processes, with no limit of its own.

        v1 charges a socket to no cgroup at all unless its creator's cgroup
        had `memory.kmem.tcp.limit_in_bytes` written, whatever its parent
        did; written as unlimited, the charge still counts against every
        ancestor's TCP limit (the counter is hierarchical). v2 always charges.
        """
        if self.layout.kind == "v2":
            return
        _write(os.path.join(self.dirs["memory"], "memory.kmem.tcp.limit_in_bytes"), "-1")

    # -- attach -----------------------------------------------------------
    def open_attach_fds(self) -> list[int]:
        """Open every cgroup.procs for writing; the child writes b"0" to each."""
        fds: list[int] = []
        try:
            for d in self._unique_dirs():
                fds.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            raise CgroupError(exc.errno, f"cannot open cgroup.procs: {exc.strerror}") from exc
        return fds

    def procs_files(self) -> tuple[str, ...]:
        """The cgroup.procs file of each hierarchy (a process writes 0 there to join)."""
        return tuple(os.path.join(d, "cgroup.procs") for d in self._unique_dirs())

    def attach_pid(self, pid: int) -> None:
        for d in self._unique_dirs():
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    # -- inspection -------------------------------------------------------
    def _procs_dir(self) -> str:
        return self.dirs.get("unified") or self.dirs.get("pids") or next(iter(self.dirs.values()))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self._unique_dirs():
            try:
                found.update(int(x) for x in _read(os.path.join(d, "cgroup.procs")).split())
            except FileNotFoundError:
                continue
        return found

    def usage(self) -> CgroupUsage:
        peak = 0
        oom = 0
        mem_hits = 0
        cpu_s = 0.0
        pids_hits = 0
        with contextlib.suppress(OSError):
            if self.layout.kind == "v2":
                d = self.dirs["unified"]
                with contextlib.suppress(OSError):
                    peak = int(_read(os.path.join(d, "memory.peak")).strip())
                ev = parse_flat_keyed(_read(os.path.join(d, "memory.events")))
                oom = ev.get("oom_kill", 0)
                mem_hits = ev.get("max", 0)
            else:
                d = self.dirs["memory"]
                memsw = os.path.join(d, "memory.memsw.max_usage_in_bytes")
                peak = int(_read(os.path.join(d, "memory.max_usage_in_bytes")).strip())
                with contextlib.suppress(OSError):
                    peak = max(peak, int(_read(memsw).strip()))
                # v1 counts socket buffers apart: the sum of both peaks bounds
                # what the sandbox held at once (it may overstate, never under).
                with contextlib.suppress(OSError):
                    peak += int(_read(os.path.join(d, "memory.kmem.tcp.max_usage_in_bytes")))
                oom = parse_flat_keyed(_read(os.path.join(d, "memory.oom_control"))).get(
                    "oom_kill", 0
                )
                mem_hits = int(_read(os.path.join(d, "memory.failcnt")).strip())
        with contextlib.suppress(OSError):
            pdir = self.dirs.get("pids") or self.dirs["unified"]
            pids_hits = parse_flat_keyed(_read(os.path.join(pdir, "pids.events"))).get("max", 0)
        with contextlib.suppress(OSError, KeyError):
            if "unified" in self.dirs:
                cpu_s = (
                    parse_flat_keyed(_read(os.path.join(self.dirs["unified"], "cpu.stat")))[
                        "usage_usec"
                    ]
                    / 1e6
                )
            else:
                cpu_s = int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))) / 1e9
        return CgroupUsage(peak, cpu_s, oom, pids_hits, mem_hits)

    def socket_bytes(self) -> int:
        """Socket-buffer bytes the kernel charges to this cgroup right now.

        v2 charges them to `memory.current` and shows them as `sock` in
        `memory.stat`; v1 in the separate `memory.kmem.tcp` counter.
        """
        try:
            if self.layout.kind == "v2":
                stat = parse_flat_keyed(_read(os.path.join(self.dirs["unified"], "memory.stat")))
                return stat.get("sock", 0)
            return int(_read(os.path.join(self.dirs["memory"], "memory.kmem.tcp.usage_in_bytes")))
        except (OSError, ValueError) as exc:
            raise CgroupError(
                getattr(exc, "errno", None) or errno.EIO,
                f"cgroup {self.relpath}: cannot read socket memory",
            ) from exc

    # -- freezing ---------------------------------------------------------
    def freeze(self, timeout_s: float = 5.0) -> None:
        """Stop every process of the cgroup where it is; returns once the kernel says frozen.

        v1: the freezer controller (`freezer.state` FROZEN); without it, v2's
        core `cgroup.freeze` (also in the hybrid unified tree), whose
        `cgroup.events` turns `frozen 1` when every task has stopped.
        """
        self._set_frozen(True, timeout_s)

    def thaw(self, timeout_s: float = 5.0) -> None:
        """Undo `freeze()`."""
        self._set_frozen(False, timeout_s)

    def _set_frozen(self, frozen: bool, timeout_s: float) -> None:
        freezer = self.dirs.get("freezer")
        unified = self.dirs.get("unified")
        done: Callable[[], bool]
        if freezer is not None:
            state = os.path.join(freezer, "freezer.state")
            want = "FROZEN" if frozen else "THAWED"
            _write(state, want)

            def done() -> bool:
                # FREEZING while the kernel is still stopping tasks.
                return _read(state).strip() == want

        elif unified is not None and os.path.exists(os.path.join(unified, "cgroup.freeze")):
            _write(os.path.join(unified, "cgroup.freeze"), "1" if frozen else "0")
            events = os.path.join(unified, "cgroup.events")

            def done() -> bool:
                return parse_flat_keyed(_read(events)).get("frozen") == int(frozen)

        else:
            raise CgroupError(errno.EOPNOTSUPP, f"cgroup {self.relpath}: no freezer")
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        try:
            while not done():
                if time.monotonic() >= deadline:
                    raise CgroupError(
                        errno.ETIMEDOUT,
                        f"cgroup {self.relpath} not {'frozen' if frozen else 'thawed'}"
                        f" after {timeout_s:g}s",
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
        except OSError as exc:
            raise CgroupError(exc.errno, f"cgroup {self.relpath}: {exc.strerror}") from exc

    # -- teardown ---------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL every process in the cgroup, including ones forking right now."""
        kill_file = os.path.join(self.dirs.get("unified", "/nonexistent"), "cgroup.kill")
        if os.path.exists(kill_file):
            _write(kill_file, "1")
            return
        freezer = self.dirs.get("freezer")
        if freezer is None:
            self._kill_loop()
            return
        # Frozen tasks cannot fork, so one pass over the task list kills all;
        # SIGKILL is delivered once the cgroup is thawed.
        state = os.path.join(freezer, "freezer.state")
        _write(state, "FROZEN")
        deadline = time.monotonic() + 2.0
        while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.001)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _write(state, "THAWED")

    def _kill_loop(self) -> None:
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def _empty(self) -> bool:
        # Every hierarchy's list, unparsed: a thousand dying pids were parsed
        # into ints on every poll only to be thrown away.
        for d in self._unique_dirs():
            try:
                if _read(os.path.join(d, "cgroup.procs")).strip():
                    return False
            except FileNotFoundError:
                continue
        return True

    def wait_empty(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while True:
            if self._empty():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left, wait until empty, remove every directory."""
        existing = [d for d in self._unique_dirs() if os.path.isdir(d)]
        if not existing:
            return
        if self.pids():
            self.kill()
            if not self.wait_empty(timeout_s):
                raise CgroupError(
                    errno.EBUSY, f"cgroup {self.relpath} still has processes after kill"
                )
        for d in existing:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    # v1 memory cgroups stay busy for a moment after the last
                    # task exits while its zombie is reaped.
                    if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                        raise CgroupError(
                            exc.errno, f"cannot remove cgroup {d}: {exc.strerror}"
                        ) from exc
                    time.sleep(0.002)


def _children(layout: CgroupLayout, parent: str) -> Iterator[tuple[str, str]]:
    roots = [m for _, m in layout.v1] + ([layout.unified] if layout.unified else [])
    seen: set[str] = set()
    for root in roots:
        # scandir's d_type tells a cgroup from the ~30 control files beside
        # it without a stat of each (that was most of every start's sweep).
        try:
            with os.scandir(os.path.join(root, parent)) as it:
                names = [e.name for e in it if e.is_dir()]
        except OSError:
            continue
        for name in names:
            if name not in seen:
                seen.add(name)
                yield name, f"{parent}/{name}"


def sweep_stale(layout: CgroupLayout, parent: str = "corral") -> list[str]:
    """Kill and remove sandboxes whose owning corral process is gone.

    Cgroup names carry the owner's pid (`exec-<pid>-<hex>`); a cgroup whose
    owner no longer exists was left by a corral that was killed.
    """
    removed: list[str] = []
    for name, rel in _children(layout, parent):
        m = _OWNER_RE.match(name)
        if m is None:
            continue
        owner = int(m.group(1))
        if owner == os.getpid() or pid_alive(owner):
            continue
        try:
            Cgroup(layout, rel).remove(timeout_s=2.0)
            removed.append(rel)
        except CgroupError:
            pass
        except OSError as exc:
            # Another corral starting now sweeps the same stale cgroup: once it
            # is removed, reading its files fails with ENODEV (or ENOENT).
            if exc.errno not in (errno.ENODEV, errno.ENOENT):
                raise
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
