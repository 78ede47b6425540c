"""Host-executed workspace files: which paths `corral exec` makes read-only.

A sandbox may write anything in its workspace, but some names there are
*executed by the host* later: git runs `.git/hooks/*` and commands named in
`.git/config` (core.fsmonitor, core.hooksPath, filters) on the user's next
commit, direnv runs `.envrc` on `cd`, editors run `.vscode/tasks.json` and
`.devcontainer/`, agent CLIs load `.mcp.json`, `.claude/` and `.codex/`, and
shells source `.bashrc`/`.profile`/`.zshrc`. Those paths are protected:

* an existing one is bound read-only over itself, after the bind of the
  tree holding it;
* a missing one at the top of a writable tree gets an empty placeholder
  (directory or file) that corral creates on the host and binds read-only
  over itself, so the name cannot be created. A mount needs a dentry on the
  underlying filesystem and Landlock cannot exclude a child name from a
  writable hierarchy, so there is no mechanism that avoids the placeholder.
  Placeholders are recorded before they are created and removed after
  teardown if they are still the empty inode corral created and no other
  live sandbox binds them; a record whose owner pid is gone is swept on the
  next start (see the records section below);
* every nested repository found by a bounded walk (a `.git` directory or
  file) is protected whole, and so is a worktree's gitdir (and its common
  dir) when it lies inside a writable tree; so is every listed name found
  below the top;
* the directories between a tree's top and a protected path are pinned
  (bound over themselves, writable), so they cannot be renamed away.

After teardown a second scan names listed paths that appeared below the top
(`created_below`): nothing existed there to protect, so the sandbox could
create them, and the user is told.

The whole `.git` is read-only rather than only its executable parts: hooks,
config, info/attributes and every file git reads as configuration would have
to be listed exactly and kept current with git, and a writable objects/refs
store still lets the sandbox rewrite history the user later checks out. The
cost is that the sandbox cannot commit (or `git init`) in the user's
repository; `--unprotect .git` is the opt-out.

`scan_tree` does the bounded I/O (lstat, scandir without following symlinks,
small reads of `.git` files); `plan` is a pure function of what it found.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from corral.errors import LayerUnavailableError, SandboxStartError, UsageError
from corral.sandbox.bwrap import StagedBind
from corral.sandbox.cgroup import pid_alive

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from corral.sandbox.spec import SandboxSpec

    Kind = Literal["dir", "file", "symlink", "other"]

__all__ = [
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_GUARDS",
    "PROTECTED_DIRS",
    "PROTECTED_FILES",
    "PROTECTED_NAMES",
    "Guard",
    "Placeholders",
    "ProtectPlan",
    "RepoFact",
    "TreeFacts",
    "bind_pairs",
    "compute",
    "created_below",
    "hooks_path_of",
    "plan",
    "preview_protection",
    "record_dir",
    "scan_tree",
    "show",
    "start_protection",
    "sweep_stale",
    "validate_unprotect",
]

#: Directories the host executes or loads configuration from.
PROTECTED_DIRS: tuple[str, ...] = (".git", ".vscode", ".idea", ".claude", ".codex", ".devcontainer")
#: Files the host executes, sources or loads.
PROTECTED_FILES: tuple[str, ...] = (
    ".gitmodules",
    ".envrc",
    ".mcp.json",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
)
PROTECTED_NAMES: tuple[str, ...] = PROTECTED_DIRS + PROTECTED_FILES

#: Bounds of the walk for nested repositories (per writable tree).
MAX_DEPTH = 8
MAX_ENTRIES = 20000
#: At most this many read-only binds; past it the plan is marked truncated.
MAX_GUARDS = 512
_GITFILE_MAX = 4096
_NAMES_B = frozenset(os.fsencode(n) for n in PROTECTED_NAMES)


@dataclass(frozen=True, slots=True)
class RepoFact:
    """A `.git` entry found by the scan (at the top of the tree or below it)."""

    path: str
    kind: Kind
    #: For a `.git` file: the realpath of its gitdir and of that gitdir's commondir.
    gitdir: str | None = None
    commondir: str | None = None
    #: The path `core.hooksPath` makes git run hooks from, and its kind.
    hooks: tuple[str, Kind | None] | None = None


@dataclass(frozen=True, slots=True)
class TreeFacts:
    """What a bounded scan of one writable tree found."""

    tree: str
    #: Each listed name at the top of the tree and its kind (None: absent).
    top: tuple[tuple[str, Kind | None], ...]
    #: Listed names that exist deeper (not `.git`), with their kind.
    deep: tuple[tuple[str, Kind], ...]
    repos: tuple[RepoFact, ...]
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Guard:
    """One protected path (absolute; the same inside the sandbox and on the host).

    `create` is the placeholder to make when the path does not exist.
    """

    path: str
    create: Literal["dir", "file"] | None
    why: str


@dataclass(frozen=True, slots=True)
class ProtectPlan:
    guards: tuple[Guard, ...]
    unprotected: tuple[str, ...]
    truncated: bool = False
    #: Writable directories bound over themselves (see `_ancestors`).
    pins: tuple[str, ...] = ()
    #: The scanned trees and every listed path found below their top.
    trees: tuple[str, ...] = ()
    seen: frozenset[str] = frozenset()

    def summary(self) -> dict[str, object]:
        return {
            "protected": len(self.guards),
            "pinned": len(self.pins),
            "created": sum(1 for g in self.guards if g.create),
            "unprotected": list(self.unprotected),
            "truncated": self.truncated,
        }


def validate_unprotect(names: Iterable[str]) -> frozenset[str]:
    """The `--unprotect` names; anything not on the documented list is bad input."""
    out = set()
    for name in names:
        if name not in PROTECTED_NAMES:
            raise UsageError(
                f"--unprotect {name!r} is not a protected name"
                f" (one of: {' '.join(PROTECTED_NAMES)})"
            )
        out.add(name)
    return frozenset(out)


def _kind(mode: int) -> Kind:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _lkind(path: str) -> Kind | None:
    try:
        return _kind(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def _read_small(path: str, limit: int = _GITFILE_MAX) -> bytes | None:
    """Up to `limit` bytes of a regular file, without following a final
    symlink and without blocking on a FIFO planted under the name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _gitfile_targets(dotgit: str) -> tuple[str | None, str | None]:
    data = _read_small(dotgit)
    if data is None:
        return None, None
    line = data.split(b"\n", 1)[0].strip()
    if not line.startswith(b"gitdir:"):
        return None, None
    raw = os.fsdecode(line[len(b"gitdir:") :].strip())
    if not raw:
        return None, None
    gitdir = os.path.realpath(os.path.join(os.path.dirname(dotgit), raw))
    if not os.path.isdir(gitdir):
        return None, None
    common = _read_small(os.path.join(gitdir, "commondir"))
    commondir = None
    if common is not None and common.strip():
        commondir = os.path.realpath(
            os.path.join(gitdir, os.fsdecode(common.split(b"\n", 1)[0].strip()))
        )
        if not os.path.isdir(commondir):
            commondir = None
    return gitdir, commondir


