"""Strip S_ISUID/S_ISGID from a tree a sandbox could write (M13).

The seccomp filter refuses every call that asks for the bits; this walk is
the second line, run on the host after the sandbox is gone: it also catches
bits that were already on disk (a workspace the user brought) and anything a
weaker profile (`--allow-degraded seccomp`) let through.

The tree is hostile: names are arbitrary bytes, entries may be swapped while
a concurrent sandbox on the same workspace runs, and it may be huge or deep.
So the walk is descriptor-relative and never follows a symlink (every step
is `O_NOFOLLOW` from the parent's descriptor), changes a mode only through
an `O_PATH` descriptor whose inode was checked, and is bounded in entries
and depth. Hitting a bound or an error makes the report incomplete; callers
fail closed on that.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "SETID_BITS", "StripReport", "strip_setid"]

SETID_BITS = stat.S_ISUID | stat.S_ISGID
#: Bounds of one walk; a tree beyond them is reported, not trusted.
MAX_ENTRIES = 2_000_000
MAX_DEPTH = 256
_SHOWN = 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class StripReport:
    """What one walk saw: how many entries, which lost their bits, whether it finished."""

    root: str
    entries: int
    stripped: int
    examples: tuple[bytes, ...]
    problem: str = ""

    @property
    def complete(self) -> bool:
        return not self.problem

    def to_detail(self) -> dict[str, object]:
        return {
            "root": self.root,
            "entries": self.entries,
            "stripped": self.stripped,
            "examples": [os.fsdecode(e) for e in self.examples],
            "complete": self.complete,
            "problem": self.problem,
        }


class _Walk:
    def __init__(self, root: str, max_entries: int, max_depth: int) -> None:
        self.root = root
        self.max_entries = max_entries
        self.max_depth = max_depth
        self.entries = 0
        self.stripped = 0
        self.examples: list[bytes] = []

    def fix(
        self, dir_fd: int, name: str, st: os.stat_result, rel: bytes, *, close_dir: bool = False
    ) -> None:
        # chmod() on the name could be redirected by a swap between the
        # lstat and the chmod; an O_PATH descriptor pins the inode, and
        # chmod through its /proc/self/fd link changes exactly that inode
        # (glibc's fchmodat(AT_SYMLINK_NOFOLLOW) does the same).
        try:
            fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
        finally:
            if close_dir:
                os.close(dir_fd)
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise OSError(0, "entry replaced during the walk")
            if not (stat.S_ISREG(now.st_mode) or stat.S_ISDIR(now.st_mode)):
                return
            if now.st_mode & SETID_BITS:
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(now.st_mode) & ~SETID_BITS)
                self.stripped += 1
                if len(self.examples) < _SHOWN:
                    self.examples.append(rel)
        finally:
            os.close(fd)

    def run(self) -> str:
        st = os.stat(self.root, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            # A single writable file (`--rw FILE`).
            self.entries = 1
            if st.st_mode & SETID_BITS:
                self.fix(
                    os.open(os.path.dirname(self.root) or ".", _DIR_FLAGS),
                    os.path.basename(self.root),
                    st,
                    os.fsencode(self.root),
                    close_dir=True,
                )
            return ""
        top = os.open(self.root, _DIR_FLAGS)
        # Each level holds its descriptor and a lazy listing (scandir keeps a
        # duplicate), so a directory with millions of names is never read
        # into memory at once; popping a level closes both.
        stack: list[tuple[int, Iterator[os.DirEntry[str]] | None, bytes]] = [(top, None, b"")]
        try:
            st = os.fstat(top)
            if st.st_mode & SETID_BITS:
                os.chmod(f"/proc/self/fd/{top}", stat.S_IMODE(st.st_mode) & ~SETID_BITS)
                self.stripped += 1
                self.examples.append(b".")
            stack[0] = (top, os.scandir(top), b"")
            while stack:
                dir_fd, listing, rel_dir = stack[-1]
                assert listing is not None
                entry = next(listing, None)
                if entry is None:
                    stack.pop()
                    _close(dir_fd, listing)
                    continue
                name = entry.name
                self.entries += 1
                if self.entries > self.max_entries:
                    return f"more than {self.max_entries} entries"
                rel = rel_dir + os.fsencode(name)
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                if st.st_mode & SETID_BITS and (is_dir or stat.S_ISREG(st.st_mode)):
                    self.fix(dir_fd, name, st, rel)
                if is_dir:
                    if len(stack) > self.max_depth:
                        return f"deeper than {self.max_depth} directories"
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                    stack.append((sub, None, rel + b"/"))
                    stack[-1] = (sub, os.scandir(sub), rel + b"/")
            return ""
        finally:
            for fd, listing, _ in stack:
                _close(fd, listing)


def _close(fd: int, listing: Iterator[os.DirEntry[str]] | None) -> None:
    if listing is not None:
        listing.close()  # type: ignore[attr-defined]
    os.close(fd)


def strip_setid(
    root: str, *, max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH
) -> StripReport:
    """Clear S_ISUID/S_ISGID on every regular file and directory under `root`.

    Symlinks are neither followed nor changed (their own mode is meaningless);
    device nodes, FIFOs and sockets are left alone (the bits do nothing on
    them). Never raises for the tree's content: an unreadable entry, a swap
    or a bound ends the walk with `problem` set.
    """
    walk = _Walk(root, max_entries, max_depth)
    try:
        problem = walk.run()
    except OSError as exc:
        where = f" ({os.fsdecode(exc.filename)})" if exc.filename else ""
        problem = f"{exc.strerror or exc}{where}"
    return StripReport(root, walk.entries, walk.stripped, tuple(walk.examples), problem)
