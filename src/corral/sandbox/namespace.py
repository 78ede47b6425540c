"""The `namespace` backend: bubblewrap + cgroups + seccomp + Landlock.

Start-up, in order (each step fails closed):

1. check the layers the profile needs (bwrap, user namespaces, a writable
   cgroup hierarchy, seccomp, Landlock, idmapped mounts when root); a missing
   one raises LayerUnavailableError unless the spec names it in
   `allow_degraded`;
2. create the sandbox's cgroup with its limits;
3. fork; in the child (before exec): join the cgroup, and when corral is root
   enter a private mount namespace, stage idmapped clones of the workspace and
   the --ro/--rw paths, build /etc, /dev and the protection guards there
   (`stage`: bwrap then needs a handful of binds, not ~60), drop to the
   sandbox's own unprivileged host uid (`uids.allocate`; as root, bwrap
   would keep its capabilities), set
   PDEATHSIG, install the connect() notification filter and send its
   listener to corral, whose `unix_supervisor` thread answers it (M3); then
   exec bwrap with the seccomp filter as `--seccomp FD` and stdio that holds
   no terminal (`terminal`);
4. bwrap builds the namespaces and mounts and runs the init (init.c, or
   init.py), which applies Landlock and runs the command in a nested domain.

Teardown after the command exits (the init then holds the namespace until the
host has counted the leftovers; see RunningSandbox), on timeout, or on a
signal to corral: kill the cgroup, wait until it is empty, read the kernel's
counters, remove the cgroup. If corral itself is SIGKILLed, bwrap's --die-with-parent kills the
namespace's pid 1, and the kernel then kills every process in the PID
namespace; the empty cgroup is swept by the next corral start.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from corral._payload import path as payload_path
from corral.errors import CgroupError, LayerUnavailableError, SandboxStartError
from corral.sandbox import bwrap as bw
from corral.sandbox import interrupts, mounts, stage
from corral.sandbox.cgroup import Cgroup, CgroupLayout, CgroupUsage, sweep_stale
from corral.sandbox.handle import CgroupProcessHandle
from corral.sandbox.spec import ExecResult, SandboxSpec
from corral.sandbox.terminal import stdio_without_tty

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from corral.sandbox.backend import NamespaceConfig, SandboxNet
    from corral.sandbox.netns import NetNs
    from corral.sandbox.prefork import Prepared
    from corral.sandbox.protect import Placeholders
    from corral.sandbox.spec import ExitReason
    from corral.sandbox.uids import UidLease
    from corral.sandbox.unix_admit import UnixConnectEvent
    from corral.sandbox.unix_supervisor import ChildInstaller as UnixChildInstaller
    from corral.sandbox.unix_supervisor import UnixSupervisor

__all__ = [
    "INSIDE_UID",
    "SANDBOX_HOST_GID",
    "SANDBOX_HOST_UID",
    "ExecResult",
    "NamespaceBackend",
    "NamespaceSandbox",
    "RunningSandbox",
    "landlock_rules_for",
]

#: Where Debian-family clients read the system trust store.
SYSTEM_TRUST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SYSTEM_SSH_CONFIG = "/etc/ssh/ssh_config"

#: The first host uid/gid of the default range (`uids.DEFAULT_RANGE`); when
#: corral runs as root each live sandbox gets its own id from the range.
SANDBOX_HOST_UID = 64000
SANDBOX_HOST_GID = 64000
#: The uid/gid the command sees inside its user namespace.
INSIDE_UID = 1000
INIT_PYTHON = "/usr/bin/python3"
_WRITABLE_DEV = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
)
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_SRC_DIR = os.path.dirname(os.path.abspath(__file__))


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        cand = os.path.join(d or ".", name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def cache_dir() -> str:
    if os.geteuid() == 0:
        return "/var/cache/corral"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "corral")


def landlock_rules_for(spec: SandboxSpec) -> dict[str, object]:
    """The Landlock rule set the init applies, as its JSON-ready dict."""
    # /dev itself is read-only so nothing can be created in bwrap's device
    # tmpfs; only the device nodes and the shm/pts directories are writable.
    ro = ["/usr", "/etc", bw.INIT_DIR, "/dev"]
    rw = [spec.workspace, "/tmp", "/var/tmp", spec.home, *_WRITABLE_DEV, "/proc"]
    for b in spec.binds:
        (rw if b.writable else ro).append(b.path)
    return {
        "read_only": ro,
        "read_write": rw,
        "scope_abstract_unix": True,
        "scope_signal": True,
        "log_new_exec": True,
    }


def _passwd(home: str) -> bytes:
    return (
        f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"corral:x:{INSIDE_UID}:{INSIDE_UID}:corral sandbox:{home}:/bin/sh\n"
        f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ).encode()


def _group() -> bytes:
    return f"root:x:0:\ncorral:x:{INSIDE_UID}:\nnogroup:x:65534:\n".encode()


def _hosts(hostname: str) -> bytes:
    return f"127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n".encode()


def set_pdeathsig(signum: int) -> None:
    """prctl(PR_SET_PDEATHSIG, signum), checked: raises OSError when the kernel refuses."""
    if _libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def child_setup(
    *,
    attach_fds: Sequence[int],
    is_root: bool,
    binds: Sequence[tuple[str, bool]],
    userns_fd: int,
    host_uid: int,
    host_gid: int,
    parent: int,
    unix: UnixChildInstaller | None,
    err_w: int,
    etc_stage: stage.EtcStage | None,
    self_binds: Sequence[stage.SelfBind],
    make_net: bool = True,
    gate: Callable[[], None] | None = None,
) -> None:
    """The sandbox child between fork and exec of bwrap (Popen's preexec_fn, or `prefork`'s child).

    Joins the cgroup (when `attach_fds`), enters the sandbox's network
    namespace (`mounts.make_net_ns`), stages the idmapped binds, /dev,
    /etc and the guards' self-binds in a private mount namespace and drops to
    the sandbox's host uid (root), arms PDEATHSIG, installs the connect()
    notification filter. A failure's reason goes to `err_w`. `gate` returns
    once the self-binds' placeholders exist (`protect.Placeholders.finish`,
    run by the parent meanwhile); it raises if they never will.
    """
    try:
        for fd in attach_fds:
            os.write(fd, b"0")
        if is_root:
            mounts.make_private_mount_ns()
            if make_net:  # else a parked child (`prefork`) made it before the request
                mounts.make_net_ns()
            for i, (path, writable) in enumerate(binds):
                mounts.stage_bind(i, path, writable, userns_fd)
            if etc_stage is not None:  # with it the plan binds the staged /dev
                stage.stage_dev(host_uid, host_gid)
                stage.stage_etc(etc_stage)
            if gate is not None:
                gate()
            for root, rel, writable, _ in self_binds:
                stage.self_bind(root, rel, writable)
            os.setgroups([])
            os.setresgid(host_gid, host_gid, host_gid)
            os.setresuid(host_uid, host_uid, host_uid)
        # Set after the uid change, which clears it.
        set_pdeathsig(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(125)
        if unix is not None:
            unix.install()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(err_w, str(exc).encode()[:4000])
        raise


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@dataclass
class _Layers:
    active: dict[str, object] = field(default_factory=dict)

    def need(self, spec: SandboxSpec, name: str, reason: str | None, hint: str) -> bool:
        """Record a layer; raise if it is missing and not explicitly degraded."""
        if reason is None:
            return True
        if name not in spec.allow_degraded:
            raise LayerUnavailableError(name, reason, hint, degradable=True)
        self.active[name] = f"degraded: {reason}"
        return False


@dataclass(frozen=True, slots=True)
class _Facts:
    bwrap: str | None
    userns: tuple[str, str] | None
    layout: CgroupLayout | None
    cgroup: str | None
    bpf: bytes | None
    seccomp: str | None
    abi: int
    landlock: str | None
    unix: str | None


class NamespaceSandbox:
    """Starts one SandboxSpec under bubblewrap. Use `start()` once."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        cgroup_parent: str = "corral",
        cgroup_layout: CgroupLayout | None = None,
        network_hook: Callable[[int], None] | None = None,
        init_kind: Literal["auto", "c", "python"] = "auto",
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> None:
        """`stdio`: descriptors for the sandbox's stdin, stdout, stderr (default: corral's own)."""
        self.spec = spec
        # None: inherit corral's stdio, with /dev/null for any terminal.
        self._stdio = stdio
        self.init_kind = init_kind
        self._abi = 0
        self.cgroup_parent = cgroup_parent
        self._layout = cgroup_layout
        self._network_hook = network_hook
        self._unix_observer = unix_observer
        self.is_root = os.geteuid() == 0

    # -- layer checks (cheap: file reads and one syscall, no subprocess) --
    def _facts(self) -> _Facts:
        """What this host offers for the spec, each layer with why not (no decision)."""
        from corral.sandbox.layers import (
            cgroup_layout,
            cgroup_unwritable,
            kernel_features,
            userns_blocked,
        )

        layout = self._layout if self._layout is not None else cgroup_layout()
        bpf: bytes | None = None
        try:
            from corral.sandbox import seccomp

            bpf = seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, cache_dir())
            seccomp_reason = None
        except Exception as exc:  # fail closed: any failure means no filter
            seccomp_reason = f"cannot build the seccomp filter: {exc}"
        from corral.sandbox import landlock

        abi, unix_reason = kernel_features()
        ll_reason = None if abi > 0 else "Landlock is not enabled in this kernel"
        if ll_reason is None:
            try:
                landlock.plan(landlock.LandlockRules.from_dict(landlock_rules_for(self.spec)), abi)
            except landlock.LandlockError as exc:
                ll_reason = exc.strerror or str(exc)
        return _Facts(
            bwrap=_which("bwrap"),
            userns=userns_blocked(),
            layout=layout,
            cgroup=cgroup_unwritable(layout),
            bpf=bpf,
            seccomp=seccomp_reason,
            abi=abi,
            landlock=ll_reason,
            unix=unix_reason,
        )

    def check(self) -> dict[str, str | None]:
        """Each layer the spec needs -> None when this host offers it, else why not."""
        f = self._facts()
        return {
            "bwrap": None if f.bwrap else "bwrap not found on PATH",
            "userns": f.userns[0] if f.userns else None,
            "cgroup": f.cgroup,
            "seccomp": f.seccomp,
            "landlock": f.landlock,
            "unix": f.unix,
        }

    def _check_layers(self) -> tuple[_Layers, CgroupLayout | None, bytes | None, bool, str]:
        spec = self.spec
        f = self._facts()
        layers = _Layers()
        if not f.bwrap:
            raise LayerUnavailableError(
                "bwrap", "bwrap not found on PATH", "apt-get install bubblewrap"
            )
        layers.active["bwrap"] = True
        if f.userns is not None:
            # Without user namespaces bwrap cannot build the sandbox at all.
            raise LayerUnavailableError("userns", *f.userns)
        layers.active["userns"] = True
        layers.active["pidns"] = True
        layers.active["netns"] = True

        layout = f.layout
        if layers.need(spec, "cgroup", f.cgroup, "run as root or delegate a cgroup subtree"):
            assert layout is not None
            layers.active["cgroup"] = layout.kind
        else:
            layout = None
        bpf = f.bpf
        if layers.need(spec, "seccomp", f.seccomp, "apt-get install libseccomp2"):
            layers.active["seccomp"] = True
        else:
            bpf = None
        use_landlock = layers.need(spec, "landlock", f.landlock, "boot with lsm=...,landlock")
        if use_landlock:
            layers.active["landlock"] = f.abi
        self._abi = f.abi
        if layers.need(spec, "unix", f.unix, "Linux >= 5.9 with seccomp user notification"):
            layers.active["unix"] = True
        if self.is_root:
            layers.active["idmap"] = True
        return layers, layout, bpf, use_landlock, f.bwrap

    def _validate(self) -> None:
        spec = self.spec
        if not os.path.isdir(spec.workspace):
            raise SandboxStartError(2, f"workspace {spec.workspace} is not a directory")

    def start(self) -> RunningSandbox:
        """Start the sandbox; raises LayerUnavailableError or SandboxStartError."""
        self._validate()
        layers, layout, bpf, use_landlock, bwrap_path = self._check_layers()
        if layout is not None and self._layout is None and self.cgroup_parent == "corral":
            # Not below a caller's cgroup (`corral run` freezes its own v1 freezer cgroup).
            layout = layout.without_v2_stand_ins()
        spec = self.spec
        binary = None
        if self.init_kind != "python":
            from corral.sandbox.initbin import init_binary

            binary = init_binary(cache_dir())
            if binary is None and self.init_kind == "c":
                raise SandboxStartError(0, "the compiled init is unavailable (no C compiler?)")
        if binary is None and not os.access(INIT_PYTHON, os.X_OK):
            raise LayerUnavailableError(
                "init",
                f"no C compiler for the compiled init and no {INIT_PYTHON}",
                "apt-get install gcc or python3",
            )
        layers.active["init"] = "c" if binary else "python"
        started = time.monotonic()
        cgroup: Cgroup | None = None
        lease: UidLease | None = None
        fds_to_close: list[int] = []
        host_fds: list[int] = []
        placeholders: Placeholders | None = None
        running: RunningSandbox | None = None
        unix: UnixChildInstaller | None = None
        spawned: Prepared | None = None
        try:
            if layout is not None:
                # A warm launcher worker forked this sandbox's child ahead, in its cgroup
                # (only a process that prepared one has the module: no import otherwise).
                prefork = sys.modules.get("corral.sandbox.prefork")
                if prefork is not None:
                    spawned = prefork.take(layout, self.cgroup_parent, spec.limits)
                if spawned is not None:
                    cgroup = spawned.cgroup
                else:
                    with contextlib.suppress(CgroupError, OSError):
                        sweep_stale(layout, self.cgroup_parent)
                    name = f"{spec.env_kind}-{os.getpid()}-{os.urandom(4).hex()}"
                    cgroup = Cgroup.create(layout, f"{self.cgroup_parent}/{name}", spec.limits)
            attach_fds = cgroup.open_attach_fds() if cgroup and spawned is None else []
            fds_to_close += attach_fds

            status_r, status_w = os.pipe()
            fds_to_close.append(status_w)
            host_fds.append(status_r)
            # The host closes hold_w once it has counted the leftovers; until
            # then the init keeps the namespace (and the leftovers) in place.
            hold_r, hold_w = os.pipe()
            fds_to_close.append(hold_r)
            bwrap_status_r, bwrap_status_w = os.pipe()
            fds_to_close.append(bwrap_status_w)
            host_fds += [hold_w, bwrap_status_r]
            err_r, err_w = os.pipe()
            fds_to_close.append(err_w)
            pass_fds = [status_w, hold_r, bwrap_status_w]
            seccomp_log_fd = None
            if bpf is not None and binary is not None:
                from corral.sandbox import seccomp

                # The compiled init loads it again with SECCOMP_FILTER_FLAG_LOG.
                seccomp_log_fd = seccomp.bpf_fd(bpf)
                fds_to_close.append(seccomp_log_fd)
                pass_fds.append(seccomp_log_fd)

            init_argv, init_files, init_binds = init_command(
                spec,
                binary=binary,
                abi=self._abi if use_landlock else 0,
                status_fd=status_w,
                hold_fd=hold_r,
                seccomp_log_fd=seccomp_log_fd,
            )
            data_fds: list[int] = []
            # As root, the files under /etc go into the staged /etc (`stage`).
            for dest, content in _bwrap_data(spec, init_files, staged_etc=self.is_root):
                fd = _memfd(os.path.basename(dest), content)
                fds_to_close.append(fd)
                pass_fds.append(fd)
                data_fds.append(fd)

            seccomp_fd = None
            if bpf is not None:
                from corral.sandbox import seccomp

                seccomp_fd = seccomp.bpf_fd(bpf)
                fds_to_close.append(seccomp_fd)
                pass_fds.append(seccomp_fd)

            info_fd = block_w = block_r = info_r = None
            if self._network_hook is not None:
                block_r, block_w = os.pipe()
                fds_to_close.append(block_r)
                pass_fds.append(block_r)
                if not self.is_root:
                    # bwrap makes the network namespace: its child's pid names it.
                    info_r, info_fd = os.pipe()
                    fds_to_close.append(info_fd)
                    pass_fds.append(info_fd)

            binds = _binds(spec)
            staged = _staged(binds, root=self.is_root)
            userns_fd = -1
            host_uid, host_gid = SANDBOX_HOST_UID, SANDBOX_HOST_GID
            if self.is_root:
                from corral.sandbox import prewarm, uids

                uid_range = uids.configured_range()
                # A warm launcher worker made both before its request (sandbox.prewarm).
                ready = prewarm.take_userns(uid_range)
                if ready is not None:
                    lease, userns_fd = ready
                else:
                    lease = uids.allocate(uid_range)
                host_uid, host_gid = lease.uid, lease.gid
                if ready is None:
                    userns_fd = mounts.make_userns_fd(os.getuid(), os.getgid(), host_uid, host_gid)
                fds_to_close.append(userns_fd)
            is_root = self.is_root
            protect_binds: tuple[bw.StagedBind, ...] = ()
            if spec.protect:
                from corral.sandbox.protect import start_protection

                # A prepared child is sent its request first and stages everything but
                # the self-binds while this process makes the placeholders (`gate`).
                protect_binds, placeholders = start_protection(
                    spec, staged, cache_dir(), defer=spawned is not None and self.is_root
                )
                layers.active["protect"] = placeholders.summary
            etc_stage, self_binds, protect_binds = _stage_for(
                spec, init_files, staged, protect_binds, root=self.is_root
            )

            plan = bwrap_plan(
                spec,
                bwrap=bwrap_path,
                staged=staged,
                init=(init_argv, init_files, init_binds),
                data_fds=data_fds,
                seccomp_fd=seccomp_fd,
                info_fd=info_fd,
                block_fd=block_r,
                json_status_fd=bwrap_status_w,
                protect_binds=protect_binds,
                etc_stage=etc_stage,
                own_net=is_root,
            )
            argv = bw.build_argv(plan)
            parent = os.getpid()
            if layers.active.get("unix") is True:
                from corral.sandbox import unix_supervisor

                unix = unix_supervisor.ChildInstaller(
                    unix_supervisor.notify_filter(), spec.allow_unix
                )

            def preexec() -> None:
                child_setup(
                    attach_fds=attach_fds, is_root=is_root, binds=binds, userns_fd=userns_fd,
                    host_uid=host_uid, host_gid=host_gid, parent=parent, unix=unix, err_w=err_w,
                    etc_stage=etc_stage, self_binds=self_binds,
                )  # fmt: skip

            stdio = self._stdio
            if stdio is None:
                stdio, null_fd = stdio_without_tty()
                if null_fd is not None:
                    fds_to_close.append(null_fd)
            env = dict(spec.env)
            # Until the RunningSandbox exists, nothing but this frame can
            # kill what Popen forks: an interrupt waits (sandbox.interrupts).
            with interrupts.deferred():
                try:
                    # preexec_fn runs Python between fork and exec. That is safe
                    # even when the caller has other threads (the coordinator
                    # does): child_setup takes no Python-level lock (no import,
                    # no logging, modules already loaded), CPython resets the GIL
                    # in the child, and glibc's malloc is fork-safe; it only makes
                    # raw syscalls through os and ctypes.
                    if spawned is not None:
                        keep = [err_w] + ([userns_fd] if userns_fd >= 0 else [])
                        unix_half = None
                        if unix is not None:
                            unix_half = (unix.program, unix.child_fd)
                            keep.append(unix.child_fd)
                        proc: subprocess.Popen[bytes] = spawned.launch(
                            argv, env=env, stdio=stdio, pass_fds=pass_fds, keep_fds=keep,
                            setup=(is_root, binds, userns_fd, host_uid, host_gid, parent,
                                   unix_half, err_w,
                                   None if etc_stage is None else etc_stage.as_tuple(),
                                   list(self_binds)),
                            gate=placeholders.finish if placeholders and placeholders.deferred
                            else None,
                        )  # fmt: skip
                    else:
                        proc = subprocess.Popen(
                            argv,
                            stdin=stdio[0],
                            stdout=stdio[1],
                            stderr=stdio[2],
                            env=env,
                            pass_fds=pass_fds,
                            preexec_fn=preexec,  # noqa: PLW1509
                            close_fds=True,
                            cwd="/",
                        )
                except (OSError, subprocess.SubprocessError) as exc:
                    os.close(err_w)
                    fds_to_close.remove(err_w)
                    detail = os.read(err_r, 4096).decode(errors="replace").strip()
                    os.close(err_r)
                    if isinstance(exc, SandboxStartError):
                        raise  # the placeholders' (`gate`): its own words
                    raise SandboxStartError(0, f"cannot start bwrap: {detail or exc}") from exc
                os.close(err_r)
                for fd in fds_to_close:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                fds_to_close = []
                supervisor = None
                if unix is not None:
                    try:
                        supervisor = unix.start_supervisor(self._unix_observer)
                    except BaseException:
                        proc.kill()
                        proc.wait()
                        raise
                    finally:
                        unix.close()
                running = RunningSandbox(
                    proc=proc,
                    cgroup=cgroup,
                    status_fd=status_r,
                    layers=layers.active,
                    started=started,
                    spec=spec,
                    uid_lease=lease,
                    hold_fd=hold_w,
                    bwrap_status_fd=bwrap_status_r,
                    placeholders=placeholders,
                )
                running.unix_supervisor = supervisor
                lease = None
                host_fds = []
                placeholders = None
            if self._network_hook is not None:
                assert block_w is not None
                try:
                    # As root the child made the namespace before exec'ing bwrap, whose
                    # monitor stays in it: no wait for bwrap's child, which sets up its
                    # mounts meanwhile and then waits on the block descriptor.
                    net_pid = proc.pid if info_r is None else _read_child_pid(info_r)
                    self._network_hook(net_pid)
                    os.write(block_w, b"1")
                except BaseException:
                    running.kill_all()
                    running.close()
                    raise
                finally:
                    if info_r is not None:
                        os.close(info_r)
                    os.close(block_w)
            return running
        except BaseException:
            if running is not None:
                # Interrupted as the deferred block ended: the sandbox is whole.
                with contextlib.suppress(Exception):
                    running.kill_all()
                with contextlib.suppress(Exception):
                    running.close()
                raise
            for fd in fds_to_close + host_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if unix is not None:
                unix.close()
            if spawned is not None:
                spawned.release_child()
            if cgroup is not None:
                with contextlib.suppress(CgroupError):
                    cgroup.remove()
            if lease is not None:
                lease.close()
            if placeholders is not None:
                placeholders.release()
            raise