def hooks_path_of(config: bytes) -> str | None:
    """`core.hooksPath` from the text of a git config file (the last one
    wins, as in git), or None. Sections and keys are case-insensitive;
    `include` directives are not followed."""
    value = None
    section = b""
    for raw in config.splitlines():
        line = raw.strip()
        if line.startswith(b"["):
            section = line[1 : line.find(b"]")].strip().lower() if b"]" in line else b""
            rest = line[line.find(b"]") + 1 :].strip() if b"]" in line else b""
            if not rest:
                continue
            line = rest  # "[core] hooksPath = x" on one line
        if section != b"core" or b"=" not in line:
            continue
        key, _, val = line.partition(b"=")
        if key.strip().lower() != b"hookspath":
            continue
        val = val.strip()
        if val.startswith(b'"'):
            end = val.find(b'"', 1)
            val = val[1:end] if end > 0 else val[1:]
        else:
            cut = min((i for i in (val.find(b"#"), val.find(b";")) if i >= 0), default=len(val))
            val = val[:cut].rstrip()
        value = os.fsdecode(val) if val else None
    return value


def _hooks_target(
    dotgit: str, gitdir: str | None, commondir: str | None
) -> tuple[str, Kind | None] | None:
    """What to protect for a repository's `core.hooksPath`, with its kind.

    A missing hooks directory is held at its first missing component (a
    placeholder can only be made where the parent exists). Husky's
    `core.hooksPath = .husky/_` runs the scripts in `.husky`, so a hooks
    directory named `_` stands for its parent.
    """
    config_dir = commondir or gitdir or dotgit
    data = _read_small(os.path.join(config_dir, "config"), 1 << 16)
    if data is None or b"hookspath" not in data.lower():
        return None
    value = hooks_path_of(data)
    if value is None:
        return None
    target = os.path.realpath(os.path.join(os.path.dirname(dotgit), os.path.expanduser(value)))
    if os.path.basename(target) == "_":
        target = os.path.dirname(target)
    probe = target
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        parent = os.path.dirname(probe)
        if os.path.lexists(parent):
            return probe, None
        probe = parent
    return target, _lkind(target)


