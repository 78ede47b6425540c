"""A newc ("070701") cpio writer for the guest's initramfs (pure).

The kernel unpacks concatenated archives in order, later entries replacing
earlier ones, so a cached base archive (busybox, modules) and a small per-run
archive (the init script) are simply written one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Entry", "archive"]

_DIR = 0o040000
_FILE = 0o100000
_SYMLINK = 0o120000


@dataclass(frozen=True, slots=True)
class Entry:
    """One archive member: a directory (data None, no target), file or symlink."""

    name: str
    mode: int
    data: bytes | None = None
    target: str | None = None

    @classmethod
    def dir(cls, name: str, perm: int = 0o755) -> Entry:
        return cls(name, _DIR | perm)

    @classmethod
    def file(cls, name: str, data: bytes, perm: int = 0o644) -> Entry:
        return cls(name, _FILE | perm, data)

    @classmethod
    def symlink(cls, name: str, target: str) -> Entry:
        return cls(name, _SYMLINK | 0o777, target=target)


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def _member(ino: int, name: str, mode: int, body: bytes) -> bytes:
    raw = name.encode() + b"\0"
    # Every member is owned by root:root with mtime 0, so an archive's bytes
    # depend only on its entries (it is cached by content).
    fields = (ino, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(raw), 0)
    head = b"070701" + b"".join(b"%08X" % f for f in fields)
    return head + raw + _pad4(len(head) + len(raw)) + body + _pad4(len(body))


def archive(entries: list[Entry] | tuple[Entry, ...], *, first_ino: int = 1) -> bytes:
    """The newc archive of `entries`, in order, with its trailer."""
    out = []
    for i, e in enumerate(entries):
        if e.name.startswith("/") or ".." in e.name.split("/") or "\0" in e.name:
            raise ValueError(f"bad archive member name {e.name!r}")
        body = e.target.encode() if e.target is not None else e.data or b""
        out.append(_member(first_ino + i, e.name, e.mode, body))
    out.append(_member(0, "TRAILER!!!", 0, b""))
    return b"".join(out)