def _read_child_pid(fd: int, timeout_s: float = 10.0) -> int:
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"}" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxStartError(0, "bwrap did not report its child pid")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    try:
        return int(json.loads(buf.decode())["child-pid"])
    except (ValueError, KeyError) as exc:
        raise SandboxStartError(0, f"bwrap failed before the sandbox started ({buf!r})") from exc


def _system_links() -> tuple[tuple[str, str | None], ...]:
    out: list[tuple[str, str | None]] = []
    for name in bw.SYSTEM_SYMLINK_CANDIDATES:
        path = f"/{name}"
        if os.path.islink(path):
            out.append((name, os.readlink(path)))
        elif os.path.isdir(path):
            out.append((name, None))
    return tuple(out)


def _etc_entries() -> tuple[str, ...]:
    return tuple(e for e in bw.ETC_ALLOWLIST if os.path.lexists(f"/etc/{e}"))


def _etc_links() -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for entry in bw.ETC_ALLOWLIST:
        try:
            link = os.readlink(f"/etc/{entry}")
        except OSError:
            continue
        target = bw.etc_link_target(link)
        if target is not None:
            out.append((entry, target))
    return tuple(out)


def decide_exit(
    *,
    host_code: int | None,
    bwrap_rc: int | None,
    exit_ev: dict[str, object] | None,
    err_ev: dict[str, object] | None,
    oom_kills: int,
    timed_out: bool,
    interrupted: int,
) -> tuple[int, ExitReason, str]:
    """(exit status, reason, message) of a finished sandbox (pure).

    The status is bwrap's (`host_code`, from its monitor outside the
    sandbox); the init's events only name the reason and carry a message.
    The two must agree: an exit event with another code, or status 0 with no
    exit event (the init writes one before every exit 0), means something in
    the sandbox rewrote one of them (possible only when Landlock is degraded:
    bwrap's pid 1 is then reachable), and the outcome fails closed (125).
    """
    if timed_out:
        return 124, "timeout", ""
    if interrupted:
        return 128 + interrupted, "killed", ""
    if host_code is not None:
        if host_code == 128 + signal.SIGKILL and oom_kills > 0:
            return host_code, "oom", ""
        if err_ev is not None and err_ev.get("code") == host_code:
            message = str(err_ev.get("message", ""))
            if host_code == 125:
                return host_code, "refused", message
            return host_code, "exited", message
        said = exit_ev.get("code") if exit_ev is not None else None
        if (exit_ev is not None and said != host_code) or (host_code == 0 and exit_ev is None):
            return (
                125,
                "refused",
                f"the sandbox's exit reports disagree (init: {said!r}, bwrap: {host_code});"
                " treated as a failure",
            )
        if host_code > 128 and (exit_ev is None or exit_ev.get("signal") == host_code - 128):
            # The command was killed by that signal, or the init itself was.
            return host_code, "killed", ""
        return host_code, "exited", ""
    if oom_kills > 0:
        return 137, "oom", ""
    if bwrap_rc is not None and bwrap_rc < 0:
        return 128 - bwrap_rc, "killed", ""
    return 125, "refused", f"the sandbox failed to start (bwrap exit status {bwrap_rc})"