def _repo_fact(path: str, kind: Kind) -> RepoFact:
    gitdir = commondir = None
    if kind == "file":
        gitdir, commondir = _gitfile_targets(path)
    elif kind != "dir":
        return RepoFact(path, kind)
    hooks = _hooks_target(path, gitdir, commondir) if kind == "dir" or gitdir else None
    return RepoFact(path, kind, gitdir, commondir, hooks)


def scan_tree(
    tree: str, *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES
) -> TreeFacts:
    """Bounded scan of one writable tree (an absolute, resolved directory).

    Breadth-first, never following symlinks, names handled as bytes; `.git`
    directories are not entered (they are protected whole). Stops after
    `max_entries` directory entries or below `max_depth` and says so.
    """
    top = tuple((name, _lkind(os.path.join(tree, name))) for name in PROTECTED_NAMES)
    repos: list[RepoFact] = []
    kind = dict(top).get(".git")
    if kind is not None:
        repos.append(_repo_fact(os.path.join(tree, ".git"), kind))
    deep: list[tuple[str, Kind]] = []
    truncated = False
    seen = 0
    queue: deque[tuple[bytes, int]] = deque([(os.fsencode(tree), 0)])
    while queue and not truncated:
        here, depth = queue.popleft()
        try:
            it = os.scandir(here)
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                if seen > max_entries:
                    truncated = True
                    break
                listed = depth > 0 and entry.name in _NAMES_B
                try:
                    # d_type from getdents answers is_dir without a stat
                    # per entry; only listed names need their exact kind.
                    if listed:
                        k = _kind(entry.stat(follow_symlinks=False).st_mode)
                    else:
                        k = "dir" if entry.is_dir(follow_symlinks=False) else "other"
                except OSError:
                    continue
                if listed:
                    path = os.fsdecode(entry.path)
                    if entry.name == b".git":
                        repos.append(_repo_fact(path, k))
                    else:
                        deep.append((path, k))
                if k == "dir" and entry.name != b".git":
                    if depth + 1 >= max_depth:
                        truncated = True
                    else:
                        queue.append((entry.path, depth + 1))
    return TreeFacts(tree, top, tuple(deep), tuple(repos), truncated)


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def show(path: str) -> str:
    """A path for one line of terminal output: names come from the
    workspace, so control characters, newlines and undecodable bytes are
    escaped rather than sent to the user's terminal."""
    out = []
    for c in path:
        if 0xDC80 <= ord(c) <= 0xDCFF:  # an undecodable byte (surrogateescape)
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(c if c.isprintable() else ascii(c)[1:-1])
    return "".join(out)


def _refuse_symlink(path: str, name: str) -> LayerUnavailableError:
    return LayerUnavailableError(
        "protect",
        f"{show(path)} is a symlink; a host-executed path cannot be protected through a link",
        f"replace it with the file it points to, or pass --unprotect {name}",
    )


