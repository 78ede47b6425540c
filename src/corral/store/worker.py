"""`corral submit` and `corral worker`: queue runs in the shared store and drive them under a lease.

    submit(mission, url)                 # create the run, store its files and git bundle, queue it
    work(url, work_dir, max_runs=None)   # claim, materialize, drive, release; until idle

A worker materializes a leased run into `<work_dir>/<run id>/lease-<epoch>/<run id>`
from the store alone (frozen files + git bundle of the last durable commit),
so any host can continue it. Everything a driver creates on the host (that
directory, its cgroups `corral/run-<id>/lease-<epoch>`) is named by its
lease epoch: a stalled driver that wakes up after a takeover on the same
host touches only its own epoch's, and the successor discards the older
epochs' (corral.run.runcg). The coordinator is the one `corral run` uses, given the
PostgreSQL store instead of the run's SQLite file; the lease replaces the
run directory's flock. A heartbeat thread renews the lease every third of
its expiry; if a renewal fails the worker stops its own coordinator
(SIGTERM: everything of the run is killed), whose further writes the store
refuses anyway (fencing, corral.store.postgres).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import secrets
import shutil
import signal
import socket
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import CorralError, LeaseLostError
from corral.hostgit import TrustedRepo

if TYPE_CHECKING:
    from corral.run.environments import RunLayout
    from corral.run.progress import Progress
    from corral.run.store_api import RunStateStore
    from corral.store.postgres import Lease, PgFleet

__all__ = [
    "WorkerReport",
    "git_bundle",
    "materialize",
    "run_dir",
    "safe_run_id",
    "submit",
    "work",
]

# What a run directory needs besides its git to be driven anywhere (see create_run).
_FROZEN = ("mission.md", "run.json", "scenario.yaml", "checks", "state.sqlite")
_MAX_FILES = 64 << 20
_RUN_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,127}")


def git_bundle(git_dir: Path, scratch: Path) -> bytes:
    """A bundle of the trusted repo's HEAD history (corral's own git, never the workspace's)."""
    out = scratch / f".bundle-{secrets.token_hex(4)}"
    try:
        TrustedRepo(git_dir, scratch).git("bundle", "create", "--quiet", str(out), "HEAD")
        return out.read_bytes()
    finally:
        out.unlink(missing_ok=True)


def _restore_git(git_dir: Path, scratch: Path, bundle: bytes, commit: str) -> None:
    path = scratch / f".bundle-{secrets.token_hex(4)}"
    path.write_bytes(bundle)
    try:
        repo = TrustedRepo(git_dir, scratch)
        repo.init()
        # `unbundle` indexes the pack without a transport (hardened git allows none).
        repo.git("bundle", "unbundle", str(path))
        repo.git("update-ref", "HEAD", commit)
    finally:
        path.unlink(missing_ok=True)


