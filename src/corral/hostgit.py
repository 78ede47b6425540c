"""Git on agent workspaces, from the host, without running anything they planted (M6).

A workspace is hostile: its `.git/config` may set `core.fsmonitor`,
`diff.external`, `filter.*.clean`, `core.sshCommand`, a pager; its
`.git/hooks` may hold scripts; `.gitattributes` may name drivers. Corral
therefore never uses the workspace's own repository. It keeps a *trusted*
git directory outside the workspace (`GIT_DIR`), points `GIT_WORK_TREE` at
the workspace, and runs git with

* no system, global or XDG config (`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`,
  a `HOME` with nothing in it) and no inherited `GIT_*` variable;
* command-running settings forced off on the command line (`core.hooksPath=/dev/null`,
  `core.fsmonitor=false`, `core.pager=cat`, `core.sshCommand=false`,
  `credential.helper=`, `protocol.allow=never`), and `--no-ext-diff --no-textconv`
  added to every diffing subcommand (diff.external can only be unset that way);
* a trusted config that defines no filter, diff or merge driver, so attributes in
  the work tree that name one have nothing to run.

The workspace's own `.git` directory is never read as a repository: git skips
any path component named `.git` when it walks the work tree.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from corral.errors import CorralError
from corral.pauseclock import Clock, Deadline

__all__ = [
    "DEFAULT_GIT_BUDGET",
    "GitBudget",
    "GitBudgetError",
    "GitError",
    "TrustedRepo",
    "hardened_env",
    "safe_git",
]

_FORCED_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.pager", "cat"),
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("core.editor", "false"),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("user.name", "corral"),
    ("user.email", "corral@localhost"),
    ("init.defaultBranch", "main"),
    ("safe.directory", "*"),
    # Blobs past this are streamed by hash-object and archive instead of read
    # (or mapped) whole: a sparse 512 MiB file would otherwise cost git 512 MiB.
    ("core.bigFileThreshold", "1m"),
)


#: Subcommands that can run external diff or textconv drivers.
_DIFFING = frozenset({"diff", "log", "show", "format-patch", "whatchanged"})


class GitError(CorralError, RuntimeError):
    """A git command on a workspace failed."""


class GitBudgetError(GitError):
    """Host git work on a workspace went past its size or wall-clock budget."""


@dataclass(frozen=True)
class GitBudget:
    """What host git may spend on one commit or snapshot of a workspace.

    Sizes are apparent sizes (`st_size`, what git hashes and archive emits),
    not blocks on disk: a sparse file costs git its apparent size in time.
    `timeout_s` is measured on the repository's `clock`: a run's clock
    stops while the run is paused (its git is frozen with it).
    """

    max_file_bytes: int = 256 << 20
    max_total_bytes: int = 1 << 30
    timeout_s: float = 300.0


DEFAULT_GIT_BUDGET: Final = GitBudget()
_COPY = 1 << 16


def hardened_env(empty_home: str) -> dict[str, str]:
    """The environment git runs in: nothing from the caller that configures git."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_")
        and k
        not in ("XDG_CONFIG_HOME", "PAGER", "EDITOR", "VISUAL", "SSH_ASKPASS", "LESS", "LESSOPEN")
    }
    env.update(
        {
            "HOME": empty_home,
            "XDG_CONFIG_HOME": os.path.join(empty_home, ".config"),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_PAGER": "cat",
            "GIT_EDITOR": "false",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "LC_ALL": "C",
        }
    )
    return env


def _config_args() -> list[str]:
    out: list[str] = []
    for key, value in _FORCED_CONFIG:
        out += ["-c", f"{key}={value}"]
    return out


def _c_quote(path: bytes) -> bytes:
    """`path` as a git C-quoted string (`"..."`), every byte outside plain ASCII as octal."""
    out = bytearray(b'"')
    for b in path:
        if 0x20 <= b < 0x7F and b not in b'"\\':
            out.append(b)
        else:
            out += b"\\%03o" % b
    out += b'"'
    return bytes(out)