def plan(
    facts: Sequence[TreeFacts], unprotect: frozenset[str], readonly: Sequence[str] = ()
) -> ProtectPlan:
    """What to protect in the given writable trees. Pure.

    Paths under a read-only user bind (`readonly`, deeper than the writable
    tree holding them) are already read-only and left alone: a pin there
    would make them writable again.

    Raises LayerUnavailableError("protect", ...) when a protected name is a
    symlink (a bind would follow it) or a writable tree lies inside a `.git`
    directory, unless the name is unprotected.
    """
    trees = [f.tree for f in facts]
    guards: dict[str, Guard] = {}
    truncated = any(f.truncated for f in facts)

    def ro(path: str) -> bool:
        w = max((t for t in trees if _within(path, t)), key=len, default="")
        r = max((t for t in readonly if _within(path, t)), key=len, default="")
        return len(r) > len(w)

    def add(path: str, create: Literal["dir", "file"] | None, why: str) -> None:
        nonlocal truncated
        if path in guards:
            return
        if len(guards) >= MAX_GUARDS:
            truncated = True
            return
        guards[path] = Guard(path, create, why)

    for f in facts:
        if ".git" not in unprotect and ".git" in f.tree.split("/"):
            raise LayerUnavailableError(
                "protect",
                f"writable tree {show(f.tree)} is inside a .git directory",
                "choose the repository's work tree, or pass --unprotect .git",
            )
        for name, kind in f.top:
            path = os.path.join(f.tree, name)
            if name in unprotect or ro(path):
                continue
            if kind == "symlink":
                raise _refuse_symlink(path, name)
            if kind is None:
                add(path, "dir" if name in PROTECTED_DIRS else "file", "listed")
            else:
                add(path, None, "listed")
        for path, kind in f.deep:
            name = os.path.basename(path)
            if name in unprotect or ro(path):
                continue
            if kind == "symlink":
                raise _refuse_symlink(path, name)
            add(path, None, "listed")
        if ".git" in unprotect:
            continue
        for repo in f.repos:
            if ro(repo.path):
                continue
            if repo.kind == "symlink":
                raise _refuse_symlink(repo.path, ".git")
            add(repo.path, None, "repository")
            for target in (repo.gitdir, repo.commondir):
                if target is not None and any(_within(target, t) for t in trees) and not ro(target):
                    add(target, None, "worktree gitdir")
            if repo.hooks is not None:
                hooks, kind = repo.hooks
                if not any(_within(hooks, t) for t in trees) or ro(hooks):
                    continue
                if any(hooks == t for t in trees):
                    raise LayerUnavailableError(
                        "protect",
                        f"core.hooksPath of {show(repo.path)} is a whole writable tree",
                        "point core.hooksPath elsewhere, or pass --unprotect .git",
                    )
                if kind == "symlink":
                    raise _refuse_symlink(hooks, ".git")
                add(hooks, "dir" if kind is None else None, "core.hooksPath")
    kept = [g for g in guards.values() if not _has_ancestor_in(g.path, guards)]
    pins: set[str] = set()
    for g in kept:
        pins.update(_ancestors(g.path, trees))
    if len(kept) + len(pins) > MAX_GUARDS:
        truncated = True
        by_depth = sorted(kept, key=lambda g: (g.path.count("/"), g.path))
        kept, pins = [], set()
        for g in by_depth:
            more = _ancestors(g.path, trees) - pins
            if len(kept) + len(pins) + len(more) + 1 > MAX_GUARDS:
                break
            kept.append(g)
            pins |= more
    ordered = sorted(kept, key=lambda g: (g.path.count("/"), g.path))
    seen = {r.path for f in facts for r in f.repos} | {d for f in facts for d, _ in f.deep}
    return ProtectPlan(
        tuple(ordered),
        tuple(sorted(unprotect)),
        truncated,
        tuple(sorted(pins, key=_depth)),
        tuple(trees),
        frozenset(seen),
    )


def created_below(p: ProtectPlan, facts: Sequence[TreeFacts]) -> tuple[str, ...]:
    """Listed paths below the top of a tree (a new `.git`, `.envrc`, ...)
    that a later scan found and the plan's scan did not. Pure.

    Nothing existed there to protect when the sandbox started, so the
    sandbox may have created them; the caller warns about them.
    """
    found = {r.path for f in facts for r in f.repos} | {d for f in facts for d, _ in f.deep}
    return tuple(
        sorted(
            path
            for path in found - p.seen
            if os.path.basename(path) not in p.unprotected
            and not any(_inside(path, g.path) for g in p.guards)
        )
    )


def _has_ancestor_in(path: str, paths: dict[str, Guard]) -> bool:
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        if parent in paths:
            return True
        parent = os.path.dirname(parent)
    return False


def _depth(path: str) -> tuple[int, str]:
    return (path.count("/"), path)


def _inside(path: str, other: str) -> bool:
    return path != other and _within(path, other)