def exec_result(
    *,
    events: list[dict[str, object]],
    host_code: int | None,
    bwrap_rc: int | None,
    usage: CgroupUsage | None,
    leftovers: int,
    wall_s: float,
    layers: dict[str, object],
    timed_out: bool,
    interrupted: int,
) -> ExecResult:
    """The report of a finished namespace sandbox from what the host collected (pure).

    `events` are the init's (untrusted: they only add a reason or message,
    `decide_exit`); the numbers are the kernel's counters and the host's
    leftover count.
    """
    exits = [e for e in events if e.get("event") == "exit"]
    # The init writes one exit event; several mean one was written for it.
    several: dict[str, object] = {"event": "exit", "code": None}
    exit_ev = exits[0] if len(exits) == 1 else several if exits else None
    err_ev = next((e for e in events if e.get("event") == "error"), None)
    oom = usage.oom_kills if usage else 0
    code, reason, message = decide_exit(
        host_code=host_code,
        bwrap_rc=bwrap_rc,
        exit_ev=exit_ev,
        err_ev=err_ev,
        oom_kills=oom,
        timed_out=timed_out,
        interrupted=interrupted,
    )
    return ExecResult(
        exit=code,
        reason=reason,
        wall_s=wall_s,
        cpu_s=usage.cpu_s if usage else 0.0,
        peak_memory_bytes=usage.peak_memory_bytes if usage else 0,
        processes_killed_at_end=leftovers,
        layers=layers,
        oom_kills=oom,
        pids_limit_hits=usage.pids_limit_hits if usage else 0,
        message=message,
        events=tuple(events),
    )


