"""Where corral's per-user sockets live, and refusing to hand those directories to a sandbox.

The launcher, the resident broker and the exec control sockets sit in a
0700 `corral-<uid>` directory. A sandbox that could reach one could ask for
a new sandbox with any `--rw` path (the launcher), or for egress (the
broker): the peer-uid check is the only other guard, and a sandbox of a
non-root user runs as that very uid on the host. So no bind may contain
such a directory or lie inside one.

Kept free of imports beyond `os`: it runs on `corral exec`'s start path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from corral.errors import UsageError

__all__ = ["launcher_dir", "refuse_socket_dirs", "runtime_base", "socket_dirs"]


def runtime_base(environ: Mapping[str, str]) -> str:
    """`$XDG_RUNTIME_DIR`, else `$TMPDIR`, else /tmp (absolute paths only): the front end's rule."""
    for name in ("XDG_RUNTIME_DIR", "TMPDIR"):
        value = environ.get(name, "")
        if value.startswith("/"):
            return value
    return "/tmp"


def launcher_dir(environ: Mapping[str, str]) -> str:
    """The directory of the launcher's socket (`$CORRAL_LAUNCHER_SOCKET`'s when set)."""
    override = environ.get("CORRAL_LAUNCHER_SOCKET", "")
    if override.startswith("/"):
        return os.path.dirname(override)
    return os.path.join(runtime_base(environ), f"corral-{os.getuid()}", "launcher")


def socket_dirs(environ: Mapping[str, str]) -> list[str]:
    """Every existing directory of corral's per-user sockets."""
    uid = f"corral-{os.getuid()}"
    # The brokers' bases (broker/control.py, broker/resident.py: `$XDG_RUNTIME_DIR`
    # or tempfile.gettempdir(), which tries $TMPDIR, $TEMP, $TMP, then /tmp) and the launcher's.
    names = ("XDG_RUNTIME_DIR", "TMPDIR", "TEMP", "TMP")
    bases = {"/tmp", *(environ[n] for n in names if environ.get(n, "").startswith("/"))}
    candidates = {os.path.join(b, uid) for b in bases} | {launcher_dir(environ)}
    return sorted(d for d in candidates if os.path.isdir(d))


def refuse_socket_dirs(trees: Sequence[str], environ: Mapping[str, str]) -> None:
    """UsageError when a tree the sandbox sees holds, or lies in, a socket directory."""
    from corral.sandbox.placement import writable_tree_of

    for d in socket_dirs(environ):
        tree = writable_tree_of(d, trees)
        if tree is None:
            tree = next((t for t in trees if writable_tree_of(t, [d])), None)
        if tree is not None:
            raise UsageError(
                f"{tree} overlaps {d}, where corral's launcher and broker sockets live (a sandbox"
                " reaching them could start another sandbox); choose another directory"
            )