def _ancestors(path: str, trees: Sequence[str]) -> set[str]:
    """The directories between the innermost tree holding `path` and `path`.

    Each is pinned (bound over itself, still writable) so that it is a
    mountpoint inside the sandbox: rename(2) and rmdir(2) of a mountpoint
    fail with EBUSY, so the sandbox cannot move a protected repository
    aside and create a look-alike at the path the user will use.
    """
    holders = [t for t in trees if _inside(path, t)]
    if not holders:
        return set()
    top = max(holders, key=len)
    out: set[str] = set()
    parent = os.path.dirname(path)
    while _inside(parent, top):
        out.add(parent)
        parent = os.path.dirname(parent)
    return out


def compute(
    trees: Sequence[str], unprotect: frozenset[str], readonly: Sequence[str] = ()
) -> ProtectPlan:
    """Scan each writable tree and plan what to protect."""
    return plan([scan_tree(t) for t in trees if os.path.isdir(t)], unprotect, readonly)


def bind_pairs(p: ProtectPlan, sources: Sequence[tuple[str, str]]) -> tuple[StagedBind, ...]:
    """The binds for a plan, parents first: pins writable, guards read-only.

    `sources` maps each writable tree to where bwrap finds it (the idmapped
    staging path when root, else the tree itself).
    """
    by_len = sorted(sources, key=lambda s: len(s[0]), reverse=True)

    def source(path: str) -> str:
        tree, src = next(((t, s) for t, s in by_len if _within(path, t)), (path, path))
        if path == tree:
            return src
        # `_within`: path is tree + "/" + rest (both absolute and normalised).
        return os.path.join(src, path[len(tree.rstrip("/")) + 1 :])

    binds = [StagedBind(source(d), d, True) for d in p.pins]
    binds += [StagedBind(source(g.path), g.path, False) for g in p.guards]
    return tuple(sorted(binds, key=lambda b: _depth(b.dest)))


# -- placeholders on the host ---------------------------------------------------------
#
# Records live in one directory per corral user, guarded by a flock. A record
# `exec-<pid>-<hex>.json` is {"made": placeholders this sandbox created,
# "uses": [dev, ino] of every existing path it binds}; `left-<hex>.json`
# holds placeholders a finished sandbox could not remove yet. A placeholder
# is only removed when no live record makes or uses its inode: another
# sandbox may have found it (as an existing empty file) and bound it, and
# unlinking a mountpoint of another mount namespace succeeds and detaches
# that mount (Linux >= 3.18), which would let that sandbox create the name.
# The lock makes "check the records, then unlink" and "scan, then record"
# mutually exclusive; the bind itself comes later, after the record exists.

Row = dict[str, object]


def record_dir(cache: str) -> str:
    """Where placeholder records live under corral's cache directory."""
    return os.path.join(cache, "placeholders")