def count_leftovers(
    procs: dict[int, tuple[int, tuple[int, ...]]], *, monitor: int, pid1: int | None
) -> int:
    """How many of the cgroup's processes belong to the command (pure; `leftover_pids`)."""
    return len(leftover_pids(procs, monitor=monitor, pid1=pid1))


def leftover_pids(
    procs: dict[int, tuple[int, tuple[int, ...]]], *, monitor: int, pid1: int | None
) -> list[int]:
    """The cgroup's processes that belong to the command (pure).

    `procs` maps each host pid in the sandbox's cgroup to (ppid, NSpid) as
    the host's /proc shows them. The support processes are identified by
    pid, never by a number the sandbox reports: bwrap's monitor (corral's
    child, outside the PID namespace), the namespace's pid 1 (bwrap's
    child-pid, reported by the monitor) and the init (pid 1's child that is
    pid 2 in the namespace: pid 1 forks it first, and the pid stays the
    init's while it is alive). Everything else is the command's.
    """
    if pid1 is None:
        pid1 = next((p for p, (_, ns) in procs.items() if ns[1:2] == (1,)), None)
    support = {monitor}
    if pid1 is not None:
        support.add(pid1)
        support.update(p for p, (pp, ns) in procs.items() if pp == pid1 and ns[1:2] == (2,))
    return sorted(p for p in procs if p not in support)


