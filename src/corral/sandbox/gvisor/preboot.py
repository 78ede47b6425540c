"""A gVisor sandbox booted before its request, by the launcher's warm worker (host code).

`runsc run`'s boot (sentry, gofer, platform, mounts) is most of what
`corral exec --backend gvisor -- true` waits for, and none of it depends on
the command. A warm worker (`exec/launcher.py`, through `sandbox.prewarm`)
boots the next sandbox from the last request's `BootKey` (its workspace path,
home, hostname, kind, whether a process limit is set, runsc and platform)
and parks it: a fresh sentry whose pid 1 is the static supervisor in
`--request` mode (`_payload/gvsup.c`), waiting on its stdin. When a request
arrives whose key is the same, `GVisorBackend.start` takes it (once: the slot
is emptied) and supplies what depends on the request:

- the limits, written into the sandbox's cgroup before anything of the
  request runs (the process limit goes in the request: the supervisor sets
  RLIMIT_NPROC in its child);
- the workspace: the bundle mounts a per-sandbox stage directory S at the
  workspace's parent, with one empty child of the workspace's name. S is a
  shared mount in a mount namespace of corral's own (`_stage_ns`), and
  runsc's namespaces (unshare's, runsc's, the gofer's) receive its mounts as
  slaves. On the request the host attaches the workspace's idmapped clone on
  S's child, then the protection placeholders read-only on top, in that
  namespace: the gofer sees them on its next lookup below S (its own
  descriptor is S, never the covered child), and the sentry revalidates
  what it looked up (bind mounts are shared-access). A mount over S itself
  would not be seen: the gofer walks from the descriptor it opened at boot;
- the command, its environment and cwd, over the container's stdin (a host
  pipe), before the caller's stdin is relayed behind it.

Isolation is as for a cold start: one sentry per request, used once, torn
down with its cgroup after; a key that does not match discards the parked
sandbox (and the hint, so an idle launcher stops booting for a workload that
went away). If the worker is SIGKILLed, PDEATHSIG kills `unshare`, whose
--kill-child ends runsc's PID namespace (sentry, gofer, stubs); the stage
namespace has no process left and goes; the cgroup and state directory are
swept by the next start (their name carries the dead worker's pid).

Only requests that mount nothing but the workspace, with no broker and no
trust bundle, whose workspace parent is not itself a mount of the bundle
(/, /tmp, /home, /run, the home directory, a system directory) are eligible
(`boot_key` returns None otherwise): everything else starts cold.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import posixpath
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from corral.errors import CgroupError, LayerUnavailableError, SandboxStartError
from corral.sandbox import interrupts, mounts
from corral.sandbox.bwrap import StagedBind
from corral.sandbox.gvisor import bundle as bd

if TYPE_CHECKING:
    from corral.sandbox.backend import GVisorConfig
    from corral.sandbox.cgroup import Cgroup
    from corral.sandbox.gvisor.backend import GVisorSandbox
    from corral.sandbox.gvisor.nproc import SentryRefusals
    from corral.sandbox.gvisor.stdio import StdioRelay
    from corral.sandbox.spec import SandboxSpec
    from corral.sandbox.uids import UidLease

__all__ = ["BootKey", "PreBooted", "boot_key", "discard", "prepare", "remember", "take"]

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_SHARED = 1 << 20
_NOBODY = 65534
#: How long a boot may take; it only bounds a hang (runsc stuck).
_BOOT_S = 60.0
#: Top-level directories that are the bundle's own mounts or the host's system dirs.
_SYSTEM_TOPS = frozenset(
    ("usr", "etc", "proc", "dev", "sys", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
)


@dataclass(frozen=True, slots=True)
class BootKey:
    """What a sandbox needs at boot, taken from the request before it (pure data)."""

    workspace: str
    home: str
    hostname: str
    env_kind: str
    nproc: bool
    runsc: str | None
    platform: str | None
    parent_cgroup: str


def boot_key(spec: SandboxSpec, config: GVisorConfig, parent_cgroup: str) -> BootKey | None:
    """The boot-time part of `spec`, or None when a pre-booted sandbox cannot serve it (pure)."""
    if spec.binds or spec.allow_unix or spec.network.needs_broker:
        return None
    if spec.network.trust_bundle is not None:
        return None
    ws = posixpath.normpath(spec.workspace)
    parent = posixpath.dirname(ws)
    if not ws.startswith("/") or parent == "/" or ws != spec.workspace.rstrip("/"):
        return None
    if parent.strip("/").split("/")[0] in _SYSTEM_TOPS:
        return None
    # S replaces what the sandbox would show at the parent: only a directory
    # the sentry would have made for the workspace's mount point itself.
    for dest in (*bd.TMPFS, spec.home, bd.REPORT_DIR):
        if parent == dest or dest.startswith(parent + "/"):
            return None
    return BootKey(
        workspace=ws,
        home=spec.home,
        hostname=spec.hostname,
        env_kind=spec.env_kind,
        nproc=spec.limits.pids is not None,
        runsc=config.runsc,
        platform=config.platform,
        parent_cgroup=parent_cgroup,
    )


def _hint_path() -> str | None:
    # Per launcher: only its own next warm worker may boot for what it served.
    # A host-wide hint made every launcher's warm workers (and anything else
    # calling prewarm.prepare) boot gVisor sandboxes for one user's request.
    from corral.sandbox import prewarm
    from corral.sandbox.gvisor.backend import STATE_ROOT

    launcher = prewarm.launcher_pid()
    return None if launcher is None else os.path.join(STATE_ROOT, f"preboot-{launcher}.json")


def _sweep_hints(keep: str) -> None:
    """Remove the hints of launchers that are gone (their pid no longer runs)."""
    from corral.sandbox.gvisor.backend import STATE_ROOT

    with contextlib.suppress(OSError):
        for name in os.listdir(STATE_ROOT):
            pid = name[len("preboot-") : -len(".json")]
            if not (name.startswith("preboot-") and name.endswith(".json") and pid.isdigit()):
                continue
            path = os.path.join(STATE_ROOT, name)
            if path != keep and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    os.unlink(path)


def remember(key: BootKey) -> None:
    """Record `key` for this launcher's next warm worker (best effort; in corral's
    root-only state dir). Outside a warm worker there is no launcher to use it."""
    path = _hint_path()
    if path is None:
        return
    _sweep_hints(path)
    tmp = f"{path}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(key), fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _forget() -> None:
    path = _hint_path()
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _recalled() -> BootKey | None:
    path = _hint_path()
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(4096))
        return BootKey(**doc)
    except (OSError, ValueError, TypeError):
        return None


_slot: list[PreBooted] = []


def prepare(key: BootKey | None = None) -> None:
    """Boot a sandbox for `key` (default: the last request's), root only, best effort.

    Any failure leaves nothing prepared: the request starts cold and reports
    its own error there, where it belongs.
    """
    if _slot or os.geteuid() != 0:
        return
    key = key or _recalled()
    if key is None:
        return
    with contextlib.suppress(Exception):
        _slot.append(PreBooted.boot(key))


def take(key: BootKey) -> PreBooted | None:
    """The parked sandbox when it was booted for `key` and still runs; else None
    (and whatever was parked is torn down). It is never handed out twice."""
    if not _slot:
        return None
    pre = _slot.pop()
    if pre.key == key and pre.ready():
        return pre
    pre.discard()
    return None


def discard() -> None:
    """Tear down a parked sandbox no request used, and stop booting for its key."""
    if _slot:
        _forget()
    while _slot:
        _slot.pop().discard()


def _setns_mnt(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"setns(CLONE_NEWNS): {os.strerror(err)}")


def _mount(src: bytes | None, dst: bytes, flags: int, what: str) -> None:
    if _libc.mount(src, dst, None, flags, None) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"{what}: {os.strerror(err)}")


def _in_child(action: object, what: str) -> None:
    """Run `action()` in a forked child (setns needs a single-threaded process)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            action()  # type: ignore[operator]
            os._exit(0)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(w, str(exc).encode()[:2000])
            os._exit(1)
    os.close(w)
    try:
        detail = b""
        while chunk := os.read(r, 4096):
            detail += chunk
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SandboxStartError(0, f"{what}: {detail.decode(errors='replace') or status}")


def _stage_ns(stage: str) -> int:
    """A mount namespace (as an fd) in which `stage` is a shared bind of itself and
    nothing propagates back to the host."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        ok = b"0"
        try:
            os.close(r)
            os.close(go_w)
            mounts.make_private_mount_ns()
            _mount(stage.encode(), stage.encode(), _MS_BIND, "bind the stage")
            # Read-only on the host: the sandbox shows it (rw, for the
            # workspace below it) as the workspace's parent; nothing may land
            # in it but the mounts corral attaches.
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
            _mount(None, stage.encode(), flags, "make the stage read-only")
            _mount(None, stage.encode(), _MS_SHARED, "make the stage shared")
            ok = b"1"
        except BaseException:
            pass
        finally:
            os.write(w, ok)
            os.read(go_r, 1)  # hold the namespace until the parent has it open
            os._exit(0)
    os.close(w)
    os.close(go_r)
    try:
        if os.read(r, 1) != b"1":
            raise SandboxStartError(0, "cannot prepare the stage mount namespace")
        return os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(r)
        os.close(go_w)
        os.waitpid(pid, 0)


class PreBooted:
    """A booted sandbox waiting for its request. `serve` once, or `discard`."""

    def __init__(
        self,
        *,
        key: BootKey,
        proc: subprocess.Popen[bytes],
        base: str,
        name: str,
        runsc: str,
        layers: dict[str, object],
        cgroup: Cgroup | None,
        relay: StdioRelay,
        refusals: SentryRefusals | None,
        lease: UidLease | None,
        fds: list[int],
        stage_fd: int,
        userns_fd: int,
        mount_point: str,
    ) -> None:
        self.key = key
        self.proc = proc
        self.base = base
        self.name = name
        self.runsc = runsc
        self.layers = layers
        self.cgroup = cgroup
        self.relay = relay
        self.refusals = refusals
        self.lease = lease
        self._fds = fds
        self.stage_fd = stage_fd
        self.userns_fd = userns_fd
        self.mount_point = mount_point

    # -- boot -----------------------------------------------------------------
    @classmethod
    def boot(cls, key: BootKey) -> PreBooted:
        """Start booting a sandbox for `key` (`ready` waits for the end); raises when
        any step fails (nothing is left then)."""
        from corral.sandbox import uids
        from corral.sandbox.backend import GVisorConfig
        from corral.sandbox.cgroup import Cgroup, detect_layout, sweep_stale
        from corral.sandbox.gvisor import backend as gb
        from corral.sandbox.gvisor import etcdir, hostuid
        from corral.sandbox.gvisor.nproc import SentryRefusals
        from corral.sandbox.gvisor.stdio import StdioRelay
        from corral.sandbox.initbin import gvsup_binary
        from corral.sandbox.namespace import (
            INSIDE_UID,
            _etc_entries,
            _system_links,
            _which,
            cache_dir,
            set_pdeathsig,
        )
        from corral.sandbox.noreserve import drop_reserve_access
        from corral.sandbox.spec import Limits, SandboxSpec

        backend = gb.GVisorBackend(GVisorConfig(key.runsc, key.platform))
        runsc, platform, _ = backend._platform()
        layout = detect_layout()
        reason = backend._cgroup_reason(layout)
        if layout is None or reason is not None:
            raise LayerUnavailableError("cgroup", reason or "no cgroup filesystem")
        sup = gvsup_binary(cache_dir())
        if sup is None:
            raise LayerUnavailableError("gvisor", "no supervisor binary")
        spec = SandboxSpec(
            argv=("true",),
            workspace=key.workspace,
            env=(),
            limits=Limits(pids=1 if key.nproc else None),
            env_kind=key.env_kind,  # type: ignore[arg-type]
            home=key.home,
            hostname=key.hostname,
        )
        name = f"{key.env_kind}-{os.getpid()}-{os.urandom(4).hex()}"
        base = os.path.join(gb.STATE_ROOT, name)
        stage = os.path.join(base, "stage")
        mount_point = os.path.join(stage, posixpath.basename(key.workspace))
        fds: list[int] = []
        cgroup: Cgroup | None = None
        lease: UidLease | None = None
        refusals: SentryRefusals | None = None
        relay: StdioRelay | None = None
        proc: subprocess.Popen[bytes] | None = None
        try:
            os.makedirs(gb.STATE_ROOT, mode=0o700, exist_ok=True)
            gb.sweep_state()
            with contextlib.suppress(CgroupError, OSError):
                sweep_stale(layout, key.parent_cgroup)
            files = os.path.join(base, "bundle", "files")
            plan = bd.BundlePlan(
                spec=spec,
                system_links=_system_links(),
                etc_entries=_etc_entries(),
                binds=(StagedBind(stage, posixpath.dirname(key.workspace), True),),
                files_dir=files,
                uid=INSIDE_UID,
                gid=INSIDE_UID,
                etc_dir=os.path.join(base, "bundle", "etc"),
                report_dir=os.path.join(base, "report"),
                preboot=True,
            )
            gb._write_bundle(base, plan, sup)
            os.mkdir(stage, 0o755)
            os.mkdir(mount_point, 0o755)
            assert plan.etc_dir is not None
            os.mkdir(plan.etc_dir, 0o755)
            etc_binds = etcdir.prepare(plan.etc_dir, plan.etc_entries, gb._synthetic(spec))
            cgroup = Cgroup.create(layout, f"{key.parent_cgroup}/{name}", Limits())
            attach_fds = cgroup.open_attach_fds()
            fds += attach_fds
            userns_fd = mounts.make_userns_fd(
                os.getuid(), os.getgid(), INSIDE_UID, INSIDE_UID, extra=((_NOBODY, 0),)
            )
            fds.append(userns_fd)
            lease = uids.allocate(uids.configured_range())
            id_map = hostuid.id_map(lease.uid, INSIDE_UID)
            runsc_ns = mounts.userns_fd(id_map, id_map, deny_setgroups=False)
            fds.append(runsc_ns)
            stage_fd = _stage_ns(stage)
            fds.append(stage_fd)
            if key.nproc:
                refusals = SentryRefusals()
            argv = [
                _which("unshare") or "/usr/bin/unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                # Not unshare's default (private): the stage's mounts must
                # reach runsc's namespace, and through it the gofer's.
                "--propagation",
                "slave",
                *bd.runsc_argv(
                    runsc=runsc,
                    platform=platform,
                    state_dir=os.path.join(base, "state"),
                    bundle_dir=os.path.join(base, "bundle"),
                    container_id=name,
                    log_file=os.path.join(base, "runsc.log"),
                    extra_flags=tuple(refusals.argv_flags()) if refusals else (),
                ),
            ]
            me = os.getpid()

            def child_setup() -> None:
                for fd in attach_fds:
                    os.write(fd, b"0")
                drop_reserve_access()
                _setns_mnt(stage_fd)
                for src, dst in etc_binds:
                    mounts.bind_readonly(src, dst)
                set_pdeathsig(signal.SIGKILL)
                if os.getppid() != me:
                    os._exit(125)
                hostuid.enter(runsc_ns)

            relay = StdioRelay(None)
            child_stdio = relay.child_fds()
            with interrupts.deferred():
                proc = subprocess.Popen(
                    argv,
                    stdin=child_stdio[0],
                    stdout=child_stdio[1],
                    stderr=child_stdio[2],
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                    preexec_fn=child_setup,  # noqa: PLW1509
                    close_fds=True,
                    pass_fds=[refusals.write_fd] if refusals else [],
                    cwd="/",
                )
            relay.close_child_ends()
            if refusals is not None:
                refusals.started()
            # Not waited for here: the worker takes its request (of any kind)
            # while runsc boots; `take` waits for the supervisor's ready line.
            for fd in [*attach_fds, runsc_ns]:
                os.close(fd)
                fds.remove(fd)
            layers: dict[str, object] = {
                "gvisor": platform,
                "cgroup": layout.kind,
                "idmap": True,
                "preboot": "booted before the request",
            }
            return cls(
                key=key,
                proc=proc,
                base=base,
                name=name,
                runsc=runsc,
                layers=layers,
                cgroup=cgroup,
                relay=relay,
                refusals=refusals,
                lease=lease,
                fds=fds,
                stage_fd=stage_fd,
                userns_fd=userns_fd,
                mount_point=mount_point,
            )
        except BaseException:
            _teardown(
                proc, cgroup=cgroup, relay=relay, refusals=refusals, lease=lease, fds=fds, base=base
            )
            raise

    def ready(self) -> bool:
        """Wait for the supervisor's ready line (the boot's end); False if it never came."""
        if self.proc.poll() is not None:
            return False
        got = self.relay.read_stdout(len(bd.SUPERVISOR_READY), _BOOT_S)
        return got == bd.SUPERVISOR_READY

    # -- the request ------------------------------------------------------------
    def serve(
        self, spec: SandboxSpec, stdio: tuple[int | None, int | None, int | None] | None
    ) -> GVisorSandbox:
        """Give the parked sandbox `spec`'s limits, workspace and command (once)."""
        from corral.sandbox.gvisor import backend as gb
        from corral.sandbox.gvisor.ps import Located
        from corral.sandbox.namespace import INSIDE_UID, cache_dir

        started = time.monotonic()
        placeholders = None
        layers = dict(self.layers)
        try:
            if self.cgroup is not None:
                self.cgroup.apply_limits(gb.cgroup_limits(spec.limits))
            protect: tuple[StagedBind, ...] = ()
            staged = [StagedBind(self.mount_point, spec.workspace, True)]
            if spec.protect:
                from corral.sandbox.protect import start_protection

                protect, placeholders = start_protection(spec, staged, cache_dir())
                layers["protect"] = placeholders.summary
            stage_fd, userns_fd, point, ws = (
                self.stage_fd,
                self.userns_fd,
                self.mount_point,
                spec.workspace,
            )
            ordered = sorted(protect, key=bd.depth_key)

            def attach() -> None:
                _setns_mnt(stage_fd)
                mounts.stage_bind(0, ws, True, userns_fd, target=point)
                for b in ordered:
                    mounts.bind_readonly(b.source, b.source)

            _in_child(attach, "cannot attach the workspace to the pre-booted sandbox")
            self._close_fds()
            request = bd.encode_request(
                INSIDE_UID,
                INSIDE_UID,
                nproc=spec.limits.pids,
                cwd=spec.workspace,
                argv=spec.argv,
                env=spec.env,
            )
            if not self.relay.write_stdin(request):
                raise SandboxStartError(0, "the pre-booted gVisor sandbox ended before its request")
            self.relay.attach(stdio or (None, None, None))
            self.relay.started()
            sandbox = gb.GVisorSandbox(
                proc=self.proc,
                located=Located(
                    self.runsc, os.path.join(self.base, "state"), self.name, self.proc.pid
                ),
                report=os.path.join(self.base, "report"),
                cgroup=self.cgroup,
                layers=layers,
                started=started,
                base=self.base,
                runsc=self.runsc,
                placeholders=placeholders,
                relay=self.relay,
                refusals=self.refusals,
                lease=self.lease,
            )
            return sandbox
        except BaseException:
            self.discard()
            if placeholders is not None:
                placeholders.release()
            raise

    def _close_fds(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    def discard(self) -> None:
        """Tear it down: every process, its cgroup, its state directory."""
        _teardown(
            self.proc,
            cgroup=self.cgroup,
            relay=self.relay,
            refusals=self.refusals,
            lease=self.lease,
            fds=self._fds,
            base=self.base,
        )
        self._fds = []


def _teardown(
    proc: subprocess.Popen[bytes] | None,
    *,
    cgroup: Cgroup | None,
    relay: StdioRelay | None,
    refusals: SentryRefusals | None,
    lease: UidLease | None,
    fds: list[int],
    base: str,
) -> None:
    if cgroup is not None:
        with contextlib.suppress(CgroupError):
            cgroup.kill()
    if proc is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    emptied = False
    if cgroup is not None:
        with contextlib.suppress(CgroupError):
            cgroup.remove()
            emptied = True
    if relay is not None:
        relay.close(1.0)
    if refusals is not None:
        refusals.close()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    shutil.rmtree(base, ignore_errors=True)
    if lease is not None:
        lease.close(clean=emptied)
