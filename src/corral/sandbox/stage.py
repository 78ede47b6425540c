"""Mounts built before bubblewrap starts, in the root child's private mount namespace.

bwrap's `bind_mount()` re-reads /proc/self/mountinfo after every `--bind`,
`--ro-bind`, `--ro-bind-data` and `--dev` (to fix up the flags of each
submount), so with ~60 binds its setup was quadratic in the mount table and
took ~20 ms of a ~60 ms sandbox; the mounts themselves cost ~2 ms. When
corral is root its child already runs in a private mount namespace
(`mounts.make_private_mount_ns`) before exec'ing bwrap, so the many small
binds are built there with the new mount API (open_tree(OPEN_TREE_CLONE),
mount_setattr, move_mount: a few syscalls each, no mountinfo parse) and bwrap
gets one recursive bind per tree:

* `/etc`: a small tmpfs at `ETC_STAGE` holding a read-only clone of each
  allowlisted host entry, the symlinks into /usr and the synthesized files
  (passwd, group, hosts, ssh_config), then made read-only as a whole; bwrap
  binds it with one `--ro-bind ETC_STAGE /etc`.
* `/dev`: what bwrap 0.8's `--dev` builds (`stage_dev`), bound with one
  `--dev-bind`.
* the protection binds (`sandbox/protect.py`: read-only guards over
  host-executed names, writable pins of their parent directories): bound over
  themselves inside the staged tree, so bwrap's one `--bind` of that tree
  carries them.

Every mount made here is read-only (or a pin of a writable tree) when bwrap
unshares its user namespace, and the kernel locks the flags of every mount it
copies into a less privileged mount namespace (MNT_LOCK_READONLY,
MNT_LOCKED): inside the sandbox nothing here can be remounted writable or
unmounted, even with CAP_SYS_ADMIN in the sandbox's user namespace, unlike
the read-only binds bwrap makes itself. Nothing here is visible in the host's
mount namespace, and the mounts vanish with the child's namespace.

`plan_etc` is pure; `stage_dev`, `stage_etc` and `self_bind` run in the forked child
before exec (no imports, no locks: raw syscalls through `mounts`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from corral.sandbox import mounts
from corral.sandbox.bwrap import StagedBind

__all__ = [
    "DEV_STAGE",
    "ETC_STAGE",
    "EtcStage",
    "EtcTuple",
    "SelfBind",
    "describe",
    "plan_etc",
    "self_bind",
    "split_protect",
    "stage_dev",
    "stage_etc",
]

#: The staged /etc, a tmpfs of its own inside the stage directory.
ETC_STAGE = f"{mounts.STAGE_DIR}/etc"
#: The staged /dev (bwrap's --dev, built here).
DEV_STAGE = f"{mounts.STAGE_DIR}/dev"
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("fd", "/proc/self/fd"),
    ("core", "/proc/kcore"),
    ("ptmx", "pts/ptmx"),
)
_PAGE = 4096


#: `EtcStage` as plain tuples, for a `marshal`led request (`prefork`).
EtcTuple = tuple[
    tuple[str, ...], tuple[tuple[str, str], ...], tuple[tuple[str, bytes], ...],
    tuple[tuple[str, bool], ...],
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class EtcStage:
    """What the sandbox's /etc holds (names relative to /etc)."""

    #: Host /etc entries cloned read-only (a symlink among them is followed,
    #: as bwrap's bind followed it).
    entries: tuple[str, ...]
    #: (entry, target): symlinks recreated as they are on the host.
    links: tuple[tuple[str, str], ...]
    #: (relative path, content): synthesized files; a parent directory that
    #: is not an entry (`ssh` for ssh/ssh_config) is created.
    files: tuple[tuple[str, bytes], ...]
    #: (relative path, is a directory): where a user bind (`--ro /etc/ssh`)
    #: lands outside every entry; made here, since bwrap cannot create a
    #: mountpoint in the read-only staged /etc.
    mountpoints: tuple[tuple[str, bool], ...] = ()

    def as_tuple(self) -> EtcTuple:
        return (self.entries, self.links, self.files, self.mountpoints)

    @classmethod
    def from_tuple(cls, t: EtcTuple) -> EtcStage:
        # marshal gives tuples back as tuples: the fields need no conversion.
        return cls(*t)

    def size_option(self) -> bytes:
        """The tmpfs size: each file rounded to pages, plus slack for the inodes."""
        pages = sum(-(-len(c) // _PAGE) for _, c in self.files) + 8
        inodes = len(self.entries) + 64 + sum(p.count("/") + 1 for p, _ in self.mountpoints)
        return f"mode=0755,size={pages * _PAGE},nr_inodes={inodes}".encode()


def plan_etc(
    entries: tuple[str, ...],
    links: tuple[tuple[str, str], ...],
    data_files: list[tuple[str, bytes]],
    bind_dests: tuple[tuple[str, bool], ...] = (),
) -> tuple[EtcStage, list[tuple[str, bytes]]]:
    """Split the data files: those under /etc go into the stage (pure).

    `bind_dests` are (destination, is a directory) of the user binds.
    Returns the stage and the data files bwrap still places (outside /etc).
    """
    staged = [(d.removeprefix("/etc/"), c) for d, c in data_files if d.startswith("/etc/")]
    rest = [(d, c) for d, c in data_files if not d.startswith("/etc/")]
    linked = {e for e, _ in links}
    cloned = [e for e in entries if e not in linked]
    points = tuple(
        (d.removeprefix("/etc/"), is_dir)
        for d, is_dir in bind_dests
        if d.startswith("/etc/") and d.removeprefix("/etc/").split("/")[0] not in entries
    )
    return EtcStage(tuple(cloned), links, tuple(staged), points), rest


#: (staged tree, path relative to it, writable, where the sandbox sees it).
SelfBind = tuple[str, str, bool, str]


def split_protect(
    binds: tuple[StagedBind, ...], roots: tuple[str, ...]
) -> tuple[tuple[SelfBind, ...], tuple[StagedBind, ...]]:
    """Protection binds whose source lies inside a staged tree, as self-binds
    in that tree in mount order (parents first; the tree's one recursive bind
    then carries them to their destination); the others stay bwrap binds. Pure."""
    own: list[SelfBind] = []
    rest: list[StagedBind] = []
    for b in binds:
        root = next((r for r in roots if b.source.startswith(r + "/")), None)
        if root is None:
            rest.append(b)
        else:
            own.append((root, b.source[len(root) + 1 :], b.writable, b.dest))
    own.sort(key=lambda s: (s[1].count("/"), s[1]))
    return tuple(own), tuple(rest)


def describe(
    etc: EtcStage | None, selfs: tuple[SelfBind, ...], *, dev: bool = False, net: bool = False
) -> list[tuple[str, str, str]]:
    """(what, source, destination) of every staged mount, for `--dry-run` (pure).

    `net`: the child also makes the network namespace (`mounts.make_net_ns`).
    """
    out: list[tuple[str, str, str]] = []
    if net:
        out.append(("netns", "new", "lo"))
    if dev:
        out += [("dev-clone", f"/dev/{n}", f"{DEV_STAGE}/{n}") for n in _DEV_NODES]
        out += [("symlink", t, f"{DEV_STAGE}/{n}") for n, t in _DEV_LINKS]
        out.append(("devpts", "newinstance,ptmxmode=0666,mode=620", f"{DEV_STAGE}/pts"))
        out.append(("dev-clone", "(the terminal on stdout, if any)", f"{DEV_STAGE}/console"))
    if etc is not None:
        out += [("ro-clone", f"/etc/{e}", f"{ETC_STAGE}/{e}") for e in etc.entries]
        out += [("symlink", t, f"{ETC_STAGE}/{e}") for e, t in etc.links]
        out += [("file", f"({len(c)} bytes)", f"{ETC_STAGE}/{p}") for p, c in etc.files]
        out += [("mountpoint", "(for a user bind)", f"{ETC_STAGE}/{p}") for p, _ in etc.mountpoints]
    for root, rel, writable, dest in selfs:
        out.append(("self-bind" if writable else "ro-self-bind", f"{root}/{rel}", dest))
    return out


def stage_dev(uid: int, gid: int) -> None:
    """bwrap's `--dev` at DEV_STAGE (child side, before exec), for one `--dev-bind`.

    As bwrap 0.8 builds it: a nosuid,nodev tmpfs owned by the sandbox's host
    uid, binds of six host device nodes (nosuid), the /proc/self/fd links,
    `shm` and `pts` owned by the sandbox, a new devpts instance on `pts`
    (ptmxmode=0666, mode=620) with `ptmx` linked to it, and when stdout is a
    terminal (corral's pty relay) that terminal as `console`.
    """
    os.mkdir(DEV_STAGE, 0o755)
    mounts.mount_tmpfs(
        b"tmpfs", DEV_STAGE, f"mode=0755,uid={uid},gid={gid}".encode(), nosuid_nodev=True
    )
    nodes = [(f"/dev/{n}", n) for n in _DEV_NODES]
    if os.isatty(1):
        nodes.append((os.ttyname(1), "console"))
    for src, name in nodes:
        target = f"{DEV_STAGE}/{name}"
        os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o444))
        os.chown(target, uid, gid)
        tree = mounts.clone_tree(mounts.AT_FDCWD, src.encode(), follow=False)
        try:
            mounts.set_nosuid(tree, src)
            mounts.attach(tree, mounts.AT_FDCWD, target.encode(), src)
        finally:
            os.close(tree)
    for name, link in _DEV_LINKS:
        path = f"{DEV_STAGE}/{name}"
        os.symlink(link, path)
        os.lchown(path, uid, gid)
    for name in ("shm", "pts"):
        path = f"{DEV_STAGE}/{name}"
        os.mkdir(path, 0o755)
        os.chown(path, uid, gid)
    mounts.mount_devpts(f"{DEV_STAGE}/pts")