#: Leftover process names kept for the exit report (ExecResult.killed_names).
_MAX_KILLED_NAMES = 16


def _comm(pid: int) -> str:
    # comm is at most 15 bytes, set by the process itself (prctl/exec): hostile text.
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            return fh.read(64).rstrip(b"\n").decode("utf-8", "surrogateescape")
    except OSError:
        return "?"


def _proc_identity(pid: int) -> tuple[int, tuple[int, ...]] | None:
    # One read and two finds per process: teardown reads this for every
    # leftover (1,000 of them in bench/teardown.py), and a line-by-line parse
    # of the ~60-line file was most of that teardown.
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # exited meanwhile: not a leftover
    try:
        data = os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return int(_status_field(data, b"\nPPid:") or b"-1"), tuple(
            int(x) for x in _status_field(data, b"\nNSpid:").split()
        )
    except ValueError:
        return None


def _status_field(data: bytes, key: bytes) -> bytes:
    i = data.find(key)
    if i < 0:
        return b""
    i += len(key)
    j = data.find(b"\n", i)
    return data[i : j if j >= 0 else len(data)]


class RunningSandbox(CgroupProcessHandle):
    """A started sandbox: wait for it, kill it, read its usage. Call close() last.

    Where the exit report's values come from (the init is inside the sandbox,
    so nothing it says is trusted):

    - exit status: bwrap's monitor, which runs outside the sandbox's
      namespaces as corral's child, writes `{"exit-code": N}` on
      --json-status-fd when the namespace's pid 1 (bwrap's own init) sees
      its first child, corral's init, exit; the init exits with the
      command's status. The command cannot reach the monitor (another PID
      namespace, parent user namespace) nor pid 1 (pid 1 ignores signals
      from its namespace; Landlock refuses ptrace-mode access to a process
      outside the caller's domain), nor the init (non-dumpable, and the
      command runs in a nested Landlock domain: no ptrace, no /proc/<pid>/mem
      or /proc/<pid>/fd, no signals with ABI >= 6). Killing or stopping the
      init can only turn the status into 137 or a timeout, never a success.
    - processes_killed_at_end: counted by the host in the cgroup's
      cgroup.procs, support processes identified by pid (`count_leftovers`),
      while the init holds the namespace after the command's exit (the init
      waits until the host closes the hold pipe). A forged or early "exit"
      event could only make the count larger.
    - cpu, memory, OOM kills, pids-limit hits: the kernel's cgroup counters.
    - the init's events only add a message or a reason ("killed" when they
      agree with the host's exit status); they never change a number.
    """

    def __init__(
        self,
        *,
        proc: subprocess.Popen[bytes],
        cgroup: Cgroup | None,
        status_fd: int,
        layers: dict[str, object],
        started: float,
        spec: SandboxSpec,
        uid_lease: UidLease | None = None,
        hold_fd: int = -1,
        bwrap_status_fd: int = -1,
        placeholders: Placeholders | None = None,
    ) -> None:
        self.proc = proc
        #: The host uid/gid this sandbox holds (None when corral is not root).
        self.uid_lease = uid_lease
        self.placeholders = placeholders
        self.cgroup = cgroup
        self._status_fd = status_fd
        self._hold_fd = hold_fd
        self._bwrap_fd = bwrap_status_fd
        self._layers = layers
        self.started = started
        self.spec = spec
        self._status_buf = b""
        self._bwrap_buf = b""
        self._status_eof = False
        self.events: list[dict[str, object]] = []
        #: What bwrap's monitor reported: "child-pid", "exit-code".
        self.bwrap_status: dict[str, int] = {}
        self._closed = False
        self._leftovers: int | None = None
        self._leftover_names: tuple[str, ...] = ()
        self.unix_supervisor: UnixSupervisor | None = None
        #: Held references to the network namespace (`NetNs`), released by close().
        self.nets: list[NetNs] = []
        os.set_blocking(status_fd, False)
        if bwrap_status_fd >= 0:
            os.set_blocking(bwrap_status_fd, False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def layers(self) -> Mapping[str, object]:
        """The protection layers that are active (read-only)."""
        return MappingProxyType(self._layers)

    @staticmethod
    def _read_lines(fd: int, buf: bytes) -> tuple[list[bytes], bytes, bool]:
        eof = False
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # BlockingIOError included
                break
            if not chunk:
                eof = True
                break
            buf += chunk
            if len(buf) > 1 << 20:  # a flood: keep the newest megabyte
                buf = buf[-(1 << 20) :]
        *lines, buf = buf.split(b"\n")
        return lines, buf, eof

    def _drain_status(self) -> None:
        if not self._status_eof:
            lines, self._status_buf, self._status_eof = self._read_lines(
                self._status_fd, self._status_buf
            )
            for line in lines:
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if isinstance(ev, dict):
                        self.events.append(ev)
        if self._bwrap_fd >= 0:
            lines, self._bwrap_buf, _ = self._read_lines(self._bwrap_fd, self._bwrap_buf)
            for line in lines:
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if not isinstance(ev, dict):
                        continue
                    for key in ("child-pid", "exit-code"):
                        val = ev.get(key)
                        if isinstance(val, int) and key not in self.bwrap_status:
                            self.bwrap_status[key] = val

    def freeze(self) -> None:
        """Stop every process of the sandbox (the cgroup freezer, v1 or v2)."""
        if self.cgroup is None:
            raise CgroupError(0, "no cgroup: the sandbox cannot be frozen")
        self.cgroup.freeze()

    def thaw(self) -> None:
        if self.cgroup is None:
            raise CgroupError(0, "no cgroup: the sandbox cannot be thawed")
        self.cgroup.thaw()

    def _release(self) -> None:
        if self._hold_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._hold_fd)
            self._hold_fd = -1

    def _step(self) -> None:
        self._drain_status()
        if self._hold_fd >= 0 and any(e.get("event") == "exit" for e in self.events):
            self._count_leftovers()
            self._release()

    def poll(self) -> int | None:
        """bwrap's exit status once it has exited, else None; never blocks.

        A caller that watches the sandbox itself must use this, not
        `proc.poll()`: when the command has exited, this is what counts the
        leftovers and releases the init, which holds the namespace until then.
        """
        self._step()
        return self.proc.poll()

    def wait(self, timeout_s: float | None = None) -> ExecResult:
        """Wait for the main process (or the timeout), then tear everything down.

        When the init says the command exited, the host counts the leftovers
        (the init is holding the namespace), then releases the init.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        timed_out = False
        if self.poll() is not None:  # already reaped: there is no pid to watch
            return self._finish(timed_out=False)
        pidfd = os.pidfd_open(self.proc.pid)
        try:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    timed_out = True
                    break
                watch = [pidfd] if self._status_eof else [pidfd, self._status_fd]
                select.select(watch, [], [], left)
        finally:
            os.close(pidfd)
        if timed_out:
            self._count_leftovers()
            self.kill_all()
            self.proc.wait()
        return self._finish(timed_out=timed_out)

    def _finish(self, *, timed_out: bool, interrupted: int = 0) -> ExecResult:
        self._drain_status()
        if self._leftovers is None:
            # No "exit" event (the init died or never started the command):
            # whatever is still in the cgroup is counted, a lower bound.
            self._count_leftovers()
        self._release()
        if self.cgroup is not None:
            with contextlib.suppress(CgroupError):
                self.cgroup.kill()
            self.cgroup.wait_empty(10.0)
        usage = self.usage()
        self._drain_status()
        result = exec_result(
            events=self.events,
            host_code=self.bwrap_status.get("exit-code"),
            bwrap_rc=self.proc.returncode,
            usage=usage,
            leftovers=self._leftovers or 0,
            wall_s=time.monotonic() - self.started,
            layers=dict(self._layers),
            timed_out=timed_out,
            interrupted=interrupted,
        )
        return dataclasses.replace(result, killed_names=self._leftover_names)

    def _count_leftovers(self) -> None:
        if self.cgroup is None:
            return
        self._drain_status()
        procs: dict[int, tuple[int, tuple[int, ...]]] = {}
        with contextlib.suppress(CgroupError, OSError):
            for pid in self.cgroup.pids():
                ident = _proc_identity(pid)
                if ident is not None:
                    procs[pid] = ident
        pids = leftover_pids(procs, monitor=self.proc.pid, pid1=self.bwrap_status.get("child-pid"))
        if len(pids) >= (self._leftovers or 0):
            self._leftover_names = tuple(_comm(p) for p in pids[:_MAX_KILLED_NAMES])
        self._leftovers = max(len(pids), self._leftovers or 0)

    def interrupt(self, signum: int) -> ExecResult:
        """Corral got a signal: kill everything and report it."""
        self._count_leftovers()
        self.kill_all()
        self.proc.wait()
        return self._finish(timed_out=False, interrupted=signum)

    def close(self) -> None:
        """Kill anything left, remove the cgroup, release descriptors."""
        if self._closed:
            return
        self._closed = True
        emptied = False
        try:
            self._release()
            if self.proc.poll() is None:
                self.kill_all()
                self.proc.wait()
            if self.cgroup is not None:
                self.cgroup.remove()
                emptied = True
        finally:
            for net in self.nets:
                net.close()
            if self.unix_supervisor is not None:
                self.unix_supervisor.close()
            for fd in (self._status_fd, self._bwrap_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if self.uid_lease is not None:
                # Unless the cgroup was removed (so nothing of the sandbox
                # is left), the next holder scans /proc before reusing it.
                self.uid_lease.close(clean=emptied)
            if self.placeholders is not None:
                self.placeholders.release()


class NamespaceBackend:
    """The `namespace` backend behind the `Backend` Protocol (`sandbox/backend.py`)."""

    kind = "namespace"

    def __init__(self, config: NamespaceConfig) -> None:
        self.config = config

    def check(self, spec: SandboxSpec) -> dict[str, str | None]:
        return NamespaceSandbox(spec).check()

    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[SandboxNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> RunningSandbox:
        nets: list[NetNs] = []
        hook: Callable[[int], None] | None = None
        if network is not None:
            from corral.sandbox.netns import NetNs

            def hook(pid: int) -> None:
                # bwrap's child-pid: its namespaces exist, the command has not run yet.
                net = NetNs(pid)
                nets.append(net)
                # Handed out only once usable: the child may not have brought `lo` up yet.
                net.await_loopback(pid)
                network(net)

        try:
            running = NamespaceSandbox(
                spec,
                cgroup_parent=parent_cgroup or "corral",
                network_hook=hook,
                init_kind=self.config.init_kind,
                stdio=stdio,
                unix_observer=unix_observer,
            ).start()
        except BaseException:
            for net in nets:
                net.close()
            raise
        running.nets += nets
        return running

    def preview(self, spec: SandboxSpec) -> list[str]:
        return preview_argv(spec)


def init_command(
    spec: SandboxSpec,
    *,
    binary: str | None,
    abi: int,
    status_fd: int,
    hold_fd: int | None = None,
    seccomp_log_fd: int | None = None,
) -> tuple[tuple[str, ...], list[tuple[str, bytes]], tuple[tuple[str, str], ...]]:
    """How bwrap starts the init: (argv, files to place, read-only binds).

    `abi` 0 means no Landlock. The compiled init gets the ruleset decided here
    by `landlock.plan` as numbers; the Python init gets the rules as JSON and
    its landlock module. With `hold_fd` the init waits, after the command
    exits, until the host closes that pipe (see RunningSandbox.wait). With
    `seccomp_log_fd` (compiled init only) the init loads that seccomp program
    again with SECCOMP_FILTER_FLAG_LOG so that its denials are audited.
    """
    hold = ("--hold", str(hold_fd)) if hold_fd is not None else ()
    if binary is not None:
        args: list[str] = [*hold]
        if seccomp_log_fd is not None:
            args += ["--seccomp-log", str(seccomp_log_fd)]
        if abi:
            from corral.sandbox import landlock

            p = landlock.plan(landlock.LandlockRules.from_dict(landlock_rules_for(spec)), abi)
            args += [
                "--ll",
                str(p.abi),
                str(p.handled_fs),
                str(p.handled_net),
                str(p.scoped),
                str(p.restrict_flags),
            ]
            for path, mask in p.paths:
                args += ["--path", str(mask), path]
            for port, access in p.ports:
                args += ["--port", str(access), str(port)]
        dest = f"{bw.INIT_DIR}/init"
        return (dest, str(status_fd), *args, "--", *spec.argv), [], ((binary, dest),)
    files = [(f"{bw.INIT_DIR}/init.py", _read_bytes(payload_path("init.py")))]
    rules = "-"
    if abi:
        files.append(
            (f"{bw.INIT_DIR}/landlock.py", _read_bytes(os.path.join(_SRC_DIR, "landlock.py")))
        )
        rules = json.dumps(landlock_rules_for(spec))
    argv = (
        INIT_PYTHON,
        "-I",
        "-S",
        f"{bw.INIT_DIR}/init.py",
        str(status_fd),
        rules,
        *hold,
        "--",
        *spec.argv,
    )
    return argv, files, ()


def _binds(spec: SandboxSpec) -> list[tuple[str, bool]]:
    """(host path, writable) of every tree the sandbox sees, the workspace first."""
    return [(spec.workspace, True), *((b.path, b.writable) for b in spec.binds)]


def _staged(binds: list[tuple[str, bool]], *, root: bool) -> tuple[bw.StagedBind, ...]:
    # As root every tree is first staged as an idmapped clone (`mounts`), and
    # bwrap binds the clone; otherwise it binds the host path itself.
    return tuple(
        bw.StagedBind(mounts.staged_path(i) if root else p, p, w) for i, (p, w) in enumerate(binds)
    )


def _data_files(spec: SandboxSpec, init_files: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The files bwrap places from descriptors: (destination, content)."""
    return [
        ("/etc/passwd", _passwd(spec.home)),
        ("/etc/group", _group()),
        ("/etc/hosts", _hosts(spec.hostname)),
        *(
            [(SYSTEM_SSH_CONFIG, spec.network.ssh_config.encode())]
            if spec.network.ssh_config is not None
            else []
        ),
        *init_files,
    ]


