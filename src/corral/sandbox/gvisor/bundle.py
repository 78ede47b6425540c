"""The OCI bundle and the runsc command line, built as pure data.

`BundlePlan` carries what the launcher found out about the host (how /bin is
linked, which /etc entries exist, where each bind was staged); `build_config`
turns it into a fresh `config.json` document on every call and `runsc_argv`
into the command line, so both are golden-tested and printed by `--dry-run`.
Mount order follows `bwrap.build_argv`: system dirs, then empty tmpfs, then
the synthetic /etc files, then the user and protection binds by depth, so a
workspace below /tmp or /home lands on top of the fresh tmpfs.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from corral.sandbox.bwrap import StagedBind
from corral.sandbox.spec import SandboxSpec

__all__ = [
    "COUNT_REQUEST",
    "HOLDER_READY",
    "MAX_LEFT",
    "MAX_REPORT",
    "PLATFORMS",
    "PREBOOT_SUPERVISOR",
    "REPORT_DIR",
    "SUPERVISOR_NAME",
    "SUPERVISOR_READY",
    "SYNTHETIC_ETC",
    "TMPFS",
    "BundlePlan",
    "build_config",
    "choose_platform",
    "command_process",
    "depth_key",
    "encode_request",
    "holder",
    "mount_points",
    "parse_left",
    "parse_report",
    "runsc_argv",
    "supervisor",
]

#: gVisor platforms, best first.
PLATFORMS: tuple[str, ...] = ("systrap", "kvm", "ptrace")
#: /etc files the sandbox gets from corral, not from the host.
SYNTHETIC_ETC: tuple[str, ...] = ("passwd", "group", "hosts")
#: Where `NetworkSpec.trust_bundle` is shown (as `namespace.SYSTEM_TRUST_BUNDLE`).
TRUST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: The container's pid 1: uid 0 without capabilities, so the command (another
#: uid, no capabilities) can neither signal nor ptrace it nor open its
#: descriptors; gVisor would end the sandbox, and kill the command's other
#: processes uncounted, when it exits. dash's wait reaps any child, so what the
#: command orphans does not linger as zombies. Its child (uid 0 too) answers the
#: host's one request with the leftover count: live processes of the command's
#: uid whose parent is inside (`runsc exec`ed ones have parent 0), from the
#: sentry's /proc, with no host process started for it. A process name is the
#: only sandbox text in a status file and comes first, unescaped: the last State
#: and PPid win, and the read stops at a Uid line only after a TracerPid line, a
#: pair a name's 15 bytes cannot forge (16 with its newlines). dash reads a byte
#: per system call (each a trap on ptrace): stopping there halves the count's
#: cost, and pid 1 (the holder or the supervisor, uid 0) is not read at all.
_COUNT = """n=0
for d in /proc/[0-9]*; do
  [ "$d" = /proc/1 ] && continue
  u= p= s= t=
  {{
    while read -r k v _; do
      case $k in
        State:) s=$v ;;
        PPid:) p=$v ;;
        TracerPid:) t=1 ;;
        Uid:) u=$v; [ -n "$t" ] && break ;;
      esac
    done <"$d/status"
  }} 2>/dev/null
  [ "$u" = {uid} ] && [ "$p" != 0 ] && [ "$s" != Z ] && n=$((n + 1))