def stage_etc(etc: EtcStage) -> None:
    """Build the sandbox's /etc at ETC_STAGE, read-only (child side, before exec)."""
    os.mkdir(ETC_STAGE, 0o755)
    mounts.mount_tmpfs(b"corral-etc", ETC_STAGE, etc.size_option())
    for name in etc.entries:
        src = f"/etc/{name}"
        target = f"{ETC_STAGE}/{name}"
        tree = mounts.clone_tree(mounts.AT_FDCWD, src.encode(), follow=True)
        try:
            # The clone's own root says whether the mountpoint is a directory.
            if stat.S_ISDIR(os.fstat(tree).st_mode):
                os.mkdir(target, 0o755)
            else:
                os.close(
                    os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                )
            # Read-only with the rest of the tree below (one recursive mount_setattr).
            mounts.attach(tree, mounts.AT_FDCWD, target.encode(), src)
        finally:
            os.close(tree)
    for name, target in etc.links:
        os.symlink(target, f"{ETC_STAGE}/{name}")
    for rel, is_dir in etc.mountpoints:
        path = f"{ETC_STAGE}/{rel}"
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        if is_dir:
            os.makedirs(path, 0o755, exist_ok=True)
        elif not os.path.lexists(path):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
    for rel, content in etc.files:
        path = f"{ETC_STAGE}/{rel}"
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.mkdir(parent, 0o755)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    mounts.set_readonly_path(ETC_STAGE)


def self_bind(root: str, rel: str, writable: bool) -> None:
    """Bind `root/rel` over itself (read-only unless `writable`) (child side).

    `rel` is resolved beneath `root` with no symlink followed: the workspace
    is the sandbox's, and a link swapped in since the scan must not redirect
    a guard (a pinned or guarded path that became a link is refused).
    """
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = mounts.open_beneath(root_fd, rel.encode())
    finally:
        os.close(root_fd)
    try:
        tree = mounts.clone_tree(where, b"", follow=False)
        try:
            if not writable:
                mounts.set_readonly(tree, rel)
            mounts.attach(tree, where, b"", rel)
        finally:
            os.close(tree)
    finally:
        os.close(where)
