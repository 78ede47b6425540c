"""What a microVM run is, as pure data: the QEMU command line and the guest's init.

`VMPlan` holds everything `build_argv` needs; `init_script` renders the
guest's /init (a busybox shell script) from a `SandboxSpec`. Neither does
I/O, so both are golden-tested, and `--dry-run` prints `build_argv`.

Guest devices (virtio-mmio, `-M microvm`, no PCI, no NIC):

- virtio-serial ports with fixed numbers: 1 the exit report (root-only in
  the guest), 2 the command's stdout, 3 its stderr; each is a host pipe;
  4 ("net", only when the sandbox has a `SandboxNet`): a socketpair end, the
  multiplexed channel to the guest's loopback relay (`microvm/net.py`);
- 9p shares: the host's /usr read-only (tag "usr"), the workspace (tag
  "ws") and each bind ("b0", "b1", ...) at the same path as on the host.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from corral.sandbox.microvm.cpio import Entry
from corral.sandbox.spec import SandboxSpec

__all__ = [
    "GUEST_MODULES",
    "MAX_TRUST_BUNDLE",
    "PORT_ERR",
    "PORT_NET",
    "PORT_OUT",
    "PORT_STATUS",
    "START",
    "TRUST_BUNDLE",
    "GuestReport",
    "Share",
    "VMPlan",
    "build_argv",
    "init_script",
    "kernel_cmdline",
    "parse_report",
    "trust_entries",
]

PORT_STATUS = 1
PORT_OUT = 2
PORT_ERR = 3
PORT_NET = 4
#: Where the init puts the loopback relay (`corral/_payload/vm_relay.py`).
RELAY = "/corral/relay.py"

#: Kernel modules the guest loads, in dependency order (Debian builds them as modules).
GUEST_MODULES: tuple[str, ...] = (
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_console",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
)

BUSYBOX = "/corral/busybox"
#: Where `NetworkSpec.trust_bundle` is shown (as `namespace.SYSTEM_TRUST_BUNDLE`).
TRUST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: The largest trust bundle copied into the initramfs (Debian's is ~220 KiB).
MAX_TRUST_BUNDLE = 8 << 20
#: The init's first line on port 1, just before it runs the command.
START = b"start\n"


@dataclass(frozen=True, slots=True)
class Share:
    """A host directory the guest mounts over 9p at `guest_path`."""

    tag: str
    host_path: str
    guest_path: str
    writable: bool


@dataclass(frozen=True, slots=True)
class VMPlan:
    """Everything the QEMU command line depends on."""

    qemu: str
    kernel: str
    initrd: str
    accel: str  # "kvm" or "tcg"
    memory_mib: int
    cpus: int
    shares: tuple[Share, ...]
    #: host paths QEMU opens for ports 1..3 (pipes, as /proc/self/fd/N)
    status_path: str
    stdout_path: str
    stderr_path: str
    tsc_khz: int | None = None
    #: TCG translation-cache size (MiB): bounds the VMM's own memory
    tb_size_mib: int = 64
    #: the descriptor QEMU uses as port 4's socket (None: no network channel)
    net_fd: int | None = None


def kernel_cmdline(plan: VMPlan) -> str:
    # reboot=t: the guest resets by triple fault, which `-no-reboot` turns
    # into QEMU exiting; panic=-1 makes a guest panic do the same.
    parts = ["quiet", "loglevel=0", "reboot=t", "panic=-1", "rdinit=/init"]
    if plan.tsc_khz:
        # TSC calibration against the emulated PIT takes seconds under TCG.
        parts.append(f"tsc_early_khz={plan.tsc_khz}")
    return " ".join(parts)


def build_argv(plan: VMPlan) -> list[str]:
    """QEMU's argv for `plan`: a fresh list on every call."""
    if plan.accel == "kvm":
        accel = ["-accel", "kvm", "-cpu", "host"]
    else:
        accel = ["-accel", f"tcg,tb-size={plan.tb_size_mib}", "-cpu", "max"]
    argv = [
        plan.qemu,
        "-M",
        "microvm,isa-serial=off",
        *accel,
        "-m",
        str(plan.memory_mib),
        "-smp",
        str(plan.cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-nic",
        "none",
        "-no-reboot",
        # QEMU's own seccomp filter: no exec, no setuid, no obsolete syscalls.
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-kernel",
        plan.kernel,
        "-initrd",
        plan.initrd,
        "-append",
        kernel_cmdline(plan),
        "-device",
        "virtio-serial-device,max_ports=8",
    ]
    for nr, cid, path in (
        (PORT_STATUS, "status", plan.status_path),
        (PORT_OUT, "out", plan.stdout_path),
        (PORT_ERR, "err", plan.stderr_path),
    ):
        argv += [
            "-chardev",
            f"file,id={cid},path={path},append=on",
            "-device",
            f"virtserialport,chardev={cid},nr={nr},name={cid}",
        ]
    if plan.net_fd is not None:
        argv += [
            "-chardev",
            f"socket,id=net,fd={plan.net_fd}",
            "-device",
            f"virtserialport,chardev=net,nr={PORT_NET},name=net",
        ]
    for s in plan.shares:
        ro = "" if s.writable else ",readonly=on"
        argv += [
            "-fsdev",
            f"local,id={s.tag},path={_qemu_opt(s.host_path)},security_model=none,multidevs=remap{ro}",
            "-device",
            f"virtio-9p-device,fsdev={s.tag},mount_tag={s.tag}",
        ]
    return argv


def _qemu_opt(value: str) -> str:
    # QEMU option values escape a comma by doubling it.
    return value.replace(",", ",,")


def shares_for(spec: SandboxSpec) -> tuple[Share, ...]:
    """The 9p shares a spec needs: /usr (ro), the workspace (rw), its binds."""
    shares = [
        Share("usr", "/usr", "/usr", False),
        Share("ws", spec.workspace, spec.workspace, True),
    ]
    for i, b in enumerate(spec.binds):
        shares.append(Share(f"b{i}", b.path, b.path, b.writable))
    return tuple(shares)


def trust_entries(bundle: bytes) -> tuple[Entry, ...]:
    """The per-run initramfs members that show `bundle` at `TRUST_BUNDLE`.

    The guest's /etc is the initramfs's, not the host's, so the bundle (host
    store + the run's interception CA, broker.tls_setup) travels in the
    archive: root-owned 0644 under root-owned directories, so the command
    (never guest root) cannot replace it.
    """
    if len(bundle) > MAX_TRUST_BUNDLE:
        raise ValueError(f"the trust bundle is larger than {MAX_TRUST_BUNDLE} bytes")
    return (
        Entry.dir("etc/ssl"),
        Entry.dir("etc/ssl/certs"),
        Entry.file(TRUST_BUNDLE.lstrip("/"), bundle, 0o644),
    )


def _q(value: str) -> str:
    return shlex.quote(value)


def init_script(
    spec: SandboxSpec,
    shares: tuple[Share, ...],
    *,
    uid: int,
    gid: int,
    guest_binds: tuple[tuple[str, bool], ...] = (),
    net: bool = False,
) -> str:
    """The guest's /init: mount, run the command as uid:gid, report, reset.

    `guest_binds` are (path, writable) bound over themselves inside the
    guest after the shares, in order: the protected host-executed workspace
    paths (read-only) and the directories pinned above them.

    With `net`, the loopback relay (guest root) starts first and the command
    only once the host said GO (after the broker's listener is bound).

    The report ("exit N LEFT", "oom 137 LEFT" when the guest kernel
    OOM-killed the command, or "error N message"; LEFT: the processes still
    alive when the command ended, which die with the guest) goes to port 1, which only
    guest root can open; the command never holds it. Everything it prints
    goes to ports 2 and 3, which the host treats as the command's output.
    """
    b = BUSYBOX
    env = [f"{k}={v}" for k, v in spec.env]
    for k, _ in spec.env:
        if not k or "=" in k or "\0" in k:
            raise ValueError(f"bad environment name {k!r}")
    if "=" in spec.argv[0]:
        # env(1) would read it as an assignment.
        raise ValueError(f"a command name may not contain '=': {spec.argv[0]!r}")
    lines = [
        f"#!{b} sh",
        f"B={b}",
        f'fail() {{ echo "error 125 $1" >/dev/vport0p{PORT_STATUS}; $B reboot -f; }}',
        "$B mount -t proc -o nosuid,nodev,noexec proc /proc",
        "$B mount -t sysfs -o nosuid,nodev,noexec sys /sys",
        "$B mount -t devtmpfs -o nosuid,noexec dev /dev",
        f"for m in {' '.join(GUEST_MODULES)}; do",
        '  $B insmod /corral/modules/$m.ko || fail "cannot load $m"',
        "done",
        # /tmp first: a workspace below /tmp is mounted on top of it.
        "$B mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp",
        "opts=trans=virtio,version=9p2000.L,cache=none,msize=262144,nosuid,nodev",
    ]
    for s in shares:
        ro = ",ro" if not s.writable else ""
        lines += [
            f"$B mkdir -p {_q(s.guest_path)}",
            f"$B mount -t 9p -o $opts{ro} {s.tag} {_q(s.guest_path)}"
            f" || fail {_q('cannot mount ' + s.tag)}",
        ]
    for path, writable in guest_binds:
        lines.append(f"$B mount -o bind {_q(path)} {_q(path)} || fail {_q('cannot protect')}")
        if not writable:
            lines.append(f"$B mount -o remount,bind,ro {_q(path)} || fail {_q('cannot protect')}")
    lines += [
        "$B mkdir -p /var/tmp && $B chmod 1777 /var/tmp",
        f"$B mkdir -p {_q(spec.home)} && $B chown {uid}:{gid} {_q(spec.home)}",
        f"$B hostname {_q(spec.hostname)}",
        f"echo 'corral:x:{uid}:{gid}::{spec.home}:/bin/sh' >/etc/passwd",
        f"echo 'corral:x:{gid}:' >/etc/group",
        f"echo '127.0.0.1 localhost {spec.hostname}' >/etc/hosts",
        "$B ip link set lo up",
        "relay=none",
        *(_relay_lines() if net else []),
        f"$B chown {uid}:{gid} /dev/vport0p{PORT_OUT} /dev/vport0p{PORT_ERR}",
        f"$B chmod 0600 /dev/vport0p{PORT_STATUS}",
        f"cd {_q(spec.workspace)} || fail 'cannot enter the workspace'",
        *(_pids_lines(spec.limits.pids) if spec.limits.pids is not None else ["cg=/"]),
        'oom0="$($B grep oom_kill /proc/vmstat)"',
        # The host's --timeout counts from here, not from the (slow under TCG) boot.
        f"echo start >/dev/vport0p{PORT_STATUS}",
        # The subshell joins the command's cgroup (writing 0 moves the writer)
        # and becomes the command: init itself stays out of its pids count.
        '( [ "$cg" = / ] || echo 0 >"/sys/fs/cgroup$cg/cgroup.procs"'
        " || fail 'cannot join the pids cgroup';"
        " exec /usr/bin/setpriv"
        f" --reuid={uid} --regid={gid} --clear-groups"
        " --inh-caps=-all --bounding-set=-all --no-new-privs --"
        " /usr/bin/env -i -- "
        + " ".join(_q(e) for e in env)
        + " "
        + " ".join(_q(a) for a in spec.argv)
        + f" </dev/null >/dev/vport0p{PORT_OUT} 2>/dev/vport0p{PORT_ERR} )",
        "rc=$?",
        # The guest kernel's OOM-kill counter tells a memory kill from another SIGKILL.
        "kind=exit",
        'oom1="$($B grep oom_kill /proc/vmstat)"',
        '[ "$rc" = 137 ] && [ "$oom1" != "$oom0" ] && kind=oom',
        "ooms=$((${oom1#oom_kill } - ${oom0#oom_kill }))",
        "hits=0",
        '[ "$cg" = / ] || while read -r k v; do [ "$k" = max ] && hits=$v; done'
        " </sys/fs/cgroup/cmd/pids.events",
        # A fork loop can be refused millions of times: the report's counts
        # are bounded, so a longer one is clamped (never a rejected report).
        f"[ ${{#ooms}} -gt {MAX_LEFT_DIGITS} ] && ooms={'9' * MAX_LEFT_DIGITS}",
        f"[ ${{#hits}} -gt {MAX_LEFT_DIGITS} ] && hits={'9' * MAX_LEFT_DIGITS}",
        *_count_left_lines(),
        # Whatever the command left behind dies with the guest.
        f'echo "$kind $rc $left $ooms $hits" >/dev/vport0p{PORT_STATUS}',
        "$B reboot -f",
        "",
    ]
    return "\n".join(lines)


def _pids_lines(pids: int) -> list[str]:
    # The guest kernel's pids controller, not RLIMIT_NPROC: same bound (only
    # the command is in the cgroup, as only it ran as its uid), and its
    # pids.events counts the forks it refused, which the report carries.
    return [
        "$B mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup"
        " || fail 'cannot mount the guest cgroup2'",
        "$B mkdir /sys/fs/cgroup/cmd || fail 'cannot set the pids limit'",
        "echo +pids >/sys/fs/cgroup/cgroup.subtree_control || fail 'cannot set the pids limit'",
        f"echo {pids} >/sys/fs/cgroup/cmd/pids.max || fail 'cannot set the pids limit'",
        "cg=/cmd",
    ]


def _relay_lines() -> list[str]:
    # The relay writes "go" to the FIFO on the host's GO; if it dies first,
    # the subshell writes "fail", so the init never waits on a dead relay.
    return [
        f"$B chmod 0600 /dev/vport0p{PORT_NET}",
        "$B mkfifo -m 0600 /run/corral-go || fail 'cannot create the relay FIFO'",
        f"{{ /usr/bin/python3 -I -S {RELAY} /dev/vport0p{PORT_NET} /run/corral-go"
        " </dev/null >/dev/null 2>&1; echo fail >/run/corral-go; } &",
        "relay=$!",
        "read -r go </run/corral-go",
        "[ \"$go\" = go ] || fail 'the loopback relay did not start'",
    ]


def _count_left_lines() -> list[str]:
    # Shell builtins only (a forked counter would count itself): every
    # process but init, kernel threads (pid 2 and its children) and the
    # relay (its subshell and that subshell's child).
    return [
        "left=0",
        "for d in /proc/[0-9]*; do",
        "  p=${d#/proc/}; pp=",
        '  [ "$p" = 1 ] || [ "$p" = 2 ] || [ "$p" = "$relay" ] && continue',
        "  { while read -r k v _; do",
        '    [ "$k" = PPid: ] && pp=$v && break',
        '  done <"$d/status"; } 2>/dev/null',
        '  [ -z "$pp" ] || [ "$pp" = 2 ] || [ "$pp" = "$relay" ] && continue',
        "  left=$((left+1))",
        "done",
    ]


@dataclass(frozen=True, slots=True)
class GuestReport:
    """The guest init's exit line, parsed: every number is the guest's word."""

    kind: str  # "exit", "oom" or "error"
    code: int
    message: str = ""
    #: processes still alive when the command ended (they die with the guest)
    left: int = 0
    #: the guest kernel's OOM kills while the command ran (/proc/vmstat delta)
    oom_kills: int = 0
    #: forks the guest's pids controller refused the command (pids.events max)
    pids_limit_hits: int = 0


def parse_report(data: bytes) -> GuestReport | None:
    """ "exit N LEFT OOMS HITS", "oom 137 LEFT OOMS HITS" or "error N message"
    from port 1's bytes, else None.

    The bytes come from inside the guest: after the init's "start" line,
    only one bounded line of the exact form counts; anything else (several
    reports, junk) is no report at all.
    """
    data = data.removeprefix(START)
    if len(data) > 4096 or data.count(b"\n") != 1 or not data.endswith(b"\n"):
        return None
    try:
        text = data[:-1].decode("ascii")
    except UnicodeDecodeError:
        return None
    kind, _, rest = text.partition(" ")
    num, _, message = rest.partition(" ")
    if kind not in ("exit", "oom", "error") or not _digits(num, 3):
        return None
    code = int(num)
    if code > 255 or (kind == "oom" and code != 137):
        return None
    if kind == "error":
        return GuestReport(
            kind, code, "".join(c if c.isprintable() else "?" for c in message)[:200]
        )
    # The counts are the guest's word (guest root could forge them): bounded numbers, no more.
    counts = message.split(" ")
    if len(counts) != 3 or not all(_digits(c, MAX_LEFT_DIGITS) for c in counts):
        return None
    left, ooms, hits = (int(c) for c in counts)
    return GuestReport(kind, code, "", left, ooms, hits)


#: At most this many digits in a report's counts (a guest cannot run more).
MAX_LEFT_DIGITS = 6


def _digits(text: str, most: int) -> bool:
    return 0 < len(text) <= most and all("0" <= c <= "9" for c in text)
