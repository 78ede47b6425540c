"""Run the probe catalogue against one backend and collect host-side evidence.

For each probe: a fresh workspace, the host-side steps, the backend command
(`python3 -I -S -c PROGRAM MARKER` wrapped by the backend), host sampling
while it runs when the probe asks for it, then — after the backend returned
and the probe's grace period passed — the host facts (survivors carrying the
marker, paths, mounts, the victim, host git, the terminal), canary hits and
the journal. Everything a probe left on the host is removed before the next
one is judged. Probes run in a bounded thread pool; the ones that measure
the machine run one at a time afterwards, and probes that snapshot the same
host file take a lock on it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import sqlite3
import stat
import string
import subprocess
import sys
import tempfile
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corral.errors import CorralError
from corral.sandbox import interrupts
from corral.verify.backends import (
    Backend,
    CorralBackend,
    RunSpec,
    make_backend,
    srt_settings,
    with_fault,
)
from corral.verify.canaries import CanarySet, kill_victim, plant_canaries, spawn_kill_victim
from corral.verify.hostcounters import host_sock_mem_bytes
from corral.verify.missions import (
    PROBE_OUT,
    changed_files,
    digests,
    render_mission,
    render_scenario,
)
from corral.verify.model import (
    Evidence,
    FileChanged,
    GitRepo,
    HostGit,
    IsDevice,
    JournalLacks,
    KernelLog,
    MissionSpec,
    MountedAt,
    Observed,
    PathExists,
    Probe,
    ProbeLimits,
    ProbeResult,
    SameInode,
    SetIdMode,
    Skipped,
    Symlink,
    TtyChanged,
    TtyInjected,
    VictimKilled,
    WriteFile,
)
from corral.verify.oracles import excerpt, verdict
from corral.verify.probes import PRELUDE, all_probes
from corral.verify.report import Report, judge_requirements

__all__ = [
    "Progress",
    "SuiteOptions",
    "VerifyError",
    "kill_marker",
    "marker_pids",
    "read_journal",
    "run_suite",
    "select_probes",
    "used_keys",
]

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "corral-verify",
    "GIT_AUTHOR_EMAIL": "verify@corral.invalid",
    "GIT_COMMITTER_NAME": "corral-verify",
    "GIT_COMMITTER_EMAIL": "verify@corral.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}
_HOST_GIT = (
    ["status", "--porcelain"],
    ["diff"],
    ["add", "-A"],
    ["commit", "-q", "-m", "corral-verify"],
)
_RAW_LIMIT = 4000
#: Backends whose sandboxes `corral run` can drive (the mission's `backend`).
_MISSION_BACKENDS = frozenset({"namespace", "gvisor"})
_NOT_FAST_PATH = (
    "the fast path serves `corral exec` only: `corral run` and `corral view` start their "
    "sandboxes in-process, and an injected fault wraps the front end's process while the "
    "launcher's worker runs in the launcher's own namespaces (see the namespace column)"
)
_TERMINAL_NOT_FAST_PATH = (
    "a terminal takes the Python path by design: the front end execs the Python CLI when a "
    "standard stream is a terminal (the pty relay must be in the foreground process group); "
    "see the namespace column"
)

Progress = Callable[[ProbeResult | Skipped, int, int], None]


class VerifyError(CorralError, RuntimeError):
    """The suite could not run (backend unavailable, setup failed)."""


@dataclass(frozen=True, slots=True)
class SuiteOptions:
    backend: str = "namespace"
    env: str = "agent"
    categories: tuple[str, ...] = ()
    probe_ids: tuple[str, ...] = ()
    jobs: int = 4
    workdir: str | None = None
    keep: bool = False
    netns: bool = True


#: Context keys the runner fills for every run (never missing); the second
#: line for mission probes (see MissionSpec).
_PER_RUN = frozenset(
    {"marker", "nonce", "ws", "ws_parent", "workspace", "kill_victim_pid"}
    | {"mission_dir", "checks_dir", "run_dir", "run_checks", "run_tools", "proof"}
)


def used_keys(p: Probe) -> set[str]:
    """Context keys a probe reads: P["key"] in its program and {key} in its
    host-side templates (per-run keys and secrets excluded)."""
    keys = set(re.findall(r'P\["([a-z0-9_]+)"\]', p.code))
    templates = [
        *p.allow,
        p.workspace or "",
        p.journal or "",
        p.broker_config or "",
        *(v for _, v in p.env),
    ]
    for item in (*p.steps, *p.checks):
        templates += [v for f in fields(item) if isinstance(v := getattr(item, f.name), str)]
    if p.mission is not None:
        m = p.mission
        templates += [m.front, m.say, *(t for pair in (*m.files, *m.checks_files) for t in pair)]
    for t in templates:
        keys |= {name for _, name, _, _ in string.Formatter().parse(t) if name}
    return {k for k in keys - _PER_RUN if not k.startswith("s_")}


def select_probes(categories: Iterable[str] = (), ids: Iterable[str] = ()) -> list[Probe]:
    """The catalogue filtered by category and id prefix (empty filters keep all)."""
    cats, pids = set(categories), tuple(ids)
    out = []
    for p in all_probes():
        if cats and p.category not in cats:
            continue
        if pids and not any(p.id == i or p.id.startswith(i) for i in pids):
            continue
        out.append(p)
    return out


# --- host process inspection ----------------------------------------------------


def _cmdlines(pid: str) -> Iterable[bytes]:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = f.read()
        if data:
            yield data
            return
        # A thread-group leader that exited while other threads run reads empty;
        # its live threads still show the command line.
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/cmdline", "rb") as f:
                yield f.read()


_LAUNCHERS = (b"bwrap", b"srt", b"node", b"socat", b"corral-verify-none")


def marker_pids(marker: str, *, exclude: Iterable[int] = ()) -> dict[int, str]:
    """Host pids whose command line carries `marker` (launchers excluded)."""
    needle = marker.encode()
    skip = {str(p) for p in exclude} | {str(os.getpid())}
    out: dict[int, str] = {}
    # A process that re-forks every few ms lives shorter than one scan of
    # /proc takes: it is gone when the scan reaches its listed pid, and its
    # successor is not listed yet. Its current pid is next to the last pid
    # the kernel handed out, so that neighbourhood is read first, directly.
    try:
        with open("/proc/sys/kernel/ns_last_pid", encoding="ascii") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 0
    recent = [str(n) for n in range(last + 8, max(last - 256, 0), -1)] if last else []
    seen: set[str] = set()
    for pid in [*recent, *(p for p in os.listdir("/proc") if p.isdigit())]:
        if pid in skip or pid in seen:
            continue
        seen.add(pid)
        for line in _cmdlines(pid):
            if needle not in line:
                continue
            argv = line.split(b"\0")
            head = os.path.basename(argv[0])
            if head in _LAUNCHERS or (b"corral" in argv[1:3] and b"exec" in argv[2:5]):
                break
            if head.startswith(b"corral-frontend-") and argv[1:2] == [b"exec"]:
                break  # the fast path's client (`--backend fastpath`)
            out[int(pid)] = line.replace(b"\0", b" ").decode("utf-8", "replace")[:200]
            break
    return out


def _survivors(marker: str, window_s: float = 1.0) -> tuple[str, ...]:
    """Command lines of marker processes; a process that re-forks every few ms
    can slip through one scan of /proc (more so on a loaded host), so scans are
    repeated for up to `window_s`; an empty answer costs the whole window."""
    deadline = time.monotonic() + window_s
    while True:
        found = marker_pids(marker)
        if found:
            return tuple(found.values())
        if time.monotonic() >= deadline:
            return ()
        time.sleep(0.005)


#: The neighbour sandbox's program: report ready, then wait to be stopped.
_NEIGHBOUR = "import sys, time\nprint('CORRAL-READY', flush=True)\ntime.sleep(60)\n"
_TIOCGEXCL = 0x80045440


def _tty_state(fd: int) -> tuple[object, ...]:
    """(window size, termios, exclusive flag) of a terminal."""
    import fcntl
    import struct

    try:
        excl = struct.unpack("i", fcntl.ioctl(fd, _TIOCGEXCL, b"\0" * 4))[0]
    except OSError:
        excl = -1
    return termios.tcgetwinsize(fd), termios.tcgetattr(fd), excl


def _tty_changes(before: tuple[object, ...], after: tuple[object, ...]) -> str:
    """What differs between two `_tty_state`s, in words ("" when nothing)."""
    out = []
    if before[0] != after[0]:
        out.append(f"window size {before[0]} -> {after[0]}")
    if before[1] != after[1]:
        out.append("termios (modes/echo)")
    if before[2] != after[2]:
        out.append(f"exclusive mode {before[2]} -> {after[2]}")
    return "; ".join(out)


_STATUS_FIELDS = ("Uid", "Gid", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp")


def _host_status(marker: str, pids: list[int] | None = None) -> list[dict[str, str]]:
    """Selected /proc/<pid>/status fields of the marker's processes (or of `pids`, the
    backend's host tasks), as the host sees them."""
    rows = []
    for pid in marker_pids(marker) if pids is None else pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="utf-8") as f:
            row = {"pid": str(pid)}
            for line in f:
                key, _, value = line.partition(":")
                if key in _STATUS_FIELDS:
                    row[key] = value.strip()
            rows.append(row)
    return rows