def _lock(where: str) -> int:
    """The records' lock, held (released by closing the descriptor)."""
    import fcntl

    os.makedirs(where, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(where, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _locked(where: str) -> Iterator[None]:
    fd = _lock(where)
    try:
        yield
    finally:
        os.close(fd)


def _write_record(path: str, doc: dict[str, object]) -> None:
    # No fsync (it cost ~15 ms per exec here): the record only has to outlive
    # the corral process, and the page cache does.
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(doc).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read_record(path: str) -> tuple[list[Row], set[tuple[int, int]]]:
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return [], set()
    if not isinstance(doc, dict):
        return [], set()
    made = [r for r in doc.get("made", []) if isinstance(r, dict) and "path" in r]
    pairs = [*doc.get("uses", []), *([r.get("dev"), r.get("ino")] for r in made)]
    uses: set[tuple[int, int]] = set()
    for u in pairs:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            uses.add((int(u[0]), int(u[1])))
    return made, uses


def _owner(name: str) -> int | None:
    """The pid owning a record, 0 for a leftover record, None for other files."""
    if not name.endswith(".json"):
        return None
    parts = name.removesuffix(".json").split("-")
    if len(parts) == 2 and parts[0] == "left":
        return 0
    if len(parts) == 3 and parts[0] == "exec" and parts[1].isdigit():
        return int(parts[1])
    return None


def _live(pid: int) -> bool:
    return pid > 0 and (pid == os.getpid() or pid_alive(pid))


def _in_use(where: str, skip: str | None = None) -> set[tuple[int, int]]:
    """Inodes that a live record makes or uses."""
    used: set[tuple[int, int]] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(where):
            pid = _owner(name)
            if pid is not None and name != skip and _live(pid):
                used |= _read_record(os.path.join(where, name))[1]
    return used


def _remove_if_ours(row: Row, used: set[tuple[int, int]]) -> bool:
    """Remove a placeholder if it is still the empty inode corral created and
    no live sandbox binds it; True when nothing of it is left to track."""
    path = str(row["path"])
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    ino = row.get("ino")
    if ino is not None and (st.st_ino, st.st_dev) != (ino, row.get("dev")):
        return True  # not ours any more: leave it
    if (st.st_dev, st.st_ino) in used:
        return False
    try:
        if row["kind"] == "dir" and stat.S_ISDIR(st.st_mode):
            os.rmdir(path)  # fails if anything is inside
        elif row["kind"] == "file" and stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(path)
    except OSError:
        return False
    return True


def _sweep(where: str, used: set[tuple[int, int]] | None = None) -> list[str]:
    """`sweep_stale` under the lock; `used` is `_in_use(where)` when the caller has it."""
    removed: list[str] = []
    try:
        names = os.listdir(where)
    except OSError:
        return removed
    if used is None:
        used = _in_use(where)
    for name in names:
        if name.endswith(".json.tmp"):
            # Every record is written under the lock this sweep holds, so a
            # temporary file seen now belongs to a writer that was killed.
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(where, name))
            continue
        pid = _owner(name)
        if pid is None or _live(pid):
            continue
        path = os.path.join(where, name)
        made, _ = _read_record(path)
        left = [r for r in made if not _remove_if_ours(r, used)]
        removed += [str(r["path"]) for r in made if r not in left]
        with contextlib.suppress(OSError):
            if left:
                _write_record(path, {"made": left, "uses": []})
            else:
                os.unlink(path)
    return removed


def sweep_stale(where: str) -> list[str]:
    """Remove placeholders recorded by corral processes that no longer exist
    (and leftovers of finished sandboxes) that no live sandbox binds."""
    with _locked(where):
        return _sweep(where)


class Placeholders:
    """The placeholders one sandbox needs, created on the host and recorded.

    Use `create()` before bwrap starts and `release()` after the sandbox's
    mount namespace is gone (a placeholder is then no longer its mountpoint).
    `start_protection(defer=True)` returns them planned, not made, with the
    records' lock still held: `finish()` makes them under that same lock.
    """

    def __init__(self, p: ProtectPlan, where: str) -> None:
        self.plan = p
        self._wanted = [g for g in p.guards if g.create is not None]
        self._where = where
        self._record: str | None = None
        self._rows: list[Row] = []
        #: After `release()`: see `created_below`.
        self.created_below: tuple[str, ...] | None = None
        #: The records' lock while the plan waits for `finish()` (-1: not held).
        self._held = -1

    @property
    def summary(self) -> dict[str, object]:
        return self.plan.summary()

    def create(self) -> None:
        with _locked(self._where):
            self._create()

    @property
    def deferred(self) -> bool:
        """Whether `finish()` is still to make them (the records' lock is held)."""
        return self._held >= 0

    def finish(self) -> None:
        """Make a deferred plan's placeholders, then let go of the records' lock."""
        try:
            self._create()
        except SandboxStartError:
            raise
        except OSError as exc:
            raise _start_error(exc) from exc
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._held >= 0:
            os.close(self._held)
            self._held = -1

    def _create(self) -> None:
        uses: list[list[int]] = []
        for path in (*(g.path for g in self.plan.guards if g.create is None), *self.plan.pins):
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                uses.append([st.st_dev, st.st_ino])
        if not self._wanted and not uses:
            return
        self._record = os.path.join(self._where, f"exec-{os.getpid()}-{os.urandom(4).hex()}.json")
        # Recorded before created: after a crash the next start sweeps rows
        # without an inode too (removed only if empty and of the kind made).
        self._rows = [{"path": g.path, "kind": g.create} for g in self._wanted]
        _write_record(self._record, {"made": self._rows, "uses": uses})
        made: list[Row] = []
        parents: dict[str, int] = {}
        try:
            for row in self._rows:
                made.append(_make(str(row["path"]), str(row["kind"]), row, parents))
        except OSError as exc:
            for fd in parents.values():
                os.close(fd)
            parents.clear()
            self._rows = made
            self._release()
            raise SandboxStartError(
                exc.errno or 0,
                f"protect: cannot create placeholder {show(str(exc.filename))}: {exc.strerror}",
            ) from exc
        finally:
            for fd in parents.values():
                os.close(fd)
        self._rows = made
        _write_record(self._record, {"made": self._rows, "uses": uses})

    def release(self) -> None:
        """Remove what `create()` made (only if unchanged and unused), then
        sweep leftovers this sandbox was the last one to use."""
        self._unlock()
        if self._record is not None:
            # Teardown must finish: what cannot be removed now stays
            # recorded and is swept by a later start.
            with contextlib.suppress(OSError), _locked(self._where):
                # What the live records use is read once for both: under the
                # lock no record changes, and this one's is gone after _release.
                _sweep(self._where, self._release())
        if self.created_below is None:
            self.created_below = ()
            with contextlib.suppress(OSError):
                trees = [t for t in self.plan.trees if os.path.isdir(t)]
                self.created_below = created_below(self.plan, [scan_tree(t) for t in trees])

    def _release(self) -> set[tuple[int, int]] | None:
        """Remove this sandbox's placeholders and record; what live records use, or None."""
        if self._record is None:
            return None
        used = _in_use(self._where, skip=os.path.basename(self._record))
        left = [row for row in self._rows if not _remove_if_ours(row, used)]
        self._rows = []
        with contextlib.suppress(OSError):
            if left:
                _write_record(
                    os.path.join(self._where, f"left-{os.urandom(6).hex()}.json"),
                    {"made": left, "uses": []},
                )
            os.unlink(self._record)
        self._record = None
        return used


def _make(path: str, kind: str, row: Row, parents: dict[str, int]) -> Row:
    """Create one placeholder; `parents` keeps the directories opened so far
    (most placeholders share the top of the workspace), the caller closes them."""
    where = os.path.dirname(path)
    parent = parents.get(where)
    if parent is None:
        parent = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        parents[where] = parent
    name = os.path.basename(path)
    if kind == "dir":
        os.mkdir(name, 0o755, dir_fd=parent)
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    else:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o644, dir_fd=parent)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    return {**row, "ino": st.st_ino, "dev": st.st_dev}