def _bwrap_data(
    spec: SandboxSpec, init_files: list[tuple[str, bytes]], *, staged_etc: bool
) -> list[tuple[str, bytes]]:
    """The data files bwrap places (`_data_files`, less those a staged /etc holds)."""
    files = _data_files(spec, init_files)
    return [f for f in files if not f[0].startswith("/etc/")] if staged_etc else files


def _stage_for(
    spec: SandboxSpec,
    init_files: list[tuple[str, bytes]],
    staged: tuple[bw.StagedBind, ...],
    protect_binds: tuple[bw.StagedBind, ...],
    *,
    root: bool,
) -> tuple[stage.EtcStage | None, tuple[stage.SelfBind, ...], tuple[bw.StagedBind, ...]]:
    """(staged /etc, self-binds in the staged trees, the protection binds bwrap still makes).

    Only when root: the unprivileged path has no private mount namespace
    before bwrap, so bwrap makes every bind itself.
    """
    if not root:
        return None, (), protect_binds
    dests = tuple((b.path, os.path.isdir(b.path)) for b in spec.binds)
    etc, _ = stage.plan_etc(_etc_entries(), _etc_links(), _data_files(spec, init_files), dests)
    selfs, rest = stage.split_protect(protect_binds, tuple(b.source for b in staged))
    return etc, selfs, rest