def _tar_frozen(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in _FROZEN:
            if (root / name).exists():
                tar.add(root / name, arcname=name)
    return buf.getvalue()


def submit(
    mission_path: Path,
    fleet: PgFleet,
    *,
    agent: str | None = None,
    provider: str | None = None,
    provider_key: str | None = None,
    run_id: str | None = None,
) -> str:
    """Create the run (as `corral run` would), put it in the store as `queued`; its id.

    A mission's `limits.run_disk` image is made by the worker that drives the
    run, on its host (`materialize`): the submitter only freezes the files."""
    from corral.run.coordinator import create_run
    from corral.run.mission import load_mission
    from corral.run.store import Store

    m = load_mission(mission_path, provider, provider_key)
    if m.settings.limits.run_disk is not None:
        limits = m.settings.limits.model_copy(update={"run_disk": None})
        settings = m.settings.model_copy(update={"limits": limits})
        m = dataclasses.replace(m, settings=settings)  # mission.md keeps it for the worker
    with tempfile.TemporaryDirectory(prefix="corral-submit-") as tmp:
        layout = create_run(m, Path(tmp), agent=agent, run_id=run_id)
        with Store(layout.state) as st:
            record = st.run()
        fleet.submit(
            record,
            files=_tar_frozen(layout.root),
            git_bundle=git_bundle(layout.git_dir, layout.root),
        )
    return record.id


def safe_run_id(run_id: str) -> str:
    """`run_id` if it can name a directory and a cgroup; anyone with the store's URL can
    insert a run row, so its id is checked before it becomes a path (pure)."""
    if not _RUN_ID.fullmatch(run_id):
        raise CorralError(f"refusing run id {run_id[:80]!r} from the store")
    return run_id


_EPOCH_DIR = re.compile(r"lease-([1-9][0-9]{0,17})")


def run_dir(work_dir: Path, run_id: str, epoch: int) -> Path:
    """Where the driver of `epoch` materializes the run (its name is the run id; pure)."""
    return work_dir.absolute() / safe_run_id(run_id) / f"lease-{epoch}" / run_id


def _discard_older_epochs(fleet: PgFleet, base: Path, run_id: str, epoch: int) -> None:
    from corral.run.runcg import RunCgroup
    from corral.run.rundisk import RunDisk, ensure_mounted
    from corral.store.postgres import mirror_rows

    # A predecessor's brokers on this host first: a row one of them commits
    # after the copy below would be in neither journal.
    cg = RunCgroup.detect(run_id, epoch)
    if cg is not None:
        cg.sweep_older_epochs()
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.listdir(base)):
            m = _EPOCH_DIR.fullmatch(entry)
            if m is None or int(m.group(1)) >= epoch:
                continue
            old = base / entry / run_id
            ensure_mounted(old)  # after a reboot its run_disk image is not
            # A driver on this host died or stalled: what its broker journaled
            # since the last session end is only here; copy it in first.
            src = old / "journal.source"
            if src.is_file() and (old / "journal.sqlite").is_file():
                with fleet._tx() as c:
                    mirror_rows(c, old / "journal.sqlite", src.read_text(encoding="ascii").strip())
            if (old.parent / ".disks").is_dir():
                RunDisk(old.parent, run_id).remove()
            aside = base / f".{entry}.old-{secrets.token_hex(3)}"
            (base / entry).rename(aside)
            shutil.rmtree(aside, ignore_errors=True)


def materialize(fleet: PgFleet, lease: Lease, work_dir: Path) -> tuple[RunLayout, str]:
    """The run directory of a leased run, rebuilt from the store; (layout, journal source id)."""
    from corral.run.environments import RunLayout
    from corral.run.rundisk import create_run_disk

    root = run_dir(work_dir, lease.run_id, lease.epoch)
    _discard_older_epochs(fleet, root.parent.parent, lease.run_id, lease.epoch)
    files, bundle = fleet.files(lease.run_id)
    if len(files) > _MAX_FILES:
        raise CorralError(f"run {lease.run_id}: stored files exceed {_MAX_FILES} bytes")
    work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.parent.mkdir(mode=0o700, parents=True)
    disk = _run_disk(files, root)
    if disk is not None:
        # Mounted on the empty run directory before anything is written to it.
        create_run_disk(root.parent, lease.run_id, disk)
    else:
        root.mkdir(mode=0o700)
    layout = RunLayout(root)
    with tarfile.open(fileobj=io.BytesIO(files), mode="r:gz") as tar:
        tar.extractall(root, filter="data")
    for d in (layout.workspace, layout.transcripts, layout.tools):
        d.mkdir(exist_ok=True)
    _rebase_scenario(layout)
    run = fleet.run_store(lease.run_id).run()
    commit = run.last_commit or run.base_commit
    if commit is None:
        raise CorralError(f"run {lease.run_id}: no commit recorded")
    _restore_git(layout.git_dir, root, bundle, commit)
    repo = TrustedRepo(layout.git_dir, root)
    if repo.git("ls-tree", "--name-only", commit).strip():
        layout.workspace.rmdir()
        repo.snapshot(commit, layout.workspace)
    source = f"{socket.gethostname()}:{lease.run_id}:{lease.epoch}:{secrets.token_hex(4)}"
    (root / "journal.source").write_text(source, encoding="ascii")
    return layout, source


def _run_disk(files: bytes, root: Path) -> int | None:
    """The frozen mission's `limits.run_disk` (the submitter made no image)."""
    from corral.run.mission import parse_mission

    with tarfile.open(fileobj=io.BytesIO(files), mode="r:gz") as tar:
        member = tar.extractfile("mission.md")
        if member is None:
            raise CorralError("the stored run has no mission.md")
        text = member.read(1 << 20).decode("utf-8", errors="strict")
    return parse_mission(text, root / "mission.md").settings.limits.run_disk