#: Joins every `cgroup.procs` file named in CORRAL_JOIN_CGROUPS (":"-separated)
#: and only then execs git: the process is charged to the run from its first
#: allocation (moving it after start would let it allocate uncharged first).
#: A join that fails exits 125 before git runs.
_JOIN = (
    'IFS=:; for f in $CORRAL_JOIN_CGROUPS; do echo 0 > "$f" || exit 125; done; '
    'unset CORRAL_JOIN_CGROUPS IFS; exec "$@"'
)


#: A run's git runs without supplementary groups and CAP_SYS_RESOURCE: on a
#: `run_disk` image ext4 keeps its reserved blocks for writers with either
#: (corral's state, `run.rundisk`), and git writes objects of the agent's data.
_NO_RESERVE = (
    "setpriv",
    "--clear-groups",
    "--bounding-set=-sys_resource",
    "--inh-caps=-sys_resource",
    "--",
)


def _joined(argv: list[str], env: dict[str, str], cgroup_procs: Sequence[str]) -> list[str]:
    """`argv` run by a shell that first joins `cgroup_procs` (`argv` itself when empty)."""
    if not cgroup_procs:
        return argv
    if any(":" in p for p in cgroup_procs):
        raise GitError(f"cgroup path with ':' cannot be joined: {cgroup_procs!r}")
    env["CORRAL_JOIN_CGROUPS"] = ":".join(cgroup_procs)
    drop = _NO_RESERVE if os.geteuid() == 0 else ()
    return ["/bin/sh", "-c", _JOIN, "corral-git", *drop, *argv]


def _exit_reason(code: int, stderr: bytes) -> str:
    if code == 125:
        return f"could not join the run cgroup: {stderr.decode(errors='replace').strip()}"
    return stderr.decode(errors="replace").strip()


def _git_exe() -> str:
    git = shutil.which("git")
    if git is None:
        raise GitError("git is not installed")
    return git