def _proc_usage(pid: int) -> tuple[int, float]:
    """(RSS bytes, CPU seconds) of one process, zero when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / tick
        rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return rss, cpu
    except (OSError, IndexError, ValueError):
        return 0, 0.0


class _Sampler:
    """Samples the marker's processes every 50 ms: peak count, peak RSS sum, CPU."""

    def __init__(self, marker: str, count: Callable[[], int | None] | None = None) -> None:
        self.marker = marker
        #: The backend's own count, for processes that are not host processes.
        self.count = count
        self.max_procs = 0
        self.peak_rss = 0
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            pids = marker_pids(self.marker)
            rss_sum = 0
            for pid in pids:
                rss, cpu = _proc_usage(pid)
                rss_sum += rss
                self.cpu[pid] = max(self.cpu.get(pid, 0.0), cpu)
            inside = self.count() if self.count is not None else None
            self.max_procs = max(self.max_procs, len(pids), inside or 0)
            self.peak_rss = max(self.peak_rss, rss_sum)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def kill_marker(marker: str, *, rounds: int = 40) -> int:
    """SIGSTOP then SIGKILL every marker process until none is left (a forking
    chain is frozen before it is killed); returns how many were killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = marker_pids(marker)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        killed |= set(pids)
        time.sleep(0.02)
    return len(killed)


# --- measuring cgroup (peers and baseline) --------------------------------------


class _MeasureCgroup:
    """A cgroup-v1 memory group under our own, with no limit: its kernel
    peak counter measures backends that have no cgroup of their own."""

    def __init__(self, name: str) -> None:
        self.path: str | None = None
        try:
            with open("/proc/self/cgroup", encoding="ascii") as f:
                for line in f:
                    _, ctrls, rel = line.rstrip("\n").split(":", 2)
                    if "memory" in ctrls.split(","):
                        base = f"/sys/fs/cgroup/memory{rel}"
                        if os.path.isdir(base):
                            os.mkdir(f"{base}/{name}")
                            self.path = f"{base}/{name}"
        except (OSError, ValueError):
            self.path = None

    def wrap(self, argv: list[str]) -> list[str]:
        if self.path is None:
            return argv
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.path, *argv]

    def peak(self) -> int | None:
        if self.path is None:
            return None
        with (
            contextlib.suppress(OSError, ValueError),
            open(f"{self.path}/memory.max_usage_in_bytes") as f,
        ):
            return int(f.read())
        return None

    def close(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.05)


# --- one probe run ------------------------------------------------------------------


def _fill(template: str, ctx: Mapping[str, Any]) -> str:
    return template.format_map(dict(ctx))


def _apply_step(step: Symlink | WriteFile | GitRepo, ctx: Mapping[str, Any]) -> None:
    match step:
        case Symlink(link=link, target=target):
            os.symlink(_fill(target, ctx), _fill(link, ctx))
        case WriteFile(path=path, content=content, mode=mode):
            p = _fill(path, ctx)
            with open(p, "w", encoding="utf-8") as f:
                f.write(_fill(content, ctx))
            os.chmod(p, mode)
        case GitRepo(path=path, git_dir=git_dir):
            ws = _fill(path, ctx)
            os.makedirs(ws, exist_ok=True)
            env = {**os.environ, **_GIT_ENV}
            with open(f"{ws}/README.txt", "w", encoding="utf-8") as f:
                f.write("corral verify\n")
            init = ["init", "-q"]
            if git_dir is not None:
                init.append(f"--separate-git-dir={_fill(git_dir, ctx)}")
            for args in (init, ["add", "README.txt"], ["commit", "-q", "-m", "init"]):
                subprocess.run(
                    ["git", "-C", ws, *args], env=env, capture_output=True, check=True, timeout=20
                )


def _snapshot(path: str) -> tuple[bool, bytes, int]:
    try:
        with open(path, "rb") as f:
            return True, f.read(), os.stat(path).st_mode
    except OSError:
        return False, b"", 0


def _restore(path: str, snap: tuple[bool, bytes, int]) -> None:
    existed, data, mode = snap
    with contextlib.suppress(OSError):
        if not existed:
            if os.path.lexists(path):
                os.unlink(path)
            return
        if _snapshot(path) != snap:
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, stat.S_IMODE(mode))


def _remove(path: str, marker: str) -> None:
    if marker not in path:
        return
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


def _kernel_log() -> bytes:
    """The host kernel log's records still in the ring buffer."""
    chunks = []
    with contextlib.suppress(OSError):
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            while True:
                try:
                    chunks.append(os.read(fd, 8192))
                except BlockingIOError:
                    break
                except OSError:
                    # EPIPE: a record was overwritten while reading; go on.
                    continue
        finally:
            os.close(fd)
    return b"".join(chunks)


