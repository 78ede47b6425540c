"""Is a host state file inside a tree the sandbox can write? (M13)

Corral's own files (the journal, the broker config, run state) must be out of
the sandbox's reach, or it rewrites the record of what it did. String
prefixes are not enough: the same directory can be reached through a bind
mount, `..` or a symlink. So the file's directory is walked up to `/` through
`..` by descriptor, and each ancestor is compared with the writable trees by
(st_dev, st_ino).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["writable_tree_of"]

_MAX_LEVELS = 4096


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def writable_tree_of(path: str, trees: Sequence[str]) -> str | None:
    """The entry of `trees` that contains `path` (which need not exist yet), or None.

    `path` counts as inside a tree when the tree is the file itself or any
    directory above where the file really lands (symlinks followed, as the
    program that opens it will). Trees that do not exist are ignored.
    """
    ids: dict[tuple[int, int], str] = {}
    for tree in trees:
        try:
            ids.setdefault(_key(os.stat(tree)), tree)
        except OSError:
            continue
    if not ids:
        return None
    cur = os.path.abspath(path)
    while not os.path.lexists(cur) and cur != "/":
        cur = os.path.dirname(cur)
    real = os.path.realpath(cur)
    try:
        st = os.stat(real)
    except OSError:
        return None
    if _key(st) in ids:
        return ids[_key(st)]
    start = real if os.path.isdir(real) else os.path.dirname(real)
    root = _key(os.stat("/"))
    fd = os.open(start, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(_MAX_LEVELS):
            key = _key(os.fstat(fd))
            if key in ids:
                return ids[key]
            if key == root:
                return None
            parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
    # Deeper than any real tree: treat as inside, the caller refuses.
    return next(iter(ids.values()))