def _git_command(
    git: str,
    git_dir: str | Path,
    work_tree: str | Path,
    home: str,
    args: Sequence[str],
    *,
    cgroup_procs: Sequence[str],
    index_file: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of `git ARGS` with the trusted `git_dir` over `work_tree`,
    its configuration hardened and its HOME the empty `home`."""
    env = hardened_env(home)
    env["GIT_DIR"] = str(git_dir)
    env["GIT_WORK_TREE"] = str(work_tree)
    if index_file is not None:
        env["GIT_INDEX_FILE"] = index_file
    return _joined([git, *_config_args(), *args], env, cgroup_procs), env


def _start_git(
    argv: list[str], env: dict[str, str], work_tree: str | Path, what: str, *, stdin: bool = False
) -> subprocess.Popen[bytes]:
    """Start git with its output on pipes (read bounded by the caller)."""
    try:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=str(work_tree),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise GitError(f"cannot start git {what}: {exc}") from exc


def safe_git(
    git_dir: str | Path,
    work_tree: str | Path,
    args: Sequence[str],
    *,
    input_bytes: bytes | None = None,
    timeout: float = 120,
    index_file: str | None = None,
    cgroup_procs: Sequence[str] = (),
    deadline: Deadline | None = None,
) -> bytes:
    """Run `git ARGS` with the trusted `git_dir` over `work_tree`; return stdout.

    Git is killed after `timeout` seconds, or when `deadline` (a budget
    shared by several commands, perhaps on a clock that stops while the run
    is paused) runs out: GitBudgetError. Raises GitError with git's stderr
    when it fails.
    """
    git = _git_exe()
    if deadline is None:
        deadline = Deadline(timeout)
    with tempfile.TemporaryDirectory(prefix="corral-git-home-") as home:
        args = list(args)
        if args and args[0] in _DIFFING and "--no-ext-diff" not in args:
            args[1:1] = ["--no-ext-diff", "--no-textconv"]
        argv, env = _git_command(
            git, git_dir, work_tree, home, args, cgroup_procs=cgroup_procs, index_file=index_file
        )
        proc = _start_git(argv, env, work_tree, " ".join(args[:1]), stdin=input_bytes is not None)
        stdout, stderr = _communicate(proc, input_bytes, deadline, f"git {' '.join(args[:2])}")
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args[:3])} failed: {_exit_reason(proc.returncode, stderr)}")
    return stdout


def _communicate(
    proc: subprocess.Popen[bytes], input_bytes: bytes | None, deadline: Deadline, what: str
) -> tuple[bytes, bytes]:
    """`proc.communicate()` within `deadline`; killed and GitBudgetError past it.

    Waits in stretches of what is left of the budget: when the run was
    paused meanwhile, its clock stood still and there is budget left, so
    the wait goes on rather than killing git, frozen with the run, on the
    thaw. communicate() may be retried after a timeout without losing input
    or output.
    """
    feed = input_bytes
    try:
        while True:
            try:
                return proc.communicate(feed, timeout=deadline.wait_s())
            except subprocess.TimeoutExpired:
                # The input is kept by the first call; a retry may not repeat it.
                feed = None
                if not deadline.expired():
                    continue
            break
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    raise GitBudgetError(f"{what} is over its wall-clock budget of {deadline.budget_s:g}s")


@dataclass(frozen=True)
class TrustedRepo:
    """Corral's own repository of a workspace: `git_dir` outside it, `work_tree` the workspace."""

    git_dir: Path
    work_tree: Path
    budget: GitBudget = DEFAULT_GIT_BUDGET
    cgroup_procs: tuple[str, ...] = ()
    """`cgroup.procs` files every git process joins before it runs (the run's helpers)."""
    clock: Clock = time.monotonic
    """What `budget.timeout_s` is measured on: the run's `PausableClock`, so
    that git frozen with a paused run is not killed for the pause."""

    def deadline(self) -> Deadline:
        """The wall-clock budget of one commit or snapshot, from now."""
        return Deadline(self.budget.timeout_s, self.clock)

    def git(
        self, *args: str, input_bytes: bytes | None = None, deadline: Deadline | None = None
    ) -> bytes:
        return safe_git(
            self.git_dir,
            self.work_tree,
            args,
            input_bytes=input_bytes,
            cgroup_procs=self.cgroup_procs,
            deadline=self.deadline() if deadline is None else deadline,
        )

    def init(self) -> None:
        if (self.git_dir / "HEAD").exists():
            return
        self.git_dir.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet")
        # Drop git's sample hooks: nothing in the trusted directory should be executable.
        shutil.rmtree(self.git_dir / "hooks", ignore_errors=True)

    def commit_all(self, message: str) -> str:
        """Record every file of the work tree as a new commit; returns its id.

        Built with plumbing from corral's own walk of the tree rather than
        `git add`: git never scans the work tree (no fsmonitor, attributes or
        filters), files inside nested repositories are recorded as files,
        and `.git` directories at any depth are left out. Names are bytes
        throughout: a workspace may hold names that are not UTF-8.

        Raises GitBudgetError (nothing recorded) when a file or the tree is
        over `budget` in apparent size, or the commit takes longer than its
        wall-clock budget.
        """
        deadline = self.deadline()
        total = 0
        entries: list[tuple[bytes, bytes, bytes]] = []  # (mode, sha, path)
        regular: list[tuple[bytes, bytes]] = []  # (mode, path)
        root = os.fsencode(self.work_tree)
        for dirpath, dirnames, filenames in os.walk(root):
            # os.walk lists symlinks to directories among dirnames; they are
            # recorded as links, never followed.
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            dirnames[:] = sorted(d for d in dirnames if d != b".git" and d not in links)
            for name in sorted(filenames + [d for d in links if d != b".git"]):
                if deadline.expired():
                    raise _over_budget(deadline)
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    sha = self.git(
                        "hash-object",
                        "-w",
                        "--stdin",
                        input_bytes=os.readlink(full),
                        deadline=deadline,
                    ).strip()
                    entries.append((b"120000", sha, rel))
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                    self._check_size(rel, st, total)
                    regular.append((b"100755" if st.st_mode & 0o111 else b"100644", rel))
        if regular:
            # Every path goes C-quoted: --stdin-paths unquotes a line that
            # starts with '"' (octal escapes included), so a file *named*
            # `"..\057..\057etc\057shadow"` would otherwise be read from the host;
            # quoting also carries newlines, CR and bytes that are not UTF-8.
            shas = self.git(
                "hash-object",
                "-w",
                "--no-filters",
                "--stdin-paths",
                input_bytes=b"".join(_c_quote(p) + b"\n" for _, p in regular),
                deadline=deadline,
            ).split()
            entries += [(m, s, p) for (m, p), s in zip(regular, shas, strict=True)]
        with tempfile.TemporaryDirectory(prefix="corral-index-") as tmp:
            index = os.path.join(tmp, "index")
            info = b"".join(m + b" " + s + b"\t" + p + b"\0" for m, s, p in entries)
            safe_git(
                self.git_dir,
                self.work_tree,
                ["update-index", "--add", "-z", "--index-info"],
                input_bytes=info,
                index_file=index,
                cgroup_procs=self.cgroup_procs,
                deadline=deadline,
            )
            tree = (
                safe_git(
                    self.git_dir,
                    self.work_tree,
                    ["write-tree"],
                    index_file=index,
                    cgroup_procs=self.cgroup_procs,
                    deadline=deadline,
                )
                .decode()
                .strip()
            )
        parent = self._head_or_none(deadline)
        args = ["commit-tree", tree, "-F", "-"] + (["-p", parent] if parent else [])
        # The message may quote an agent (its error text): on stdin rather than
        # argv, a NUL or an unpaired surrogate in it cannot fail the commit.
        body = message.replace("\0", "\\0").encode("utf-8", "backslashreplace")
        commit = self.git(*args, input_bytes=body, deadline=deadline).decode().strip()
        self.git("update-ref", "HEAD", commit, deadline=deadline)
        return commit

    def _check_size(self, rel: bytes, st: os.stat_result, total: int) -> None:
        name = os.fsdecode(rel)
        if st.st_size > self.budget.max_file_bytes:
            raise GitBudgetError(
                f"{name!r} is {st.st_size} bytes ({st.st_blocks * 512} on disk), over the "
                f"host-git budget of {self.budget.max_file_bytes} bytes per file"
            )
        if total > self.budget.max_total_bytes:
            raise GitBudgetError(
                f"the workspace is over the host-git budget of {self.budget.max_total_bytes} "
                f"bytes (at {name!r})"
            )

    def _head_or_none(self, deadline: Deadline) -> str | None:
        try:
            return self.head(deadline)
        except GitBudgetError:
            raise
        except GitError:
            return None

    def head(self, deadline: Deadline | None = None) -> str:
        out = self.git("rev-parse", "--verify", "--quiet", "HEAD", deadline=deadline)
        return out.decode().strip()

    def diff_stat(self, base: str, head: str = "HEAD") -> str:
        return self.git("diff", "--no-ext-diff", "--no-textconv", "--stat", base, head).decode(
            errors="replace"
        )

    def diff_capped(self, base: str, head: str, max_bytes: int) -> tuple[bytes, bool]:
        """`git diff BASE HEAD`, at most `max_bytes` of it; (text, whether it was cut).

        The diff of a hostile workspace can be as large as the workspace, so
        git's output is read in bounded pieces and git is killed at the cap
        rather than buffered whole.
        """
        git = _git_exe()
        with tempfile.TemporaryDirectory(prefix="corral-git-home-") as home:
            args = ["diff", "--no-ext-diff", "--no-textconv", "--no-color", base, head, "--"]
            argv, env = _git_command(
                git, self.git_dir, self.work_tree, home, args, cgroup_procs=self.cgroup_procs
            )
            proc = _start_git(argv, env, self.work_tree, "diff")
            assert proc.stdout is not None and proc.stderr is not None
            deadline = self.deadline()
            pipe = _PipeWithin(
                proc.stdout.fileno(), deadline, f"git diff over {self.budget.timeout_s:g}s"
            )
            chunks: list[bytes] = []
            got = 0
            cut = False
            try:
                while got <= max_bytes:
                    chunk = pipe.read(min(65536, max_bytes + 1 - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                if got > max_bytes:
                    cut = True
                    proc.kill()
            except BaseException:
                proc.kill()
                raise
            finally:
                proc.stdout.close()
                stderr = proc.stderr.read(4096)
                proc.stderr.close()
                code = _wait_within(proc, deadline, "git diff")
        if not cut and code != 0:
            raise GitError(f"git diff failed: {_exit_reason(code, stderr)}")
        return b"".join(chunks)[:max_bytes], cut

    def log(self, max_count: int = 20) -> list[str]:
        out = self.git("log", f"--max-count={max_count}", "--format=%H %s").decode(errors="replace")
        return [line for line in out.splitlines() if line]

    def snapshot(self, commit: str, dest: Path) -> list[str]:
        """Write the tree of `commit` into `dest` (a new directory), with no links out of it.

        `git archive` produces the tar (no work-tree filters run: the trusted
        config defines none) and it is extracted as it streams, never held
        whole; extraction uses tarfile's `data` filter, which refuses absolute
        paths, `..`, links pointing outside and device files. Runs of zeros
        are written as holes, so a sparse file stays sparse. Refused members
        are skipped, not fatal; their names are returned. A member or the
        whole tree over `budget`, or an archive past its wall-clock budget,
        raises GitBudgetError (what was extracted so far stays in `dest`).
        """
        dest.mkdir(parents=True, exist_ok=False)
        skipped: list[str] = []
        if not self.git("ls-tree", "--name-only", commit).strip():
            return skipped  # an empty tree archives to no tar stream at all
        budget = self.budget
        deadline = self.deadline()
        total = 0

        def only_safe(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
            nonlocal total
            if deadline.expired():
                raise GitBudgetError(f"snapshot of {commit[:12]} over {budget.timeout_s:g}s")
            total += member.size
            if member.size > budget.max_file_bytes or total > budget.max_total_bytes:
                raise GitBudgetError(
                    f"snapshot member {member.name!r} ({member.size} bytes) is over the "
                    f"host-git budget ({budget.max_file_bytes} per file, "
                    f"{budget.max_total_bytes} in all)"
                )
            try:
                return tarfile.data_filter(member, path)
            except tarfile.FilterError:
                skipped.append(member.name)
                return None

        with _archive(self, commit) as stream:
            # Every read waits on the deadline, not only the checks between
            # members: one member's data can take the whole budget to arrive.
            pipe = _PipeWithin(
                stream.stdout.fileno(),
                deadline,
                f"snapshot of {commit[:12]} over {budget.timeout_s:g}s",
            )
            try:
                with _SparseTar.open(fileobj=pipe, mode="r|") as tar:  # type: ignore[call-overload]
                    for member in tar:
                        tar.extract(member, dest, filter=only_safe)
            except tarfile.ReadError as exc:
                raise GitError(f"git archive {commit[:12]}: unreadable tar: {exc}") from exc
            except OSError as exc:
                raise GitError(f"snapshot of {commit[:12]}: {exc.strerror or exc}") from exc
        return skipped


class _PipeWithin:
    """Reads of a pipe that end in GitBudgetError when `deadline` runs out.

    The wait for data is a select() of at most what is left of the budget,
    re-checked on the deadline's clock: a pause of the run (git frozen, the
    pipe silent) leaves the budget where it was.
    """

    def __init__(self, fd: int, deadline: Deadline, over: str) -> None:
        self._fd = fd
        self._deadline = deadline
        self._over = over

    def read(self, size: int = -1) -> bytes:
        while True:
            ready, _, _ = select.select([self._fd], [], [], self._deadline.wait_s())
            if ready:
                return os.read(self._fd, size if size > 0 else _COPY)
            if self._deadline.expired():
                raise GitBudgetError(self._over)


def _wait_within(proc: subprocess.Popen[bytes], deadline: Deadline, what: str) -> int:
    """`proc`'s exit code; killed (and GitBudgetError) once `deadline` runs out."""
    while True:
        try:
            return proc.wait(timeout=deadline.wait_s())
        except subprocess.TimeoutExpired:
            if deadline.expired():
                proc.kill()
                proc.wait()
                raise GitBudgetError(
                    f"{what} is over its wall-clock budget of {deadline.budget_s:g}s"
                ) from None


def _over_budget(deadline: Deadline) -> GitBudgetError:
    return GitBudgetError(f"host git work is over its wall-clock budget of {deadline.budget_s:g}s")


def _check_unreserved(fd: int, size: int) -> None:
    """ENOSPC unless `size` bytes fit outside the filesystem's reserved blocks.

    The coordinator writes snapshots as root, which ext4 lets into the blocks
    reserved for corral's state; `f_bavail` is what an unprivileged writer may
    still use, so a snapshot of an agent's data never eats the reserve.
    """
    st = os.fstatvfs(fd)
    if st.f_bavail * st.f_frsize < size:
        raise OSError(errno.ENOSPC, "no space left outside the reserve for corral's state")


class _SparseTar(tarfile.TarFile):
    """Extraction that writes runs of zeros as holes (a sparse file stays sparse)."""

    def makefile(
        self,
        tarinfo: tarfile.TarInfo,
        targetpath: str | bytes | os.PathLike[str] | os.PathLike[bytes],
    ) -> None:
        source = self.fileobj
        assert source is not None
        source.seek(tarinfo.offset_data)
        left = tarinfo.size
        with open(targetpath, "wb") as target:
            while left > 0:
                chunk = source.read(min(_COPY, left))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                left -= len(chunk)
                if chunk.count(0) == len(chunk):
                    target.seek(len(chunk), os.SEEK_CUR)
                else:
                    _check_unreserved(target.fileno(), len(chunk))
                    target.write(chunk)
            target.truncate(tarinfo.size)


class _Archive:
    """A running `git archive`: its stdout, and a kill that ends the stream."""

    def __init__(self, proc: subprocess.Popen[bytes], home: tempfile.TemporaryDirectory[str]):
        self.proc = proc
        self._home = home
        assert proc.stdout is not None
        self.stdout: IO[bytes] = proc.stdout

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def __enter__(self) -> _Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
            self.stdout.close()
            stderr = self.proc.stderr.read(4096) if self.proc.stderr is not None else b""
            code = self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()
        finally:
            self._home.cleanup()
        # 125: the join failed and git never ran; that reason beats "unreadable tar".
        if code == 125 or (exc[0] is None and code not in (0, -signal.SIGKILL)):
            raise GitError(f"git archive failed: {_exit_reason(code, stderr)}")


def _archive(repo: TrustedRepo, commit: str) -> _Archive:
    """Start `git archive --format=tar COMMIT` with the hardened environment."""
    git = _git_exe()
    home = tempfile.TemporaryDirectory(prefix="corral-git-home-")
    args = ["archive", "--format=tar", commit]
    argv, env = _git_command(
        git, repo.git_dir, repo.work_tree, home.name, args, cgroup_procs=repo.cgroup_procs
    )
    try:
        proc = _start_git(argv, env, repo.work_tree, "archive")
    except GitError:
        home.cleanup()
        raise
    return _Archive(proc, home)