done
"""
_HOLDER_SCRIPT = (
    """exec 2>/dev/null 3<&0 0</dev/null
{{
  read -r _ <&3
"""
    + _COUNT
    + """  echo "left $n"
}} &
exec 3<&-
echo ready
while :; do sleep 100000 & wait; done
"""
)
#: Without a network hook to attach first, the container's own process runs the
#: command itself (no `runsc exec`): corral's static supervisor (_payload/gvsup.c,
#: built like the init) as uid 0 with only the capabilities it needs to become
#: the command's uid with none at all (and an empty bounding set) under
#: no_new_privs. The command runs with the container's stdio, environment and
#: cwd; the supervisor reaps what it orphans and, when it exits, counts what it
#: left (the holder's rule: the command's processes now have the supervisor as
#: a parent, so "parent inside" is the same) and writes "exit S left N" to a
#: file in REPORT_DIR, a host directory only root may open (0700; the command's
#: uid cannot), then exits, and gVisor ends the sandbox. Its descriptor to that
#: file is close-on-exec. The binary itself sits in REPORT_DIR too: no mount of
#: its own, and out of the command's reach.
#: Where the supervisor's report directory is mounted inside.
REPORT_DIR = "/run/corral-report"
#: The supervisor binary's name in REPORT_DIR.
SUPERVISOR_NAME = "gvsup"
_SUPERVISOR_CAPS = ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
_REPORT_RE = re.compile(rb"exit (\d{1,3}) left (\d{1,9})\n")
#: The longest report `parse_report` accepts.
MAX_REPORT = 64
#: What the holder writes on its stdout once it runs.
HOLDER_READY = b"ready\n"
#: What the host writes on the holder's stdin to ask for the count.
COUNT_REQUEST = b"count\n"
#: The longest answer `parse_left` accepts.
MAX_LEFT = 32
_LEFT_RE = re.compile(rb"left (\d{1,9})\n")


def holder(uid: int) -> tuple[str, ...]:
    """The holder's argv, counting leftovers of `uid` (pure)."""
    return ("/bin/sh", "-c", _HOLDER_SCRIPT.format(uid=int(uid)))


def supervisor(uid: int, gid: int, argv: tuple[str, ...]) -> tuple[str, ...]:
    """The supervisor's argv: it runs `argv` as `uid`:`gid` (pure).

    The command gets the container's environment (the spec's) untouched: no
    shell stands between them.
    """
    return (
        f"{REPORT_DIR}/{SUPERVISOR_NAME}",
        f"{REPORT_DIR}/status",
        str(int(uid)),
        str(int(gid)),
        "--",
        *argv,
    )


#: The argv of a pre-booted sandbox's supervisor: the request comes on its stdin.
PREBOOT_SUPERVISOR: tuple[str, ...] = (
    f"{REPORT_DIR}/{SUPERVISOR_NAME}",
    "--request",
    f"{REPORT_DIR}/status",
)
#: What a pre-booted supervisor writes on stdout once it waits for its request.
SUPERVISOR_READY = b"ready\n"


def encode_request(
    uid: int,
    gid: int,
    *,
    nproc: int | None,
    cwd: str,
    argv: tuple[str, ...],
    env: tuple[tuple[str, str], ...],
) -> bytes:
    """The request a pre-booted supervisor reads on stdin (gvsup.c read_request; pure).

    Raises ValueError for a field holding a NUL (no such argv or env can exist).
    """
    fields = [str(int(uid)), str(int(gid)), "-" if nproc is None else str(int(nproc)), cwd]
    fields += [str(len(argv)), *argv, *(f"{k}={v}" for k, v in env)]
    raw = [f.encode("utf-8", "surrogateescape") for f in fields]
    if any(b"\0" in f for f in raw) or not argv:
        raise ValueError("a request field holds a NUL, or there is no command")
    body = b"".join(f + b"\0" for f in raw)
    return len(body).to_bytes(4, "little") + body


def parse_report(report: bytes) -> tuple[int, int] | None:
    """(the command's status, processes it left) from the supervisor's report, or
    None unless it is exactly one "exit S left N" line with S <= 255 (pure)."""
    m = _REPORT_RE.fullmatch(report)
    if m is None or int(m.group(1)) > 255:
        return None
    return int(m.group(1)), int(m.group(2))


def parse_left(answer: bytes) -> int | None:
    """The count in the holder's answer; None unless it is exactly "left N\\n" (pure)."""
    m = _LEFT_RE.fullmatch(answer)
    return int(m.group(1)) if m else None


#: Directories that start empty and die with the sandbox.
_TMPFS: tuple[str, ...] = ("/tmp", "/home", "/var", "/var/tmp", "/run")
TMPFS = _TMPFS