def _mounted(path: str) -> bool:
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as f:
        return any(line.split()[4] == path for line in f)
    return False


def _kernel_audit() -> bool:
    from corral.doctor import kernel_audit_enabled

    return bool(kernel_audit_enabled())


def _hostgit() -> Any | None:
    """corral.hostgit when it offers TrustedRepo and safe_git, else None."""
    try:
        mod = importlib.import_module("corral.hostgit")
    except ImportError:
        return None
    if callable(getattr(mod, "safe_git", None)) and callable(getattr(mod, "TrustedRepo", None)):
        return mod
    return None


def _run_host_git(ws: str, git_dir: str, backend: Backend, *, plain: bool = False) -> None:
    """What the host does with the workspace afterwards: corral's own helper
    (a trusted repository outside the workspace: init, commit everything,
    status, diff) for corral backends; plain git with an identity for the
    others, which ship no host-side helper, and for every backend when
    `plain` (the user's own git after `corral exec`)."""
    if backend.kind == "corral" and not plain:
        hg = _hostgit()
        assert hg is not None
        repo = hg.TrustedRepo(git_dir=Path(git_dir), work_tree=Path(ws))
        steps: list[Callable[[], object]] = [
            repo.init,
            lambda: repo.commit_all("corral-verify"),
            lambda: hg.safe_git(git_dir, ws, ["status", "--porcelain"]),
            lambda: hg.safe_git(git_dir, ws, ["diff", "HEAD"]),
            lambda: hg.safe_git(git_dir, ws, ["add", "-A"]),
            lambda: repo.commit_all("corral-verify again"),
        ]
        for step in steps:
            # Only corral's declared git failure is expected; anything else is a
            # harness bug and must surface as an error, never as "denied".
            with contextlib.suppress(hg.GitError):
                step()
        return
    env = {**os.environ, **_GIT_ENV}
    for args in _HOST_GIT:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                ["git", "-C", ws, *args], env=env, capture_output=True, timeout=20, check=False
            )


def _kill_broker(journal: str | None, wait_s: float = 5.0) -> str | None:
    """SIGKILL the broker the journal names (`process_event` row, target
    `broker_start pid=N corral-broker`, committed before the command runs);
    "killed pid=N", or None when no live broker was found."""
    if journal is None:
        return None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for row in read_journal(journal) or ():
            target = str(row.get("target", ""))
            m = re.match(r"broker_start pid=(\d+)", target)
            if row.get("kind") != "process_event" or m is None:
                continue
            pid = int(m.group(1))
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                return None
            # Never signal a recycled pid: the broker's command line names corral.
            if b"corral" not in cmdline:
                return None
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                return f"killed pid={pid}"
            return None
        time.sleep(0.05)
    return None


def read_journal(path: str) -> tuple[dict[str, Any], ...] | None:
    """Every row of a journal file (SQLite, any table; or JSON lines), or None."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    rows: list[dict[str, Any]] = []
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
        try:
            tables = [
                r[0] for r in con.execute("select name from sqlite_master where type='table'")
            ]
            for t in tables:
                cur = con.execute(f'select * from "{t}"')
                names = [d[0] for d in cur.description]
                for r in cur:
                    row = dict(zip(names, r, strict=True))
                    for k, v in list(row.items()):
                        if isinstance(v, str) and v[:1] in "{[":
                            with contextlib.suppress(ValueError):
                                row[k] = json.loads(v)
                    rows.append(row)
        finally:
            con.close()
        return tuple(rows)
    except sqlite3.DatabaseError:
        pass
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    rows.append(obj)
    return tuple(rows)


def _results(stdout: str) -> list[dict[str, Any]]:
    """The probe's structured reports (`CORRAL-RESULT {json}` lines)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("CORRAL-RESULT "):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line[len("CORRAL-RESULT ") :]))
    return out


def _read_plain(path: Path, limit: int) -> str:
    """The first `limit` bytes of a regular file a sandbox may have written;
    never follows a link it planted ("" otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _tree_digests(root: Path) -> dict[str, str]:
    """Digest of every file's content below `root` by relative path (links by
    their target text, never followed; other non-regular entries by their type)."""
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in [*filenames, *links]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                files[rel] = b"symlink:" + os.readlink(full).encode()
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    files[rel] = f.read()
            else:
                files[rel] = b"type:%o" % stat.S_IFMT(st.st_mode)
    return digests(files)


def _run_facts(run_dir: Path, exit_code: int | None) -> dict[str, Any]:
    """What a mission run left on the host: state, checks and report (read-only)."""
    from corral.run.store import Store

    facts: dict[str, Any] = {
        "mission_exit": exit_code,
        "run_state": None,
        "mission_checks": [],
        "report_md": _read_plain(run_dir / "report.md", 1 << 20),
    }
    if not (run_dir / "state.sqlite").is_file():
        return facts
    with (
        contextlib.suppress(CorralError, sqlite3.Error),
        Store(run_dir / "state.sqlite", readonly=True) as store,
    ):
        run = store.run()
        facts["run_state"] = run.state
        facts["end_reason"] = run.end_reason
        facts["mission_checks"] = [
            {
                "session": s.n,
                "name": c.name,
                "passed": c.passed,
                "reason": c.reason,
                "exit": c.exit,
                "output": c.output,
            }
            for s in store.sessions()
            for c in store.checks(s.n)
        ]
        facts["mission_sessions"] = [
            {
                "n": s.n,
                "state": s.state,
                "commit": s.commit_sha,
                "files": _commit_files(run_dir / "git", run_dir / "workspace", s.commit_sha),
                "snapshot": (run_dir / "snapshots" / f"session-{s.n}").is_dir(),
                "tokens": s.tokens,
                "end_reason": s.end_reason,
            }
            for s in store.sessions()
        ]
    facts["provider_replies"] = _provider_replies(run_dir / "transcripts" / "provider.jsonl")
    return facts


def _provider_replies(path: Path) -> int | None:
    """How many replies the synthetic provider served (its host-side transcript)."""
    if not path.is_file():
        return None
    text = _read_plain(path, 16 << 20)
    n = 0
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            n += isinstance(rec, dict) and rec.get("kind") == "reply"
    return n


def _commit_files(git_dir: Path, work_tree: Path, commit: str | None) -> list[str]:
    """Paths in `commit` of corral's own repository of the run (hardened git)."""
    if not commit or not git_dir.is_dir():
        return []
    from corral.hostgit import safe_git

    try:
        out = safe_git(git_dir, work_tree, ["ls-tree", "-r", "-z", "--name-only", commit])
    except CorralError:
        return []
    return sorted(p.decode("utf-8", "replace") for p in out.split(b"\0") if p)


