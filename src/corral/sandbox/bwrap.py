"""The bubblewrap command line, built as pure data.

`BwrapPlan` carries everything the launcher found out about the host (which
/etc entries exist, how /bin is linked, which file descriptors it opened);
`build_argv` turns a plan into a fresh argv list on every call and does no
I/O, so the exact command line is golden-tested and printable (`--dry-run`).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from corral.sandbox.spec import SandboxSpec

__all__ = [
    "ETC_ALLOWLIST",
    "INIT_DIR",
    "SYSTEM_SYMLINK_CANDIDATES",
    "BwrapPlan",
    "StagedBind",
    "build_argv",
    "etc_link_target",
]

#: Host /etc entries the sandbox may read. Everything else in /etc (shadow,
#: ssh host keys, pip.conf/npmrc with registry tokens, machine-id, ...) is
#: absent. passwd, group and hosts are synthesized.
ETC_ALLOWLIST: tuple[str, ...] = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "perl",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "services",
    "shells",
    "ssl",
    "terminfo",
    "timezone",
)

#: Top-level names that merged-/usr systems make symlinks into /usr.
SYSTEM_SYMLINK_CANDIDATES: tuple[str, ...] = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

#: Where the init and its helper modules appear inside the sandbox.
INIT_DIR = "/run/corral"


def etc_link_target(link: str) -> str | None:
    """Where an allowlisted `/etc` entry that is a symlink on the host (its
    text `link`) points inside: its absolute target when that lies in /usr
    (the sandbox sees the host's /usr), else None (the entry is bound).

    A bind follows the link, and given a regular /etc/localtime, ICU (in
    Node and Bun: Claude Code) recovers the zone's name by comparing every
    file of /usr/share/zoneinfo with it: 1,344 file operations per start.
    """
    target = posixpath.normpath(posixpath.join("/etc", link))
    return target if target.startswith("/usr/") else None


@dataclass(frozen=True, slots=True)
class StagedBind:
    """A user bind whose host source was staged (idmapped) at `source`."""

    source: str
    dest: str
    writable: bool


@dataclass(frozen=True, slots=True)
class BwrapPlan:
    """Host facts and file descriptors the argv refers to."""

    bwrap: str
    spec: SandboxSpec
    #: (name, target) for top-level symlinks like ("bin", "usr/bin"); names
    #: that are real directories on the host appear with target None.
    system_links: tuple[tuple[str, str | None], ...]
    etc_entries: tuple[str, ...]
    binds: tuple[StagedBind, ...]
    #: dest path -> fd whose content becomes that read-only file.
    data_files: tuple[tuple[str, int], ...]
    init_argv: tuple[str, ...]
    #: (host source, dest) read-only binds of corral's own files (the compiled init).
    ro_binds: tuple[tuple[str, str], ...] = ()
    sandbox_uid: int = 1000
    sandbox_gid: int = 1000
    seccomp_fd: int | None = None
    info_fd: int | None = None
    block_fd: int | None = None
    #: bwrap's monitor, outside the sandbox, writes {"child-pid": N} and
    #: {"exit-code": N} there: the exit status the host trusts.
    json_status_fd: int | None = None
    #: Binds over host-executed workspace paths (read-only) and their parent
    #: directories (pinned writable) (sandbox/protect.py).
    protect_binds: tuple[StagedBind, ...] = ()
    #: (entry, target) for allowlisted /etc entries that are symlinks into
    #: /usr on the host (`etc_link_target`): recreated as symlinks, not bound.
    etc_links: tuple[tuple[str, str], ...] = ()
    #: A directory staged before bwrap holding the whole /etc
    #: (`sandbox.stage`): bound read-only at /etc in place of the entries.
    etc_stage: str | None = None
    #: A /dev staged before bwrap (`sandbox.stage.stage_dev`): bound with
    #: devices allowed in place of `--dev`.
    dev_stage: str | None = None
    #: False when the process exec'ing bwrap is already in the sandbox's own
    #: network namespace (`mounts.make_net_ns`): bwrap then keeps it.
    unshare_net: bool = True


def _depth_key(bind: StagedBind) -> tuple[int, str]:
    return (bind.dest.rstrip("/").count("/"), bind.dest)


def build_argv(plan: BwrapPlan) -> list[str]:
    spec = plan.spec
    argv: list[str] = [
        plan.bwrap,
        "--unshare-user",
        "--unshare-pid",
        *(("--unshare-net",) if plan.unshare_net else ()),
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(plan.sandbox_uid),
        "--gid",
        str(plan.sandbox_gid),
        "--hostname",
        spec.hostname,
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name, target in plan.system_links:
        if target is None:
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
        else:
            argv += ["--symlink", target, f"/{name}"]
    if plan.dev_stage is not None:
        argv += ["--proc", "/proc", "--dev-bind", plan.dev_stage, "/dev"]
    else:
        argv += ["--proc", "/proc", "--dev", "/dev"]
    disk = spec.limits.disk_bytes
    # `--size` applies to the next --tmpfs only. Without --disk the areas are
    # bounded by the memory cap alone (tmpfs pages are charged to the cgroup).
    size = [] if disk is None else ["--size", str(disk)]
    if disk is not None:
        # bwrap's /dev/shm is a directory in the unbounded /dev tmpfs.
        argv += [*size, "--perms", "01777", "--tmpfs", "/dev/shm"]
    # tmpfs directories come before user binds so that a workspace below
    # /tmp or /home is mounted on top of the fresh tmpfs, not hidden by it.
    argv += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", "/home"]
    argv += [*size, "--tmpfs", "/var", "--dir", "/var/tmp"]
    argv += ["--tmpfs", "/run", "--dir", INIT_DIR]
    if not spec.home.startswith("/home/"):
        argv += [*size, "--tmpfs", spec.home]
    else:
        argv += ["--dir", spec.home]
    if plan.etc_stage is not None:
        argv += ["--ro-bind", plan.etc_stage, "/etc"]
    for entry in plan.etc_entries:
        path = posixpath.join("/etc", entry)
        argv += ["--ro-bind", path, path]
    for entry, target in plan.etc_links:
        argv += ["--symlink", target, posixpath.join("/etc", entry)]
    for dest, fd in plan.data_files:
        argv += ["--ro-bind-data", str(fd), dest]
    for source, dest in plan.ro_binds:
        argv += ["--ro-bind", source, dest]
    # Protection binds interleave with user binds by depth (user binds first
    # at equal depth): a pinned directory mounted after a deeper user bind
    # would cover it and expose what that bind hides.
    for bind in sorted((*plan.binds, *plan.protect_binds), key=_depth_key):
        argv += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
    argv += ["--remount-ro", "/"]
    if plan.seccomp_fd is not None:
        argv += ["--seccomp", str(plan.seccomp_fd)]
    if plan.info_fd is not None:
        argv += ["--info-fd", str(plan.info_fd)]
    if plan.block_fd is not None:
        argv += ["--block-fd", str(plan.block_fd)]
    if plan.json_status_fd is not None:
        argv += ["--json-status-fd", str(plan.json_status_fd)]
    argv += ["--chdir", spec.workspace, "--"]
    argv += list(plan.init_argv)
    return argv