@dataclass(frozen=True, slots=True)
class BundlePlan:
    """Host facts the bundle refers to; `files_dir` holds the synthetic /etc files."""

    spec: SandboxSpec
    system_links: tuple[tuple[str, str | None], ...]
    etc_entries: tuple[str, ...]
    binds: tuple[StagedBind, ...]
    files_dir: str
    protect_binds: tuple[StagedBind, ...] = ()
    uid: int = 1000
    gid: int = 1000
    #: The network namespace runsc takes its interfaces from (gvisor.net); None: none at all.
    netns_path: str | None = None
    #: A prepared /etc (gvisor.etcdir), bound whole; None: one bind per entry.
    etc_dir: str | None = None
    #: The supervisor's host report directory: the container's process runs the
    #: command itself (see supervisor()); None: the holder, and `runsc exec`.
    report_dir: str | None = None
    #: Booted ahead of its request (gvisor.preboot): the supervisor reads the
    #: command, env, cwd and process limit on stdin (PREBOOT_SUPERVISOR).
    preboot: bool = False


def depth_key(bind: StagedBind) -> tuple[int, str]:
    """Sort key: shallower destinations first (pure)."""
    return (bind.dest.rstrip("/").count("/"), bind.dest)


def _bind(source: str, dest: str, writable: bool) -> dict[str, object]:
    # nosuid/nodev: the sentry ignores setuid bits anyway; the options keep
    # the gofer's host mount as narrow as bwrap's.
    opts = ["rbind", "rw" if writable else "ro", "nosuid", "nodev"]
    return {"destination": dest, "type": "bind", "source": source, "options": opts}


def _tmpfs(dest: str, owner: tuple[int, int] | None = None) -> dict[str, object]:
    opts = ["nosuid", "nodev", "mode=1777" if dest in ("/tmp", "/var/tmp") else "mode=755"]
    if owner is not None:
        opts += [f"uid={owner[0]}", f"gid={owner[1]}"]
    return {"destination": dest, "type": "tmpfs", "source": "tmpfs", "options": opts}


def build_config(plan: BundlePlan) -> dict[str, object]:
    """The bundle's config.json: a fresh document on every call."""
    spec = plan.spec
    mounts: list[dict[str, object]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        _bind("/usr", "/usr", False),
    ]
    mounts += [_bind(f"/{n}", f"/{n}", False) for n, target in plan.system_links if target is None]
    tmpfs = list(_TMPFS)
    if spec.home not in tmpfs:
        tmpfs.append(spec.home)
    # The home directory belongs to the command (npm, pip and git write there).
    mounts += [_tmpfs(d, (plan.uid, plan.gid) if d == spec.home else None) for d in tmpfs]
    if plan.etc_dir is not None:
        mounts.append(_bind(plan.etc_dir, "/etc", False))
    else:
        for entry in plan.etc_entries:
            path = posixpath.join("/etc", entry)
            mounts.append(_bind(path, path, False))
        for name in SYNTHETIC_ETC:
            mounts.append(_bind(posixpath.join(plan.files_dir, name), f"/etc/{name}", False))
    if spec.network.trust_bundle is not None:
        # Over the host's bundle inside the /etc bound above: the host store
        # plus the run's interception CA (broker.tls_setup).
        mounts.append(_bind(spec.network.trust_bundle, TRUST_BUNDLE, False))
    for b in sorted((*plan.binds, *plan.protect_binds), key=depth_key):
        mounts.append(_bind(b.source, b.dest, b.writable))
    if plan.report_dir is not None and plan.preboot:
        mounts.append(_bind(plan.report_dir, REPORT_DIR, True))
        process = _process(list(PREBOOT_SUPERVISOR), [], "/", 0, 0, caps=_SUPERVISOR_CAPS)
    elif plan.report_dir is not None:
        mounts.append(_bind(plan.report_dir, REPORT_DIR, True))
        process = _process(
            list(supervisor(plan.uid, plan.gid, spec.argv)),
            [f"{k}={v}" for k, v in spec.env],
            spec.workspace,
            0,
            0,
            caps=_SUPERVISOR_CAPS,
        )
    else:
        # The container's own process is the holder (see holder()); the
        # command is `runsc exec`ed beside it (`command_process`).
        process = _process(list(holder(plan.uid)), ["PATH=/usr/bin:/bin"], "/", 0, 0)
    if spec.limits.pids is not None and not plan.preboot:
        # The sentry enforces RLIMIT_NPROC per uid, and `runsc exec` gives the
        # command the container's rlimits (not its own process's): the
        # command's uid gets exactly the processes the spec allows. The
        # cgroup only bounds gVisor's host tasks (backend.cgroup_limits); a
        # refusal here is the sentry's, which only its log tells (gvisor.nproc).
        n = spec.limits.pids
        process["rlimits"] = [{"type": "RLIMIT_NPROC", "hard": n, "soft": n}]
    return {
        "ociVersion": "1.0.0",
        "process": process,
        "root": {"path": "rootfs", "readonly": True},
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": t, "path": plan.netns_path}
                if t == "network" and plan.netns_path
                else {"type": t}
                for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"],
        },
    }