def _host_markers(hits: str, marker: str) -> list[str] | None:
    """Names in the host's `hits` directory starting with `marker` (None when unreadable)."""
    try:
        return sorted(n for n in os.listdir(hits) if n.startswith(marker))
    except OSError:
        return None


def _end_probe_on_error(marker: str) -> Callable[..., bool]:
    def end(exc_type: type[BaseException] | None, *_: object) -> bool:
        if exc_type is not None:
            kill_marker(marker)
            _sweep_run(marker)
        return False

    return end


def _sweep_run(run_id: str) -> None:
    """Kill and remove whatever a killed coordinator left of the run's cgroups."""
    from corral.run.runcg import RunCgroup

    with contextlib.suppress(CorralError, OSError):
        cg = RunCgroup.detect(run_id)
        if cg is not None and cg.exists():
            cg.sweep()


@dataclass
class _Proc:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)


def _reader(stream: Any, sink: list[str], ready: threading.Event | None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        sink.append(line)
        if ready is not None and line.startswith("CORRAL-READY"):
            ready.set()
    stream.close()


class _Suite:
    def __init__(self, opts: SuiteOptions, backend: Backend, cs: CanarySet) -> None:
        self.opts = opts
        self.backend = backend
        self.cs = cs
        self.caller_env = {**os.environ, **cs.env, **backend.exec_env()}
        self.broker_reason: str | None = None
        self.journal_reason: str | None = None
        #: A neighbour sandbox's marker -> the host pid that started it.
        self._neighbours: dict[str, int] = {}

    # -- preflight ----------------------------------------------------------------

    def _trial(
        self, name: str, *, allow: tuple[str, ...] = (), journal: str | None = None
    ) -> tuple[int, str]:
        """Run a trivial command through the backend; (0, "") when it printed."""
        ws = f"{self.cs.root}/ws/.preflight-{name}"
        os.makedirs(ws, exist_ok=True)
        settings = self._settings(ws, allow, name)
        run = RunSpec(ws, ProbeLimits(), allow, journal, self.opts.env, settings)
        argv = self.backend.argv([PY, "-I", "-S", "-c", "print('corral-verify-ok')"], run)
        try:
            p = subprocess.run(
                argv,
                cwd=ws,
                env=self.caller_env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return 1, str(exc)
        _, err = self.backend.report(p.stderr)
        if "corral-verify-ok" in p.stdout:
            return 0, ""
        return p.returncode or 1, (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]

    def preflight(self) -> None:
        """Refuse a backend that cannot run anything; find out whether corral's
        `--allow` (broker) and `--journal` work, so that probes needing them
        are reported as not tested rather than failed."""
        code, why = self._trial("plain")
        if code != 0:
            raise VerifyError(f"backend {self.backend.name} cannot run a trivial command: {why}")
        if self.backend.kind != "corral":
            return
        host = self.cs.ctx.get("http_a_host", "127.0.0.1")
        code, why = self._trial("allow", allow=(f"{host}:{self.cs.ctx.get('http_a_port', 80)}",))
        if code != 0:
            self.broker_reason = f"`corral exec --allow` failed the preflight run: {why}"
        journal = f"{self.cs.root}/journals/preflight.sqlite"
        code, why = self._trial("journal", journal=journal)
        if code != 0:
            self.journal_reason = f"`corral exec --journal` failed the preflight run: {why}"

    def _broker_config(self, p: Probe, ctx: Mapping[str, Any], marker: str) -> str | None:
        """The probe's corral.toml, written outside every workspace (corral
        refuses a config the sandbox could write); None for other backends."""
        if p.broker_config is None or self.backend.kind != "corral":
            return None
        path = f"{self.cs.root}/configs/{marker}.toml"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(_fill(p.broker_config, ctx))
        return path

    def _settings(self, ws: str, allow: tuple[str, ...], name: str) -> str:
        """The settings file of a backend configured by file (srt), else ""."""
        if not self.backend.needs_settings():
            return ""
        path = f"{self.cs.root}/settings-{name}.json"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(srt_settings(ws, allow), f)
        return path

    # -- selection ------------------------------------------------------------------

    def skip_reason(self, p: Probe) -> Skipped | None:
        if p.skip:
            return Skipped(p, "not-tested", p.skip)
        na = self.backend.not_applicable_probes().get(p.id)
        if na is not None:
            return Skipped(p, "not-applicable", na)
        if p.mission is not None and self.backend.kind != "corral":
            return Skipped(
                p,
                "not-applicable",
                "a mission probe tests corral's run environments (agent, product, verifier), "
                f"which {self.backend.name} does not have",
            )
        if self.backend.name == "fastpath":
            if p.mission is not None or p.viewer or p.fault is not None:
                return Skipped(p, "not-applicable", _NOT_FAST_PATH)
            if "pty" in p.needs:
                return Skipped(p, "not-applicable", _TERMINAL_NOT_FAST_PATH)
        if p.mission is not None and self.backend.name not in _MISSION_BACKENDS:
            return Skipped(
                p, "not-tested", "`corral run` drives namespace and gvisor sandboxes only"
            )
        if p.viewer and self.backend.name not in ("namespace", "gvisor", "none"):
            return Skipped(
                p, "not-tested", "`corral view` drives namespace and gvisor products only"
            )
        for key in sorted(set(p.uses) | used_keys(p)):
            if key in self.cs.absent:
                return Skipped(p, "not-applicable", self.cs.absent[key])
            if key not in self.cs.ctx:
                return Skipped(
                    p, "not-tested", self.cs.missing.get(key, f"canary {key} was not planted")
                )
        if "kill-victim" in p.needs and p.id == "proc-signal-all" and not self.backend.pidns:
            return Skipped(
                p, "not-applicable", "kill(-1) without a PID namespace would hit every host process"
            )
        if "kernel-audit" in p.needs and not _kernel_audit():
            from corral.broker.kernel_denials import unavailable_reason

            why = unavailable_reason() or "kernel audit is off"
            return Skipped(
                p,
                "not-applicable",
                f"{why}: the kernel reports no seccomp or Landlock denial that anyone could "
                "journal (the denials themselves hold)",
            )
        if self.backend.kind == "peer":
            if "corral-options" in p.needs:
                return Skipped(
                    p,
                    "not-applicable",
                    f"the attack goes through a corral exec option {self.backend.name} lacks",
                )
            if "faults" in p.needs:
                return Skipped(
                    p,
                    "not-applicable",
                    f"the injected fault removes a layer {self.backend.name} does not have",
                )
            if p.during == "kill-broker":
                return Skipped(
                    p,
                    "not-tested",
                    f"the suite cannot tell {self.backend.name}'s proxy process apart to kill it",
                )
        if self.backend.kind == "corral":
            if "hostgit" in p.needs and _hostgit() is None:
                return Skipped(
                    p, "not-tested", "corral.hostgit (safe_git, TrustedRepo) cannot be imported"
                )
            if "broker" in p.needs and self.broker_reason:
                return Skipped(p, "not-tested", self.broker_reason)
            if "journal" in p.needs and self.journal_reason:
                return Skipped(p, "not-tested", self.journal_reason)
        return None

    # -- running ---------------------------------------------------------------------

    def run(self, p: Probe) -> ProbeResult | Skipped:
        marker = "cvm" + secrets.token_hex(5)
        nonce = secrets.token_hex(8)
        ws = f"{self.cs.root}/ws/{p.id}"
        if os.path.lexists(ws):
            shutil.rmtree(ws)
        os.makedirs(ws)
        ctx: dict[str, Any] = {
            **self.cs.ctx,
            "marker": marker,
            "nonce": nonce,
            "ws": ws,
            "ws_parent": f"{self.cs.root}/ws",
            "guest_kernel": self.backend.guest_kernel or "",
            "slow": self.backend.time_scale,
        }
        workspace = _fill(p.workspace, ctx) if p.workspace else ws
        ctx["workspace"] = workspace
        with ExitStack() as stack:
            # Interrupted (^C, SIGTERM) or failed: the probe's processes are in
            # sessions of their own, so nothing else would end them.
            stack.push(_end_probe_on_error(marker))
            victim = None
            if "kill-victim" in p.needs:
                victim = spawn_kill_victim()
                ctx["kill_victim_pid"] = victim.pid
                stack.callback(kill_victim, victim)
            if p.mission is not None:
                return self._execute_mission(p, p.mission, ctx=ctx, marker=marker)
            if p.viewer:
                return self._execute_viewer(p)
            for step in p.steps:
                _apply_step(step, ctx)
            snaps = {
                c.path: _snapshot(_fill(c.path, ctx))
                for c in p.checks
                if isinstance(c, FileChanged)
            }
            return self._execute(
                p,
                ctx=ctx,
                marker=marker,
                workspace=workspace,
                victim=victim,
                snaps=snaps,
                stack=stack,
            )

    def _journal_path(self, p: Probe, ctx: Mapping[str, Any]) -> str | None:
        if p.journal is not None:
            return _fill(p.journal, ctx)
        if "journal" in p.needs and self.backend.kind == "corral":
            return f"{self.cs.root}/journals/{ctx['marker']}.sqlite"
        return None

    def _execute(
        self,
        p: Probe,
        *,
        ctx: dict[str, Any],
        marker: str,
        workspace: str,
        victim: subprocess.Popen[bytes] | None,
        snaps: dict[str, tuple[bool, bytes, int]],
        stack: ExitStack,
    ) -> ProbeResult | Skipped:
        secrets_map = {**self.cs.secrets}
        env = dict(self.caller_env)
        fill_env = {**ctx, **{f"s_{k}": v for k, v in secrets_map.items()}}
        for k, v in p.env:
            env[k] = _fill(v, fill_env)
        journal = self._journal_path(p, ctx)
        allow = tuple(_fill(a, ctx) for a in p.allow)
        settings = self._settings(workspace, allow, marker)
        config = self._broker_config(p, ctx, marker)
        run = RunSpec(
            workspace,
            p.limits,
            allow,
            journal,
            self.opts.env,
            settings,
            config,
            tuple(_fill(a, ctx) for a in p.exec_args) if self.backend.kind == "corral" else (),
        )
        params = {k: v for k, v in ctx.items() if isinstance(v, str | int | float)}
        program = f"import json\nP = json.loads({json.dumps(params)!r})\n{PRELUDE}\n{p.code}"
        argv = with_fault(p.fault, self.backend.argv([PY, "-I", "-S", "-c", program, marker], run))
        cgroup = None
        if p.sample and self.backend.kind != "corral":
            cgroup = _MeasureCgroup(f"corral-verify-{marker}")
            stack.callback(cgroup.close)
            argv = cgroup.wrap(argv)
        stdin: int = subprocess.DEVNULL
        pty_fds: tuple[int, int] | None = None
        tty_before: tuple[object, ...] | None = None
        if "pty" in p.needs:
            pty_fds = os.openpty()
            tty.setraw(pty_fds[1])
            termios.tcsetwinsize(pty_fds[0], (24, 80))
            tty_before = _tty_state(pty_fds[1])
            stdin = pty_fds[1]
            for fd in pty_fds:
                stack.callback(os.close, fd)
        neighbour = self._start_neighbour(p, stack) if "neighbour" in p.needs else None
        pass_fds = (self.cs.inherited_fd,) if "fd" in p.needs and self.cs.inherited_fd >= 0 else ()
        owner: list[int] = []
        sampler = (
            _Sampler(marker, lambda: self.backend.inside_count(owner[0]) if owner else None)
            if p.sample
            else None
        )
        io = _Proc()
        started = time.monotonic()
        sock_before = host_sock_mem_bytes()
        # Until the child has exec'd it does not carry the marker the cleanup
        # kills by: an interrupt waits (verify.stop).
        with interrupts.deferred():
            proc = subprocess.Popen(
                argv,
                cwd=workspace,
                env=env,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                start_new_session=True,
            )
        owner.append(proc.pid)
        readers = [
            threading.Thread(target=_reader, args=(proc.stdout, io.stdout, io.ready), daemon=True),
            threading.Thread(target=_reader, args=(proc.stderr, io.stderr, None), daemon=True),
        ]
        for t in readers:
            t.start()
        if sampler:
            sampler.start()
        harness_timeout = False
        inspected: list[dict[str, str]] = []
        sock_grown = 0
        neighbour_status: list[dict[str, str]] = []
        broker_kill: str | None = None
        if p.during is not None and io.ready.wait(15):
            if p.during == "inspect":
                sock_grown = host_sock_mem_bytes() - sock_before
                inspected = _host_status(marker, self.backend.host_tasks(proc.pid))
                if neighbour is not None:
                    nb_pid = self._neighbours.get(neighbour, 0)
                    neighbour_status = _host_status(neighbour, self.backend.host_tasks(nb_pid))
            elif p.during == "kill-broker":
                broker_kill = _kill_broker(journal) if self.backend.kind == "corral" else "none"
            else:
                with contextlib.suppress(OSError):
                    os.kill(
                        proc.pid, signal.SIGKILL if p.during == "kill-backend" else signal.SIGTERM
                    )
        try:
            proc.wait(p.deadline_s * self.backend.deadline_scale)
        except subprocess.TimeoutExpired:
            harness_timeout = True
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        wall = time.monotonic() - started
        # A survivor may hold the pipes open; do not wait for it past a moment.
        for t in readers:
            t.join(1.0)
        if p.grace_s:
            time.sleep(p.grace_s)
        if sampler:
            sampler.stop()
        # Only survivor probes pay for the long scan window (see _survivors).
        survivors = _survivors(marker, 1.0 if p.category == "processes" else 0.06)
        facts = self._facts(
            p,
            ctx=ctx,
            marker=marker,
            victim=victim,
            snaps=snaps,
            pty_fds=pty_fds,
            tty_before=tty_before,
        )
        if p.during == "inspect":
            facts["host_status"] = inspected
            facts["host_sock_grown_bytes"] = sock_grown
        if neighbour is not None:
            facts["neighbour_status"] = neighbour_status
        if p.during == "kill-broker":
            facts["broker_kill"] = broker_kill or "not-found"
        kill_marker(marker)
        for t in readers:
            t.join(2.0)
        stdout, stderr_all = "".join(io.stdout), "".join(io.stderr)
        report, stderr = self.backend.report(stderr_all)
        results = _results(stdout)
        ev = Evidence(
            stdout=stdout,
            stderr=stderr,
            exit=proc.returncode,
            wall_s=wall,
            harness_timeout=harness_timeout,
            backend_report=report,
            results=tuple(results),
            hits=self.cs.hub.hits_for(marker),
            survivors=survivors,
            facts=facts,
            max_procs=sampler.max_procs if sampler else 0,
            peak_rss=sampler.peak_rss if sampler else 0,
            cpu_s=sum(sampler.cpu.values()) if sampler else 0.0,
            cgroup_peak=cgroup.peak() if cgroup else None,
            journal=read_journal(journal) if journal else None,
            secrets=secrets_map,
            ctx=ctx,
            vmm_overhead_mib=self.backend.vmm_overhead_mib,
        )
        self._cleanup(p, ctx, marker, snaps)
        return self._judge(p, ev, wall)

    def _execute_viewer(self, p: Probe) -> ProbeResult | Skipped:
        """The M11 attack (`--backend none`: the product opened directly)."""
        from corral.verify.viewer_drive import drive

        started = time.monotonic()
        try:
            baseline = self.backend.kind == "baseline"
            facts = drive(baseline, "namespace" if baseline else self.backend.name)
        except Exception as exc:  # the probe could not run: an error, never "denied"
            facts, err = {}, f"the viewer drive failed: {exc!r}"[:300]
        else:
            err = ""
        wall = time.monotonic() - started
        ev = Evidence(
            stdout="CORRAL-START" if facts else "",
            stderr=err,
            exit=0,
            wall_s=wall,
            facts=facts,
            secrets={**self.cs.secrets},
        )
        return self._judge(p, ev, wall)

    def _execute_mission(
        self, p: Probe, m: MissionSpec, *, ctx: dict[str, Any], marker: str
    ) -> ProbeResult | Skipped:
        """Write the mission, run `corral run` on it (bounded by the probe's
        deadline), then judge from the run directory on the host."""
        base = Path(self.cs.root) / "missions" / marker
        mdir, runs = base / "mission", base / "runs"
        run_dir = runs / marker
        ctx.update(
            mission_dir=str(mdir),
            checks_dir=str(mdir / "checks"),
            run_dir=str(run_dir),
            run_checks=str(run_dir / "checks"),
            run_tools=str(run_dir / "tools"),
        )
        params = {k: v for k, v in ctx.items() if isinstance(v, str | int | float)}
        program = f"import json\nP = json.loads({json.dumps(params)!r})\n{PRELUDE}\n{p.code}"
        # Host-only: in the checks and the mission's check tables, never in
        # the program, the scenario or the agent's prompt.
        ctx["proof"] = "cvp" + secrets.token_hex(8)
        (mdir / "checks").mkdir(parents=True)
        written = {name: _fill(text, ctx).encode() for name, text in m.checks_files}
        for name, data in written.items():
            (mdir / "checks" / name).write_bytes(data)
        expected = digests(written)
        (mdir / "MISSION.md").write_text(
            render_mission(p.id, m, ctx, self.backend.name), encoding="utf-8"
        )
        (mdir / "scenario.yaml").write_text(
            render_scenario(m, ctx, program=program, marker=marker), encoding="utf-8"
        )
        from corral.run import coordinator

        argv = [sys.executable, "-m", "corral", "run", str(mdir / "MISSION.md"), "--plain"]
        argv += ["--runs-dir", str(runs), "--id", marker]
        started = time.monotonic()
        with interrupts.deferred():
            proc = subprocess.Popen(
                argv,
                cwd=base,
                env=self.caller_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        harness_timeout = False
        try:
            out, _ = proc.communicate(timeout=p.deadline_s * self.backend.deadline_scale)
        except subprocess.TimeoutExpired:
            harness_timeout = True
            # SIGTERM is `corral stop`: the coordinator kills the run's cgroups itself.
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate(timeout=10)
        wall = time.monotonic() - started
        survivors = _survivors(marker, 0.06)
        _sweep_run(marker)
        kill_marker(marker)
        facts = _run_facts(run_dir, proc.returncode)
        if m.host_views:
            from corral.verify.host_views import collect

            facts.update(collect(run_dir))
        if "hits" in ctx:
            facts["host_markers"] = markers = _host_markers(str(ctx["hits"]), marker)
            for name in markers or ():
                _remove(os.path.join(str(ctx["hits"]), name), marker)
        checker = {
            "http_check.py": coordinator.HTTP_CHECKER.read_bytes(),
            "check_run.py": coordinator.CHECK_RUNNER.read_bytes(),
        }
        changed = [f"mission {c}" for c in changed_files(expected, _tree_digests(mdir / "checks"))]
        # The run's copies exist only once `corral run` got that far.
        if (run_dir / "checks").is_dir():
            copy = _tree_digests(run_dir / "checks")
            changed += [f"run {c}" for c in changed_files(expected, copy)]
        if (run_dir / "tools" / "http_check.py").exists():
            tools = {k: v for k, v in _tree_digests(run_dir / "tools").items() if k in checker}
            changed += [f"tools {c}" for c in changed_files(digests(checker), tools)]
        facts["checks_changed"] = changed
        journal = None
        if (run_dir / "journal.sqlite").is_file():
            from corral.broker.journal import read_rows

            with contextlib.suppress(CorralError, sqlite3.Error):
                journal = tuple(r.to_json_dict() for r in read_rows(run_dir / "journal.sqlite"))
        ev = Evidence(
            stdout=_read_plain(run_dir / "workspace" / PROBE_OUT, 65536),
            stderr=out.decode("utf-8", "replace")[-_RAW_LIMIT:],
            exit=proc.returncode,
            wall_s=wall,
            harness_timeout=harness_timeout,
            results=tuple(_results(_read_plain(run_dir / "workspace" / PROBE_OUT, 65536))),
            survivors=survivors,
            facts=facts,
            journal=journal,
            secrets={**self.cs.secrets},
            ctx=ctx,
        )
        if not self.opts.keep:
            shutil.rmtree(base, ignore_errors=True)
        return self._judge(p, ev, wall)

    def _facts(
        self,
        p: Probe,
        *,
        ctx: Mapping[str, Any],
        marker: str,
        victim: subprocess.Popen[bytes] | None,
        snaps: Mapping[str, tuple[bool, bytes, int]],
        pty_fds: tuple[int, int] | None,
        tty_before: tuple[object, ...] | None = None,
    ) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        for c in p.checks:
            match c:
                case PathExists(key=key, path=path):
                    facts[key] = os.path.lexists(_fill(path, ctx))
                case FileChanged(key=key, path=path):
                    facts[key] = _snapshot(_fill(path, ctx)) != snaps[path]
                case SameInode(key=key, path=path, target=target):
                    try:
                        a, b = os.lstat(_fill(path, ctx)), os.stat(_fill(target, ctx))
                        facts[key] = (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)
                    except OSError:
                        facts[key] = False
                case IsDevice(key=key, path=path):
                    try:
                        mode = os.lstat(_fill(path, ctx)).st_mode
                        facts[key] = stat.S_ISBLK(mode) or stat.S_ISCHR(mode)
                    except OSError:
                        facts[key] = False
                case MountedAt(key=key, path=path):
                    facts[key] = _mounted(_fill(path, ctx))
                case VictimKilled(key=key):
                    facts[key] = victim is not None and kill_victim(victim)
                case HostGit(key=key, plain=plain, path=path):
                    hit = f"{ctx['hits']}/{marker}"
                    _run_host_git(
                        _fill(path, ctx),
                        f"{self.cs.root}/trusted-git/{marker}",
                        self.backend,
                        plain=plain,
                    )
                    facts[key] = os.path.lexists(hit)
                    _remove(hit, marker)
                case KernelLog(key=key):
                    facts[key] = marker.encode() in _kernel_log()
                case SetIdMode(key=key, path=path):
                    try:
                        mode = os.lstat(_fill(path, ctx)).st_mode
                        regular = stat.S_ISREG(mode) or stat.S_ISDIR(mode)
                        facts[key] = regular and bool(mode & (stat.S_ISUID | stat.S_ISGID))
                    except OSError:
                        facts[key] = False
                case JournalLacks(key=key, path=path, words=words):
                    need = [_fill(w, ctx).lower() for w in words]
                    rows = read_journal(_fill(path, ctx)) or ()
                    texts = [json.dumps(r, sort_keys=True, default=str).lower() for r in rows]
                    facts[key] = not any(all(w in t for w in need) for t in texts)
                case TtyInjected(key=key):
                    data = b""
                    if pty_fds is not None:
                        os.set_blocking(pty_fds[1], False)
                        with contextlib.suppress(OSError):
                            data = os.read(pty_fds[1], 65536)
                        termios.tcflush(pty_fds[1], termios.TCIFLUSH)
                    facts[key] = marker.encode() in data
                case TtyChanged(key=key):
                    facts[key] = ""
                    if pty_fds is not None and tty_before is not None:
                        facts[key] = _tty_changes(tty_before, _tty_state(pty_fds[1]))
        return facts

    def _start_neighbour(self, p: Probe, stack: ExitStack) -> str | None:
        """A second sandbox of this backend that waits alongside the probe; its marker.

        None when it did not come up (the oracle then finds no neighbour to
        compare with and says so).
        """
        nb = "cvn" + secrets.token_hex(5)
        ws = f"{self.cs.root}/ws/{p.id}-neighbour"
        if os.path.lexists(ws):
            shutil.rmtree(ws)
        os.makedirs(ws)
        run = RunSpec(ws, ProbeLimits(), (), None, self.opts.env, self._settings(ws, (), nb))
        argv = self.backend.argv([PY, "-I", "-S", "-c", _NEIGHBOUR, nb], run)
        # Its marker is not the probe's: the cleanup below is registered before
        # an interrupt may land.
        with interrupts.deferred():
            proc = subprocess.Popen(
                argv,
                cwd=ws,
                env=dict(self.caller_env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            stack.callback(kill_marker, nb)
        self._neighbours[nb] = proc.pid

        def stop() -> None:
            with contextlib.suppress(OSError):
                proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            kill_marker(nb)
            assert proc.stdout is not None
            proc.stdout.close()

        stack.callback(stop)
        assert proc.stdout is not None
        out = b""
        deadline = time.monotonic() + 15
        while b"CORRAL-READY" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
        return nb if b"CORRAL-READY" in out else None

    def _cleanup(
        self,
        p: Probe,
        ctx: Mapping[str, Any],
        marker: str,
        snaps: Mapping[str, tuple[bool, bytes, int]],
    ) -> None:
        for c in p.checks:
            match c:
                case (
                    PathExists(path=path)
                    | SameInode(path=path)
                    | IsDevice(path=path)
                    | SetIdMode(path=path)
                ):
                    _remove(_fill(path, ctx), marker)
                case FileChanged(path=path):
                    _restore(_fill(path, ctx), snaps[path])
                case MountedAt(path=path):
                    target = _fill(path, ctx)
                    for _ in range(5):
                        if not _mounted(target):
                            break
                        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
                case _:
                    pass

    def _judge(self, p: Probe, ev: Evidence, wall: float) -> ProbeResult | Skipped:
        baseline = self.backend.kind == "baseline"
        started = "CORRAL-START" in ev.stdout
        if not started and not p.refusal_ok and self.backend.kind == "peer":
            # A peer that refuses the configuration a probe needs (srt rejects
            # some allowlist entries) has not been tested by that probe.
            lines = ev.stderr.strip().splitlines() or [f"exit {ev.exit}"]
            text = next((ln for ln in lines if "rror" in ln), lines[-1])[:200]
            return Skipped(
                p, "not-tested", f"{self.backend.name} refused to run this configuration: {text}"
            )
        observed: Observed
        if not started and not p.refusal_ok:
            why = (ev.stderr.strip().splitlines() or [f"exit {ev.exit}"])[-1][:200]
            observed, reason = "error", f"the probe never started: {why}"
        else:
            j = p.oracle.judge(ev)
            observed, reason = j.observed, j.why
            if not started:
                reason += " (the backend refused to start the command)"
        if ev.harness_timeout:
            reason += (
                f" [killed by the suite after {p.deadline_s * self.backend.deadline_scale:.0f} s]"
            )
        v = verdict(p.expected, observed, baseline=baseline, exempt=p.baseline is not None)
        if v == "broken-probe" and p.baseline:
            reason += f" (note: {p.baseline})"
        needles = ("CORRALCANARY", "CORRALTOKEN", "CORRAL-RESULT", "corral exec")
        evidence = reason
        ex = excerpt(ev.stdout, needles)
        if ex:
            evidence += f" | out: {ex}"
        raw = {
            "exit": ev.exit,
            "wall_s": round(ev.wall_s, 3),
            "stdout": excerpt(ev.stdout, needles, _RAW_LIMIT),
            "stderr": ev.stderr[-_RAW_LIMIT:],
            "backend_report": ev.backend_report,
            "results": list(ev.results),
            "hits": [{"server": h.server, "detail": h.detail} for h in ev.hits],
            "survivors": list(ev.survivors),
            "facts": dict(ev.facts),
            "max_procs": ev.max_procs,
            "peak_rss": ev.peak_rss,
            "cpu_s": round(ev.cpu_s, 3),
            "cgroup_peak": ev.cgroup_peak,
            "journal_rows": None if ev.journal is None else len(ev.journal),
        }
        return ProbeResult(p, observed, v, evidence, wall, raw)


def run_suite(opts: SuiteOptions, progress: Progress | None = None) -> Report:
    """Run the selected probes against `opts.backend`; never raises for a probe
    failure (that is a result), only `VerifyError` when the suite cannot run."""
    probes = select_probes(opts.categories, opts.probe_ids)
    if not probes:
        raise VerifyError("no probe matches the selection")
    backend = make_backend(opts.backend)
    why = backend.unavailable()
    if why:
        raise VerifyError(f"backend {opts.backend} is unavailable: {why}")
    root = opts.workdir or tempfile.mkdtemp(prefix="corral-verify-", dir="/var/tmp")
    if opts.workdir and os.path.exists(root) and os.listdir(root):
        raise VerifyError(f"workdir {root} is not empty")
    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    results: list[ProbeResult] = []
    skipped: list[Skipped] = []
    lock = threading.Lock()
    total = len(probes)
    with ExitStack() as stack:
        if not os.path.exists(root):
            os.makedirs(root)
        if not opts.keep:
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        mcp = any("mcp_port" in used_keys(p) for p in probes)
        cs = stack.enter_context(
            plant_canaries(root, netns=opts.netns, mcp=mcp, mcp_sandbox=backend.kind == "corral")
        )
        # No `stack.pop_all()` for --keep: the popped stack would be dropped,
        # and collecting plant_canaries' generator runs its cleanup at once
        # (hits/, journals/ gone mid-suite). --keep only skips the rmtree above.
        stack.enter_context(backend.session())
        suite = _Suite(opts, backend, cs)
        suite.preflight()
        runnable: list[Probe] = []
        for p in probes:
            sk = suite.skip_reason(p)
            if sk is None:
                runnable.append(p)
                continue
            skipped.append(sk)
            if progress:
                progress(sk, len(results) + len(skipped), total)

        # Probes that snapshot and restore the same host file must not overlap.
        file_locks = {
            c.path: threading.Lock()
            for p in runnable
            for c in p.checks
            if isinstance(c, FileChanged)
        }

        def one(p: Probe) -> None:
            paths = sorted({c.path for c in p.checks if isinstance(c, FileChanged)})
            with ExitStack() as held:
                for path in paths:
                    held.enter_context(file_locks[path])
                try:
                    r = suite.run(p)
                except Exception as exc:
                    r = ProbeResult(
                        p,
                        "error",
                        "broken-probe" if backend.kind == "baseline" else "unexpected",
                        f"the suite failed to run this probe: {type(exc).__name__}: {exc}",
                        0.0,
                        {},
                    )
            with lock:
                if isinstance(r, Skipped):
                    skipped.append(r)
                else:
                    results.append(r)
                if progress:
                    progress(r, len(results) + len(skipped), total)

        serial = [p for p in runnable if p.serial]
        parallel = [p for p in runnable if not p.serial]
        t1 = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            list(pool.map(one, parallel))
        t2 = time.monotonic()
        for p in serial:
            one(p)
        timing = (
            f"setup {t1 - t0:.1f} s, {len(parallel)} probes in parallel ({opts.jobs} jobs) "
            f"{t2 - t1:.1f} s, {len(serial)} serial {time.monotonic() - t2:.1f} s"
        )
    order = {p.id: i for i, p in enumerate(probes)}
    results.sort(key=lambda r: order[r.probe.id])
    skipped.sort(key=lambda s: order[s.probe.id])
    reqs = judge_requirements(results, skipped, backend.not_applicable())
    notes = [f"workdir: {root}" + (" (kept)" if opts.keep else " (removed)"), timing]
    if isinstance(backend, CorralBackend):
        for r in (suite.broker_reason, suite.journal_reason):
            if r:
                notes.append(r)
    return Report(
        backend=opts.backend,
        env=opts.env,
        started=started_at.isoformat(timespec="seconds"),
        wall_s=time.monotonic() - t0,
        results=tuple(results),
        skipped=tuple(skipped),
        requirements=reqs,
        notes=tuple(notes),
        python=sys.version.split()[0],
    )