def bwrap_plan(
    spec: SandboxSpec,
    *,
    bwrap: str,
    staged: tuple[bw.StagedBind, ...],
    init: tuple[tuple[str, ...], list[tuple[str, bytes]], tuple[tuple[str, str], ...]],
    data_fds: list[int],
    seccomp_fd: int | None,
    json_status_fd: int,
    info_fd: int | None = None,
    block_fd: int | None = None,
    protect_binds: tuple[bw.StagedBind, ...] = (),
    etc_stage: stage.EtcStage | None = None,
    own_net: bool = False,
) -> bw.BwrapPlan:
    """The one place the bwrap plan is built, for `start()` and for `--dry-run`.

    `init` is `init_command`'s result; `data_fds` hold `_bwrap_data` in order.
    With `etc_stage` (`_stage_for`) /etc is one bind of the staged directory.
    With `own_net` the child is already in the sandbox's network namespace
    (`mounts.make_net_ns`) and bwrap keeps it.
    """
    init_argv, init_files, init_binds = init
    staged_etc = etc_stage is not None
    dests = [d for d, _ in _bwrap_data(spec, init_files, staged_etc=staged_etc)]
    if len(dests) != len(data_fds):
        raise SandboxStartError(0, f"{len(dests)} data files but {len(data_fds)} descriptors")
    etc_links = () if staged_etc else _etc_links()
    linked = {e for e, _ in etc_links}
    return bw.BwrapPlan(
        bwrap=bwrap,
        spec=spec,
        system_links=_system_links(),
        etc_entries=() if staged_etc else tuple(e for e in _etc_entries() if e not in linked),
        etc_links=etc_links,
        etc_stage=stage.ETC_STAGE if staged_etc else None,
        # Staged with /etc: only the root child has a namespace to build it in.
        dev_stage=stage.DEV_STAGE if staged_etc else None,
        binds=staged,
        data_files=tuple(zip(dests, data_fds, strict=True)),
        init_argv=init_argv,
        ro_binds=(
            (*init_binds, (spec.network.trust_bundle, SYSTEM_TRUST_BUNDLE))
            if spec.network.trust_bundle is not None
            else init_binds
        ),
        sandbox_uid=INSIDE_UID,
        sandbox_gid=INSIDE_UID,
        seccomp_fd=seccomp_fd,
        info_fd=info_fd,
        block_fd=block_fd,
        json_status_fd=json_status_fd,
        protect_binds=protect_binds,
        unshare_net=not own_net,
    )