def _process(
    args: list[str],
    env: list[str],
    cwd: str,
    uid: int,
    gid: int,
    *,
    caps: list[str] | None = None,
) -> dict[str, object]:
    no_caps: list[str] = list(caps or ())
    return {
        "terminal": False,
        "user": {"uid": uid, "gid": gid, "additionalGids": []},
        "args": args,
        "env": env,
        "cwd": cwd,
        "capabilities": {
            "bounding": no_caps,
            "effective": list(no_caps),
            "inheritable": [],
            "permitted": list(no_caps),
            "ambient": [],
        },
        "noNewPrivileges": True,
    }


def command_process(plan: BundlePlan) -> dict[str, object]:
    """The command's OCI process, for `runsc exec --process` (a fresh document each call).

    No rlimits: `runsc exec` ignores a process's own and applies the
    container's (`build_config`).
    """
    spec = plan.spec
    return _process(
        list(spec.argv), [f"{k}={v}" for k, v in spec.env], spec.workspace, plan.uid, plan.gid
    )


def mount_points(plan: BundlePlan) -> tuple[tuple[str, str | None], ...]:
    """What the (read-only) rootfs directory must hold: (path, symlink target or None for a dir).

    Only top-level entries: deeper mount points are created by the sentry
    in the tmpfs or bind above them.
    """
    out: list[tuple[str, str | None]] = [(n, t) for n, t in plan.system_links if t is not None]
    tops = {"proc", "dev", "sys", "usr", "etc", *(n for n, t in plan.system_links if t is None)}
    tops.update(d.strip("/").split("/")[0] for d in (*_TMPFS, plan.spec.home))
    tops.update(b.dest.strip("/").split("/")[0] for b in (*plan.binds, *plan.protect_binds))
    links = {n for n, _ in out}
    out += [(n, None) for n in sorted(tops - links) if n]
    return tuple(out)


def runsc_argv(
    *,
    runsc: str,
    platform: str,
    state_dir: str,
    bundle_dir: str,
    container_id: str,
    rootless: bool = False,
    network: str = "none",
    log_file: str | None = None,
    extra_flags: tuple[str, ...] = (),
) -> list[str]:
    """`runsc run` for one bundle: no network stack but loopback, cgroups left to corral.

    `--ignore-cgroups`: corral puts runsc in the sandbox's cgroup before it
    starts, so the sentry and the gofer are charged with everything the
    sandbox does; runsc must not move them elsewhere.
    """
    argv = [
        runsc,
        "--root",
        state_dir,
        f"--platform={platform}",
        f"--network={network}",
        "--ignore-cgroups",
    ]
    if rootless:
        argv.append("--rootless")
    if log_file is not None:
        # runsc's own errors (e.g. the command cannot be executed) land
        # here, apart from the command's stderr: see backend.exec_failure.
        argv.append(f"--log={log_file}")
    argv += extra_flags
    argv += ["run", "--bundle", bundle_dir, container_id]
    return argv


def choose_platform(
    forced: str | None, *, version_date: int, hardware_virt: bool
) -> tuple[str | None, str]:
    """(platform, why) for this host; platform None when `forced` is not usable.

    systrap exists from mid-2023 runsc on; kvm needs hardware virtualisation
    (a paravirtual /dev/kvm, as under PVM, makes runsc's kvm platform hang);
    ptrace works everywhere runsc does.
    """
    usable = ["ptrace"]
    if hardware_virt:
        usable.insert(0, "kvm")
    if version_date >= 20230601:
        usable.insert(0, "systrap")
    if forced is not None:
        if forced not in PLATFORMS:
            return None, f"unknown gVisor platform {forced!r}; one of {', '.join(PLATFORMS)}"
        if forced not in usable:
            return None, f"platform {forced} is not usable on this host"
        return forced, "requested"
    return usable[0], "best available"