def _unmount(work_dir: Path, lease: Lease) -> None:
    """Drop this epoch's run_disk image: the run lives in the store, its directory was a copy."""
    from corral.run.rundisk import RunDisk, is_mounted

    root = run_dir(work_dir, lease.run_id, lease.epoch)
    disk = RunDisk(root.parent, lease.run_id)
    # Only if there is one: `remove` would recreate a directory a successor discarded.
    if disk.image.exists() or is_mounted(root):
        with contextlib.suppress(CorralError, OSError):
            disk.remove()


def _rebase_scenario(layout: RunLayout) -> None:
    """A synthetic provider names its frozen scenario by path: the submitter's, not ours."""
    from corral.run.coordinator import RunConfig

    cfg = RunConfig.from_json(layout.config.read_text(encoding="utf-8"))
    scenario = layout.root / "scenario.yaml"
    if cfg.provider.startswith("synthetic:") and scenario.is_file():
        cfg = RunConfig(agent=cfg.agent, provider=f"synthetic:{scenario}", origin=cfg.origin)
        layout.config.write_text(cfg.to_json(), encoding="utf-8")


class _Heartbeat:
    """Renews a lease from its own connection; on a failed renewal stops this process's run."""

    def __init__(self, url: str, lease: Lease, ttl_s: float) -> None:
        from corral.store.postgres import PgFleet

        self._fleet = PgFleet(url)
        self._lease, self._ttl = lease, ttl_s
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            ok = False
            with contextlib.suppress(CorralError):
                ok = self._fleet.renew(self._lease, self._ttl)
            if not ok:
                self.lost = True
                # The coordinator turns SIGTERM into a stop that kills every
                # process of the run; its writes are fenced from now on.
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._fleet.close()


def _still_ours(fleet: PgFleet, lease: Lease, ttl_s: float) -> bool:
    try:
        return fleet.renew(lease, ttl_s)
    except CorralError:
        return False


@dataclass(frozen=True, slots=True)
class WorkerReport:
    worker: str
    driven: tuple[tuple[str, str], ...]  # (run id, final state or "lease lost")


def work(
    url: str,
    work_dir: Path,
    *,
    progress: Progress,
    max_runs: int | None = None,
    ttl_s: float = 30.0,
    idle_exit_s: float | None = None,
    only: str | None = None,
) -> WorkerReport:
    """Drive queued runs until `max_runs` were driven or the queue stayed empty `idle_exit_s`
    (`only`: just that run, e.g. `corral run --store` driving what it queued)."""
    from corral.broker.pgjournal import ENV_SOURCE, ENV_STORE
    from corral.run.coordinator import Coordinator
    from corral.store.postgres import PgFleet

    worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    driven: list[tuple[str, str]] = []
    with PgFleet(url) as fleet:
        idle_since = time.monotonic()
        while max_runs is None or len(driven) < max_runs:
            lease = fleet.claim(worker, ttl_s, only)
            if lease is None:
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    break
                time.sleep(0.25)
                continue
            hb = _Heartbeat(url, lease, ttl_s)
            try:
                layout, source = materialize(fleet, lease, work_dir)

                def open_store(
                    lease: Lease = lease, layout: RunLayout = layout, source: str = source
                ) -> RunStateStore:
                    return fleet.run_store(
                        lease.run_id,
                        lease,
                        bundle=lambda _sha: git_bundle(layout.git_dir, layout.root),
                        mirror=(layout.journal, source),
                    )

                # Every broker of the run inherits these: its journal rows go
                # to the store as they are committed (corral.broker.pgjournal).
                os.environ[ENV_STORE], os.environ[ENV_SOURCE] = url, source
                try:
                    state = Coordinator(
                        layout, progress, store=open_store, epoch=lease.epoch
                    ).drive()
                except LeaseLostError:
                    state = "lease lost"
                except CorralError as exc:
                    # Waking from a stall, the driver may fail on what its
                    # successor discarded before the heartbeat notices.
                    lost = hb.lost or not _still_ours(fleet, lease, ttl_s)
                    state = "lease lost" if lost else f"error: {exc}"[:200]
            finally:
                os.environ.pop(ENV_STORE, None)
                os.environ.pop(ENV_SOURCE, None)
                hb.close()
                _unmount(work_dir, lease)
            driven.append((lease.run_id, state))
            with contextlib.suppress(CorralError):
                fleet.release(lease)
            idle_since = time.monotonic()
    return WorkerReport(worker, tuple(driven))