# -- what the namespace backend calls -------------------------------------------------


def _writable(
    staged: Sequence[StagedBind],
) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    trees = [b.dest for b in staged if b.writable]
    readonly = [b.dest for b in staged if not b.writable]
    return trees, [(b.dest, b.source) for b in staged if b.writable], readonly


def preview_protection(spec: SandboxSpec, staged: Sequence[StagedBind]) -> tuple[StagedBind, ...]:
    """The binds `start_protection` would add; creates nothing."""
    trees, sources, readonly = _writable(staged)
    return bind_pairs(compute(trees, spec.unprotect, readonly), sources)


def start_protection(
    spec: SandboxSpec, staged: Sequence[StagedBind], cache: str, *, defer: bool = False
) -> tuple[tuple[StagedBind, ...], Placeholders]:
    """Sweep stale placeholders, plan, create and record this sandbox's.

    Returns the binds and the placeholders to release after teardown. The
    scan and the record happen under the records' lock, so a sandbox ending
    meanwhile sees this one's use of its placeholders before removing them.
    With `defer` nothing is created yet and the lock stays held until
    `Placeholders.finish()` (or `release()`): the caller overlaps the ext4
    creates (~0.2 ms each here, 18 by default) with other work that does not
    need them, and the scan, record and creation still happen under one lock.
    """
    where = record_dir(cache)
    trees, sources, readonly = _writable(staged)
    try:
        lock = _lock(where)
        try:
            _sweep(where)
            p = compute(trees, spec.unprotect, readonly)
            placeholders = Placeholders(p, where)
            if defer:
                placeholders._held, lock = lock, -1
            else:
                placeholders._create()
        finally:
            if lock >= 0:
                os.close(lock)
    except SandboxStartError:
        raise
    except OSError as exc:
        raise _start_error(exc) from exc
    return bind_pairs(p, sources), placeholders


def _start_error(exc: OSError) -> SandboxStartError:
    """A file error of the placeholders' set-up as the start's error, naming its path."""
    return SandboxStartError(
        exc.errno or 0, f"protect: {exc.strerror or exc}: {show(str(exc.filename))}"
    )