def _preview(
    spec: SandboxSpec, root: bool | None
) -> tuple[bw.BwrapPlan, stage.EtcStage | None, tuple[stage.SelfBind, ...]]:
    from corral.sandbox import landlock
    from corral.sandbox.initbin import init_binary
    from corral.sandbox.protect import preview_protection

    root = os.geteuid() == 0 if root is None else root
    staged = _staged(_binds(spec), root=root)
    init = init_command(
        spec, binary=init_binary(cache_dir()), abi=landlock.abi_version(), status_fd=3, hold_fd=4
    )
    protect = preview_protection(spec, staged) if spec.protect else ()
    etc, selfs, protect = _stage_for(spec, init[1], staged, protect, root=root)
    n_data = len(_bwrap_data(spec, init[1], staged_etc=etc is not None))
    plan = bwrap_plan(
        spec,
        bwrap=_which("bwrap") or "bwrap",
        staged=staged,
        init=init,
        data_fds=[10 + i for i in range(n_data)],
        seccomp_fd=15,
        json_status_fd=5,
        protect_binds=protect,
        etc_stage=etc,
        own_net=root,
    )
    return plan, etc, selfs


def preview_argv(spec: SandboxSpec, *, root: bool | None = None) -> list[str]:
    """The bwrap argv `start()` would use, with placeholder descriptor numbers."""
    return bw.build_argv(_preview(spec, root)[0])


def preview_stage(spec: SandboxSpec, *, root: bool | None = None) -> list[tuple[str, str, str]]:
    """(what, source, destination) of the mounts `start()` stages before bwrap
    (`sandbox.stage`); empty when not root."""
    _, etc, selfs = _preview(spec, root)
    return stage.describe(etc, selfs, dev=etc is not None, net=etc is not None)
