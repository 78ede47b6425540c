"""Start a SandboxSpec under runsc, inside a cgroup that holds all of gVisor.

Start-up, in order (each step fails closed):

1. `check()`: runsc answers `--version`, a platform is usable (systrap,
   kvm with hardware virtualisation, else ptrace), a writable cgroup
   hierarchy exists; requests this backend cannot honour (a broker, host
   unix socket grants) raise LayerUnavailableError;
2. a private directory holds the bundle (config.json, an empty read-only
   rootfs with mount points, the synthetic passwd/group/hosts) and runsc's
   state; the sandbox's cgroup gets the spec's limits;
3. fork; in the child: join the cgroup (so runsc, the sentry, the gofer and
   every stub process are charged), as root stage idmapped clones of the
   workspace and binds in a private mount namespace (files the command
   creates belong to the caller), set PDEATHSIG, exec
   `unshare --pid --fork --kill-child runsc ... run`.

Teardown guarantee: runsc is pid 1 of a PID namespace that corral's child
`unshare` holds with --kill-child; if corral is SIGKILLed, PDEATHSIG kills
`unshare`, which kills runsc, and the kernel then kills every process of
that namespace (sentry, gofer, stubs and the nested namespaces below).
The cgroup and state directory are swept by the next start.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from corral.errors import CgroupError, LayerUnavailableError, SandboxStartError
from corral.sandbox import interrupts, mounts
from corral.sandbox.backend import GVisorConfig, SandboxNet
from corral.sandbox.bwrap import StagedBind
from corral.sandbox.cgroup import Cgroup, CgroupLayout, detect_layout, sweep_stale
from corral.sandbox.gvisor import bundle as bd
from corral.sandbox.gvisor import hostuid
from corral.sandbox.gvisor.nproc import SentryRefusals
from corral.sandbox.gvisor.ps import Located, runsc_argv, sandbox_pid1
from corral.sandbox.gvisor.stdio import StdioRelay
from corral.sandbox.gvisor.version import release_date
from corral.sandbox.handle import CgroupProcessHandle
from corral.sandbox.namespace import (
    INSIDE_UID,
    ExecResult,
    _etc_entries,
    _group,
    _hosts,
    _passwd,
    _system_links,
    _which,
    cache_dir,
    set_pdeathsig,
)
from corral.sandbox.noreserve import drop_reserve_access
from corral.sandbox.spec import Limits, SandboxSpec

if TYPE_CHECKING:
    from corral.sandbox.spec import ExitReason
    from corral.sandbox.uids import UidLease
    from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = [
    "RUNSC_TASKS",
    "STATE_ROOT",
    "TASKS_PER_PROCESS",
    "GVisorBackend",
    "GVisorSandbox",
    "cgroup_limits",
    "decide_exit",
    "exec_failure",
]

#: Bundles and runsc state, one directory per sandbox, named like its cgroup.
STATE_ROOT = "/run/corral-gvisor"
_libc = ctypes.CDLL(None, use_errno=True)
_NOBODY = 65534
#: Host tasks of runsc, sentry and gofer beyond the command's own (see cgroup_limits):
#: an idle sandbox on the ptrace platform holds ~240.
RUNSC_TASKS = 320
#: Host tasks per process of the command (its stub and the sentry threads that serve
#: it): ~7 measured on the ptrace platform.
TASKS_PER_PROCESS = 8
_OWNER_RE = re.compile(r"^[a-z]+-(\d+)-[0-9a-f]+$")


def decide_exit(
    *, rc: int | None, oom_kills: int, timed_out: bool, interrupted: int
) -> tuple[int, ExitReason]:
    """(exit status, reason) of a finished sandbox (pure).

    `rc` is the status of `runsc exec` (through nsenter), which is the status the
    sentry reported for the command (outside the sandbox's reach unless it
    escapes gVisor). A negative `rc` is a signal to that host process.
    """
    if timed_out:
        return 124, "timeout"
    if interrupted:
        return 128 + interrupted, "killed"
    # 128: `runsc exec` lost the sentry it waited on (the OOM killer's pick).
    if oom_kills > 0 and (rc is None or rc < 0 or rc >= 128):
        return 137, "oom"
    if rc is None:
        return 125, "refused"
    if rc < 0:
        return 128 - rc, "killed"
    if rc > 128:
        return rc, "killed"
    return rc, "exited"


#: runsc's log is read up to this many bytes from its end.
_LOG_TAIL = 16384


def exec_failure(log: bytes) -> int | None:
    """126/127 when runsc's own log says the command could not be executed, else None (pure).

    runsc exits 128 both when the command exits 128 and when it could not
    start the command; only its log (written by runsc on the host, out of the
    command's reach) tells them apart. 127 like sh for a command not found,
    126 for one found but not executable.
    """
    for line in reversed(log.splitlines()):
        text = line.decode("utf-8", "replace")
        if "starting sandbox:" not in text and "executing processes for container:" not in text:
            continue
        if "error finding executable" in text or "failed to load" in text:
            if "no such file or directory" in text:
                return 127
            return 126
    return None


def _runsc_log(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - _LOG_TAIL))
            return fh.read(_LOG_TAIL)
    except OSError:
        return b""


def cgroup_limits(limits: Limits) -> Limits:
    """The cgroup's limits: the spec's, plus room for gVisor's own tasks (pure).

    The pids controller counts host tasks; the sentry, the gofer and runsc
    are Go programs with hundreds of threads between them, and each process
    of the command costs a platform stub plus sentry threads, all charged to
    the same cgroup. So the command's pids limit becomes a host-task budget:
    a fork bomb is still stopped near the limit, a build that stays under it
    is not.
    """
    if limits.pids is None:
        return limits
    return replace(limits, pids=RUNSC_TASKS + limits.pids * TASKS_PER_PROCESS)


def _hardware_virt() -> bool:
    try:
        with open("/proc/cpuinfo", "rb") as fh:
            flags = fh.read()
    except OSError:
        return False
    # A paravirtual /dev/kvm (PVM) exists without vmx/svm and hangs runsc's kvm platform.
    return os.path.exists("/dev/kvm") and (b" vmx" in flags or b" svm" in flags)


def _owner_alive(name: str) -> bool:
    m = _OWNER_RE.match(name)
    if m is None:
        return True  # not ours to judge
    pid = int(m.group(1))
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_state(root: str = STATE_ROOT) -> list[str]:
    """Remove bundle/state directories whose owning corral process is gone."""
    removed: list[str] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not _owner_alive(name):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                removed.append(name)
    return removed


class GVisorBackend:
    """runsc (gVisor): a user-space kernel between the command and the host."""

    kind = "gvisor"

    def __init__(self, config: GVisorConfig, *, cgroup_layout: CgroupLayout | None = None) -> None:
        self.config = config
        self._layout = cgroup_layout
        self.is_root = os.geteuid() == 0

    # -- checks -------------------------------------------------------------
    def _runsc(self) -> tuple[str | None, str | None, int]:
        """(path, why not, version date)."""
        path = self.config.runsc or _which("runsc")
        if path is None:
            return None, "runsc not found on PATH (apt-get install runsc)", 0
        date, why = release_date(path, cache_dir())
        if date is None:
            return None, why, 0
        return path, None, date

    def _cgroup_reason(self, layout: CgroupLayout | None) -> str | None:
        if layout is None:
            return "no cgroup filesystem mounted"
        roots = [m for _, m in layout.v1] or ([layout.unified] if layout.unified else [])
        bad = [r for r in roots if not os.access(r, os.W_OK)]
        return f"cgroup hierarchy {bad[0]} is not writable" if bad else None

    def check(self, spec: SandboxSpec) -> Mapping[str, str | None]:
        out: dict[str, str | None] = {}
        path, why, date = self._runsc()
        out["runsc"] = why or (None if _which("nsenter") else "needs nsenter (runsc exec)")
        platform, pwhy = bd.choose_platform(
            self.config.platform, version_date=date, hardware_virt=_hardware_virt()
        )
        out["platform"] = None if platform is not None or path is None else pwhy
        layout = self._layout if self._layout is not None else detect_layout()
        out["cgroup"] = self._cgroup_reason(layout)
        out["idmap"] = None if self.is_root else "not root: the workspace is used as is (rootless)"
        out["egress"] = (
            None if shutil.which("nsenter") and shutil.which("ip") else "needs nsenter and ip"
        )
        out["unix"] = (
            "gVisor reaches no host unix socket (no --host-uds); --allow-unix cannot be honoured"
            if spec.allow_unix
            else None
        )
        return out

    def _platform(self) -> tuple[str, str, int]:
        path, why, date = self._runsc()
        if path is None:
            raise LayerUnavailableError(
                "gvisor", why or "runsc unavailable", "apt-get install runsc"
            )
        platform, pwhy = bd.choose_platform(
            self.config.platform, version_date=date, hardware_virt=_hardware_virt()
        )
        if platform is None:
            raise LayerUnavailableError("gvisor", pwhy)
        return path, platform, date

    @staticmethod
    def _abort(proc: subprocess.Popen[bytes], cgroup: Cgroup | None, relay: StdioRelay) -> None:
        if cgroup is not None:
            with contextlib.suppress(CgroupError):
                cgroup.kill()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        relay.close(1.0)

    # -- preview ------------------------------------------------------------
    def _plan(self, spec: SandboxSpec, files_dir: str, staged: list[StagedBind]) -> bd.BundlePlan:
        protect: tuple[StagedBind, ...] = ()
        if spec.protect:
            from corral.sandbox.protect import preview_protection

            protect = preview_protection(spec, staged)
        if self.is_root:
            protect = ()  # bound on the host, under the staged binds (see start)
        return bd.BundlePlan(
            spec=spec,
            system_links=_system_links(),
            etc_entries=_etc_entries(),
            binds=tuple(staged),
            files_dir=files_dir,
            protect_binds=protect,
            uid=INSIDE_UID,
            gid=INSIDE_UID,
            etc_dir=os.path.join(os.path.dirname(files_dir), "etc") if self.is_root else None,
        )

    def _staged(self, spec: SandboxSpec) -> list[StagedBind]:
        binds = [(spec.workspace, True), *((b.path, b.writable) for b in spec.binds)]
        if self.is_root:
            return [StagedBind(mounts.staged_path(i), p, w) for i, (p, w) in enumerate(binds)]
        return [StagedBind(p, p, w) for p, w in binds]

    def preview(self, spec: SandboxSpec) -> list[str]:
        """The runsc command line; the bundle's config.json follows as a comment line."""
        path = self.config.runsc or _which("runsc") or "runsc"
        base = f"{STATE_ROOT}/{spec.env_kind}-PID-ID"
        argv = bd.runsc_argv(
            runsc=path,
            platform=self.config.platform or "ptrace",
            state_dir=f"{base}/state",
            bundle_dir=f"{base}/bundle",
            container_id=f"{spec.env_kind}-PID-ID",
            rootless=not self.is_root,
        )
        return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]

    def preview_config(self, spec: SandboxSpec) -> dict[str, object]:
        """The config.json `start` would write (for `--dry-run`)."""
        base = f"{STATE_ROOT}/{spec.env_kind}-PID-ID"
        return bd.build_config(self._plan(spec, f"{base}/bundle/files", self._staged(spec)))

    # -- start --------------------------------------------------------------
    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[SandboxNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> GVisorSandbox:
        """Start `spec` under runsc; `stdio`: the command's stdin, stdout, stderr.

        runsc gets pipes, never these descriptors (see `gvisor.stdio`).
        `unix_observer` is never called: runsc runs without `--host-uds`, so no
        connect() inside reaches a host unix socket at all.
        """
        if not os.path.isdir(spec.workspace):
            raise SandboxStartError(2, f"workspace {spec.workspace} is not a directory")
        if spec.network.needs_broker and network is None:
            raise LayerUnavailableError("egress", "the spec needs a broker and none was attached")
        with_net = network is not None
        # Nothing to attach before the command runs: the container's own
        # process runs it (bundle.supervisor), no `runsc exec`. As root only:
        # the report directory's owner must be the sandbox's root. Without a
        # C compiler, the holder and `runsc exec` do the same.
        sup_bin: str | None = None
        if not with_net and self.is_root:
            from corral.sandbox.initbin import gvsup_binary

            sup_bin = gvsup_binary(cache_dir())
        supervised = sup_bin is not None
        if with_net:
            from corral.sandbox.gvisor import net as gnet
            from corral.sandbox.spec import SANDBOX_PROXY_PORT

            spec = replace(spec, env=gnet.rewrite_proxy_env(spec.env, SANDBOX_PROXY_PORT))
        if spec.allow_unix:
            raise LayerUnavailableError(
                "unix", "gVisor reaches no host unix socket; --allow-unix cannot be honoured"
            )
        if not with_net and self.is_root:
            from corral.sandbox.gvisor import preboot

            key = preboot.boot_key(spec, self.config, parent_cgroup or "corral")
            if key is not None:
                # The next warm worker boots for this request's kind (gvisor.preboot).
                preboot.remember(key)
                pre = preboot.take(key)
                if pre is not None:
                    return pre.serve(spec, stdio)
        runsc, platform, _ = self._platform()
        layers: dict[str, object] = {"gvisor": platform}
        layout = self._layout if self._layout is not None else detect_layout()
        cg_reason = self._cgroup_reason(layout)
        if cg_reason is not None:
            if "cgroup" not in spec.allow_degraded:
                raise LayerUnavailableError(
                    "cgroup", cg_reason, "run as root or delegate a cgroup subtree", degradable=True
                )
            layers["cgroup"] = f"degraded: {cg_reason}"
            layout = None
        else:
            assert layout is not None
            layers["cgroup"] = layout.kind
        parent = parent_cgroup or "corral"
        name = f"{spec.env_kind}-{os.getpid()}-{os.urandom(4).hex()}"
        base = os.path.join(STATE_ROOT, name)
        started = time.monotonic()
        cgroup: Cgroup | None = None
        placeholders = None
        refusals: SentryRefusals | None = None
        lease: UidLease | None = None
        fds: list[int] = []
        try:
            os.makedirs(STATE_ROOT, mode=0o700, exist_ok=True)
            sweep_state()
            if layout is not None:
                with contextlib.suppress(CgroupError, OSError):
                    sweep_stale(layout, parent)
            staged = self._staged(spec)
            protect: tuple[StagedBind, ...] = ()
            if spec.protect:
                from corral.sandbox.protect import start_protection

                protect, placeholders = start_protection(spec, staged, cache_dir())
                layers["protect"] = placeholders.summary
            files = os.path.join(base, "bundle", "files")
            plan = bd.BundlePlan(
                spec=spec,
                system_links=_system_links(),
                etc_entries=_etc_entries(),
                binds=tuple(staged),
                files_dir=files,
                # As root they are read-only binds in the staged trees
                # (child_setup), carried by each staged bind's one rbind: one
                # gofer mount per staged tree, not one per placeholder.
                protect_binds=() if self.is_root else protect,
                uid=INSIDE_UID,
                gid=INSIDE_UID,
                # runsc's own: the one its prelude left it in (gvisor.net).
                netns_path="/proc/self/ns/net" if with_net else None,
                # As root, /etc is built once and bound whole (gvisor.etcdir).
                etc_dir=os.path.join(base, "bundle", "etc") if self.is_root else None,
                report_dir=os.path.join(base, "report") if supervised else None,
            )
            _write_bundle(base, plan, sup_bin)
            etc_binds: list[tuple[str, str]] = []
            if plan.etc_dir is not None:
                from corral.sandbox.gvisor import etcdir

                os.mkdir(plan.etc_dir, 0o755)
                etc_binds = etcdir.prepare(plan.etc_dir, plan.etc_entries, _synthetic(spec))
            attach_fds: list[int] = []
            if layout is not None:
                cgroup = Cgroup.create(layout, f"{parent}/{name}", cgroup_limits(spec.limits))
                attach_fds = cgroup.open_attach_fds()
                fds += attach_fds
            if self.is_root:
                # The gofer creates a file as root, then chowns it to the
                # command's uid: its root needs an on-disk id too (nobody),
                # which the chown then turns into the caller's.
                userns_fd = mounts.make_userns_fd(
                    os.getuid(), os.getgid(), INSIDE_UID, INSIDE_UID, extra=((_NOBODY, 0),)
                )
                fds.append(userns_fd)
                layers["idmap"] = True
                # The sentry's host uid: this sandbox's own (gvisor.hostuid).
                from corral.sandbox import uids

                lease = uids.allocate(uids.configured_range())
                id_map = hostuid.id_map(lease.uid, INSIDE_UID)
                runsc_ns = mounts.userns_fd(id_map, id_map, deny_setgroups=False)
                fds.append(runsc_ns)
            else:
                userns_fd = runsc_ns = -1
            argv = [
                _which("unshare") or "/usr/bin/unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
            ]
            if spec.limits.pids is not None:
                refusals = SentryRefusals()
            block_r = block_w = -1
            if with_net:
                block_r, block_w = os.pipe()
                fds.append(block_r)
                argv += gnet.runsc_prelude(3)
            argv += [
                *bd.runsc_argv(
                    runsc=runsc,
                    platform=platform,
                    state_dir=os.path.join(base, "state"),
                    bundle_dir=os.path.join(base, "bundle"),
                    # runsc names its control socket (abstract, host-wide)
                    # after the container: one id per sandbox.
                    container_id=name,
                    rootless=not self.is_root,
                    network="sandbox" if with_net else "none",
                    log_file=os.path.join(base, "runsc.log"),
                    extra_flags=tuple(refusals.argv_flags()) if refusals else (),
                ),
            ]
            binds = [(spec.workspace, True), *((b.path, b.writable) for b in spec.binds)]
            # Shallow first: a placeholder below another one lands on top of it.
            host_protect = sorted(protect, key=bd.depth_key) if self.is_root else []
            is_root = self.is_root
            me = os.getpid()
            err_r, err_w = os.pipe()
            fds.append(err_w)

            def child_setup() -> None:
                try:
                    for fd in attach_fds:
                        os.write(fd, b"0")
                    # The gofer writes the workspace: no reserve of a run's disk.
                    drop_reserve_access()
                    if is_root:
                        mounts.make_private_mount_ns()
                        for i, (path, writable) in enumerate(binds):
                            mounts.stage_bind(i, path, writable, userns_fd)
                        for b in host_protect:
                            mounts.bind_readonly(b.source, b.source)
                        for src, dst in etc_binds:
                            mounts.bind_readonly(src, dst)
                    set_pdeathsig(signal.SIGKILL)
                    if os.getppid() != me:
                        os._exit(125)
                    if runsc_ns >= 0:
                        # Before the network namespace: runsc configures it,
                        # so this namespace must own it.
                        hostuid.enter(runsc_ns)
                    if with_net:
                        unshare_net()
                        # dash reads only single-digit descriptors: the
                        # prelude's is 3 (kept open by pass_fds).
                        os.dup2(block_r, 3)
                except BaseException as exc:
                    with contextlib.suppress(OSError):
                        os.write(err_w, str(exc).encode()[:4000])
                    raise

            relay = StdioRelay(stdio or (None, None, None))
            ready_r, ready_w = os.pipe()
            fds += [ready_r, ready_w]
            # The holder's stdio are pipes, never a host file: runsc re-owns
            # the container's stdio descriptors, and a host /dev/null handed
            # to it came back owned by nobody and re-moded from inside.
            # The write end asks the holder for the leftover count (bundle.holder).
            hold_in, hold_in_w = os.pipe()
            fds += [hold_in, hold_in_w]
            proc: subprocess.Popen[bytes] | None = None
            try:
                # Popen's fork must not be orphaned by an interrupt (sandbox.interrupts).
                with interrupts.deferred():
                    try:
                        # preexec_fn: raw syscalls only (see NamespaceSandbox.start).
                        # runsc's own errors go to its --log; the holder's stdout
                        # says when the sandbox runs.
                        child_stdio = (
                            relay.child_fds() if supervised else (hold_in, ready_w, ready_w)
                        )
                        proc = subprocess.Popen(
                            argv,
                            stdin=child_stdio[0],
                            stdout=child_stdio[1],
                            stderr=child_stdio[2],
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                            preexec_fn=child_setup,  # noqa: PLW1509
                            close_fds=True,
                            pass_fds=[
                                *([3] if with_net else []),
                                *([refusals.write_fd] if refusals else []),
                            ],
                            cwd="/",
                        )
                    except (OSError, subprocess.SubprocessError) as exc:
                        os.close(err_w)
                        fds.remove(err_w)
                        detail = os.read(err_r, 4096).decode(errors="replace").strip()
                        os.close(err_r)
                        relay.close(0)
                        raise SandboxStartError(0, f"cannot start runsc: {detail or exc}") from exc
            except BaseException:
                if proc is not None:
                    self._abort(proc, cgroup, relay)
                raise
            assert proc is not None
            os.close(err_r)
            if refusals is not None:
                refusals.started()
            os.close(ready_w)
            fds.remove(ready_w)
            link: gnet.BrokerLink | None = None
            if with_net:
                assert network is not None
                try:
                    from corral.sandbox.gvisor.connect import ExecTarget

                    target = ExecTarget(
                        runsc=runsc,
                        state_dir=os.path.join(base, "state"),
                        container_id=name,
                        uid=INSIDE_UID,
                        gid=INSIDE_UID,
                        cgroup_procs=cgroup.procs_files() if cgroup is not None else (),
                    )
                    link = gnet.BrokerLink(proc.pid, target)
                    network(link)
                    os.write(block_w, b"1\n")
                    layers["egress"] = f"broker at {gnet.BROKER_IP} on a veth link"
                except BaseException:
                    self._abort(proc, cgroup, relay)
                    raise
                finally:
                    if link is not None:
                        link.close()
                    os.close(block_w)
            located = Located(runsc, os.path.join(base, "state"), name, proc.pid)
            command = proc
            try:
                if not supervised:
                    _await_holder(ready_r, proc, os.path.join(base, "runsc.log"))
                    if link is not None:
                        for relay_sock in link.start_relays():
                            relay_sock.close()
                    command = _exec_command(
                        located, bd.command_process(plan), base, attach_fds, relay
                    )
            except BaseException:
                self._abort(proc, cgroup, relay)
                raise
            relay.started()
            sandbox = GVisorSandbox(
                proc=command,
                holder=None if supervised else proc,
                located=located,
                counter=None if supervised else (hold_in_w, ready_r),
                report=plan.report_dir,
                cgroup=cgroup,
                layers=layers,
                started=started,
                base=base,
                runsc=runsc,
                placeholders=placeholders,
                relay=relay,
                refusals=refusals,
                lease=lease,
            )
            if not supervised:
                fds.remove(hold_in_w)
                fds.remove(ready_r)
            cgroup = None
            placeholders = None
            refusals = None
            lease = None
            return sandbox
        except BaseException:
            if cgroup is not None:
                with contextlib.suppress(CgroupError):
                    cgroup.remove()
            if refusals is not None:
                refusals.close()
            if lease is not None:
                lease.close()
            if placeholders is not None:
                placeholders.release()
            shutil.rmtree(base, ignore_errors=True)
            raise
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


#: How long the holder may take to start; it only bounds a hang (runsc stuck).
_HOLDER_START_S = 120.0


def _await_holder(ready_r: int, proc: subprocess.Popen[bytes], log: str) -> None:
    """Block until the container's holder says it runs (bundle.HOLDER); raise if runsc
    ends or hangs first."""
    got = b""
    deadline = time.monotonic() + _HOLDER_START_S
    while len(got) < len(bd.HOLDER_READY):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([ready_r], [], [], left)[0]:
            raise SandboxStartError(0, "runsc did not start the sandbox in time")
        chunk = os.read(ready_r, len(bd.HOLDER_READY) - len(got))
        if not chunk:
            break
        got += chunk
    if got != bd.HOLDER_READY:
        proc.wait()
        tail = _runsc_log(log).strip().splitlines()[-1:]
        detail = tail[0].decode("utf-8", "replace")[-300:] if tail else f"exit {proc.returncode}"
        raise SandboxStartError(0, f"cannot start runsc: {detail}")


#: How long the holder may take to count what the command left.
_COUNT_S = 10.0


def ask_count(request_w: int, answer_r: int, timeout_s: float) -> int | None:
    """Ask the holder for the leftover count; None when it does not answer in time.

    The answer is read from a pipe only runsc's host process and the holder
    (another uid than the command's) hold, and only "left N\\n" is accepted.
    """
    try:
        os.write(request_w, bd.COUNT_REQUEST)
    except OSError:
        return None
    got = b""
    deadline = time.monotonic() + timeout_s
    while not got.endswith(b"\n") and len(got) < bd.MAX_LEFT:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([answer_r], [], [], left)[0]:
            return None
        chunk = os.read(answer_r, bd.MAX_LEFT - len(got))
        if not chunk:
            return None
        got += chunk
    return bd.parse_left(got)


def _read_report(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(bd.MAX_REPORT + 1)
    except OSError:
        return b""


def exec_argv(target: Located, pid1: int, process_json: str, log_file: str) -> list[str]:
    """`runsc exec` of the command beside the holder, in runsc's namespaces (pure)."""
    return runsc_argv(
        target.runsc,
        target.state_dir,
        pid1,
        f"--log={log_file}",
        "exec",
        "--process",
        process_json,
        target.container_id,
        nsenter=_which("nsenter") or "/usr/bin/nsenter",
    )


def _exec_command(
    target: Located,
    process: dict[str, object],
    base: str,
    attach_fds: list[int],
    relay: StdioRelay,
) -> subprocess.Popen[bytes]:
    """Start the command with `runsc exec`; its host process joins the sandbox's cgroup."""
    pid1 = sandbox_pid1(target.holder)
    if pid1 is None:
        raise SandboxStartError(0, "the gVisor sandbox ended before the command started")
    path = os.path.join(base, "bundle", "process.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(process, fh)
    me = os.getpid()

    def child_setup() -> None:
        for fd in attach_fds:
            os.write(fd, b"0")
        drop_reserve_access()
        set_pdeathsig(signal.SIGKILL)
        if os.getppid() != me:
            os._exit(125)

    child_stdio = relay.child_fds()
    try:
        return subprocess.Popen(
            exec_argv(target, pid1, path, os.path.join(base, "exec.log")),
            stdin=child_stdio[0],
            stdout=child_stdio[1],
            stderr=child_stdio[2],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            preexec_fn=child_setup,  # noqa: PLW1509
            close_fds=True,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxStartError(0, f"cannot start the command with runsc exec: {exc}") from exc


def unshare_net() -> None:
    """unshare(CLONE_NEWNET), checked (runs in the child before exec)."""
    if _libc.unshare(0x40000000) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")


def _synthetic(spec: SandboxSpec) -> dict[str, bytes]:
    """The /etc files corral writes for the sandbox (bundle.SYNTHETIC_ETC)."""
    return {
        "passwd": _passwd(spec.home),
        "group": _group(),
        "hosts": _hosts(spec.hostname),
    }


def _write_bundle(base: str, plan: bd.BundlePlan, supervisor_bin: str | None = None) -> None:
    bundle = os.path.join(base, "bundle")
    rootfs = os.path.join(bundle, "rootfs")
    os.makedirs(os.path.join(base, "state"), mode=0o700)
    os.makedirs(rootfs, mode=0o755)
    os.makedirs(plan.files_dir, mode=0o755)
    if plan.report_dir is not None:
        # Only root opens it: the command's uid inside cannot (see bundle.supervisor).
        os.mkdir(plan.report_dir, 0o700)
        if supervisor_bin is None:
            raise SandboxStartError(0, "no gVisor supervisor binary")
        # A copy, never a hard link: the directory is mounted writable, and
        # the cached inode is every later sandbox's supervisor.
        dest = os.path.join(plan.report_dir, bd.SUPERVISOR_NAME)
        shutil.copyfile(supervisor_bin, dest)
        os.chmod(dest, 0o755)
    # The gofer opens these as root and the sentry reads them: world-readable,
    # owned by root, in a directory only root can write.
    for name, data in _synthetic(plan.spec).items():
        with open(os.path.join(plan.files_dir, name), "wb") as fh:
            fh.write(data)
    for name, target in bd.mount_points(plan):
        path = os.path.join(rootfs, name)
        if target is None:
            os.mkdir(path, 0o755)
        else:
            os.symlink(target, path)
    with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(bd.build_config(plan), fh)


class GVisorSandbox(CgroupProcessHandle):
    """A started runsc sandbox. Call close() last.

    Where the report's values come from: the exit status is runsc's, which
    the sentry (gVisor's kernel, outside the command's reach) reported;
    cpu, memory, OOM kills and pids-limit hits are the kernel's counters of
    the cgroup that holds runsc, the sentry and the gofer. `proc` is the
    command's `runsc exec` (its status is the command's, from the sentry);
    Without a network hook `proc` is `runsc run` itself, whose container
    process (bundle.supervisor) runs the command and writes its status and
    leftover count to `report`, a directory the command cannot open. Else
    `holder` is `runsc run`, whose container process (bundle.holder) keeps
    the sandbox alive after the command exits and, asked over `counter`
    (its stdin's write end, its stdout's read end), counts what the command
    left from the sentry's /proc before the host kills them.
    """

    def __init__(
        self,
        *,
        proc: subprocess.Popen[bytes],
        holder: subprocess.Popen[bytes] | None = None,
        located: Located | None = None,
        counter: tuple[int, int] | None = None,
        report: str | None = None,
        cgroup: Cgroup | None,
        layers: dict[str, object],
        started: float,
        base: str,
        runsc: str,
        placeholders: object | None = None,
        relay: StdioRelay | None = None,
        refusals: SentryRefusals | None = None,
        lease: UidLease | None = None,
    ) -> None:
        self.proc = proc
        self._refusals = refusals
        self._lease = lease
        self.holder = holder
        self._located = located
        self._counter = counter
        self._report = report
        self._status: int | None = None
        self._leftovers = 0
        self._relay = relay
        self.cgroup = cgroup
        self._layers = layers
        self._layers["leftovers"] = (
            "counted by the holder before teardown"
            if report is None
            else "counted by the supervisor when the command exited"
        )
        self.started = started
        self.base = base
        self.runsc = runsc
        self._placeholders = placeholders
        self._closed = False

    @property
    def layers(self) -> Mapping[str, object]:
        return MappingProxyType(self._layers)

    @property
    def pid(self) -> int:
        """The host pid of `unshare`, which holds runsc's PID namespace."""
        return self.holder.pid if self.holder is not None else self.proc.pid

    def kill_all(self) -> None:
        super().kill_all()
        if self.holder is not None:
            with contextlib.suppress(ProcessLookupError):
                self.holder.kill()

    def _count_leftovers(self) -> None:
        if self._report is not None:
            got = bd.parse_report(_read_report(os.path.join(self._report, "status")))
            if got is None:
                self._layers["leftovers"] = "the supervisor did not report; not counted"
                return
            self._status, self._leftovers = got
            return
        if self._counter is None:
            return
        n = ask_count(*self._counter, _COUNT_S)
        if n is None:
            self._layers["leftovers"] = "the holder did not answer; not counted"
        self._leftovers = n or 0

    def _freezer(self) -> str:
        if self.cgroup is None or "freezer" not in self.cgroup.dirs:
            raise CgroupError(errno.ENOTSUP, "freezer unavailable")
        return os.path.join(self.cgroup.dirs["freezer"], "freezer.state")

    def freeze(self) -> None:
        # The freezer stops the sentry and the gofer themselves: nothing of
        # the sandbox runs, whatever it does inside gVisor.
        with open(self._freezer(), "w", encoding="ascii") as fh:
            fh.write("FROZEN")

    def thaw(self) -> None:
        with open(self._freezer(), "w", encoding="ascii") as fh:
            fh.write("THAWED")

    def wait(self, timeout_s: float | None = None) -> ExecResult:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        timed_out = False
        if self.proc.poll() is None:
            pidfd = os.pidfd_open(self.proc.pid)
            try:
                while self.proc.poll() is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        timed_out = True
                        break
                    select.select([pidfd], [], [], left)
            finally:
                os.close(pidfd)
        if timed_out:
            self.kill_all()
            self.proc.wait()
        else:
            self._count_leftovers()
        return self._finish(timed_out=timed_out)

    def interrupt(self, signum: int) -> ExecResult:
        self.kill_all()
        self.proc.wait()
        return self._finish(timed_out=False, interrupted=signum)

    def _finish(self, *, timed_out: bool, interrupted: int = 0) -> ExecResult:
        self.kill_all()
        if self.holder is not None:
            self.holder.wait()
        if self.cgroup is not None:
            self.cgroup.wait_empty(10.0)
        if self._relay is not None:
            # Every writer of the output pipes is dead: this only drains.
            self._relay.close()
        usage = self.usage()
        oom = usage.oom_kills if usage else 0
        rc = self.proc.returncode
        message = ""
        if self._report is not None:
            # runsc's own status is the supervisor's; the command's is its
            # report. No report: killed from the host (a signal to unshare,
            # which the cgroup holds) or runsc could not start.
            rc = self._status
            if rc is None and self.proc.returncode is not None and self.proc.returncode < 0:
                rc = self.proc.returncode
            if rc is None and not timed_out and not interrupted and not oom:
                tail = _runsc_log(os.path.join(self.base, "runsc.log")).strip().splitlines()[-1:]
                message = "cannot start runsc: " + (
                    tail[0].decode("utf-8", "replace")[-300:] if tail else "no report"
                )
        elif rc == 128 and not timed_out and not interrupted:
            rc = exec_failure(_runsc_log(os.path.join(self.base, "exec.log"))) or rc
        code, reason = decide_exit(
            rc=rc, oom_kills=oom, timed_out=timed_out, interrupted=interrupted
        )
        # The cgroup's hits are gVisor's host tasks; the command's forks are
        # refused inside, by the sentry (gvisor.nproc). Every runsc process
        # is dead: the count only drains what the sentry wrote.
        hits = usage.pids_limit_hits if usage else 0
        if self._refusals is not None:
            hits += self._refusals.count()
        return ExecResult(
            exit=code,
            reason=reason,
            wall_s=time.monotonic() - self.started,
            cpu_s=usage.cpu_s if usage else 0.0,
            peak_memory_bytes=usage.peak_memory_bytes if usage else 0,
            processes_killed_at_end=self._leftovers,
            layers=dict(self._layers),
            oom_kills=oom,
            pids_limit_hits=hits,
            message=message,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        emptied = False
        try:
            if self.proc.poll() is None or (self.holder and self.holder.poll() is None):
                self.kill_all()
                self.proc.wait()
                if self.holder is not None:
                    self.holder.wait()
            if self.cgroup is not None:
                self.cgroup.remove()
                emptied = True
        finally:
            for fd in self._counter or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
            if self._relay is not None:
                self._relay.close(1.0)
            # Every runsc process is dead (the cgroup is empty): the state
            # directory is only files now.
            shutil.rmtree(self.base, ignore_errors=True)
            if self._refusals is not None:
                self._refusals.close()
            if self._lease is not None:
                # Unless the cgroup (every process of the uid) was removed,
                # the next holder scans /proc before reusing the id.
                self._lease.close(clean=emptied)
            release = getattr(self._placeholders, "release", None)
            if release is not None:
                release()
