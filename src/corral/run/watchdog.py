"""The run's watchdog: host and run state sampled every ≤ 100 ms, a breach acted on.

    wd = Watchdog(settings, run_cgroup, samples=run_dir / "footprint.jsonl", on_breach=act)
    wd.start() ... wd.close()

What it reads, all kernel counters on the host side: `MemAvailable` from
/proc/meminfo; the run cgroup's memory PSI, from `memory.pressure` of the
run's directory in the cgroup2 tree (present in the hybrid v1 layout too:
PSI is a core cgroup2 file that needs no controller), else host-wide
/proc/pressure/memory (`pressure_source` says which); and, per environment
(the run cgroup's `<env>-<pid>-<hex>` children and `helpers`), memory in use
and CPU time; and the run directory's disk use and quota when it is its own
`run_disk` filesystem (one statvfs: never a walk of the agent's tree, whose
size and file count the agent chooses). Without `run_disk` disk is not
sampled (`None`).

The watchdog only observes: the kernel's memory cap acts before an
allocation succeeds, the watchdog one sample (plus the freeze) after it. A
breach is acted on once; the watchdog re-arms when the condition clears, so
`corral resume` of a run it paused is not undone on the next sample.

Samples go to `footprint.jsonl` at most once a second (and on each breach),
for `corral status` and the report's plot. The decision (`breach`) is pure.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from corral.run.environments import RunLayout
from corral.run.mission import WatchSettings
from corral.run.runcg import RunCgroup
from corral.sandbox.cgroup import Cgroup, parse_flat_keyed

__all__ = [
    "Breach",
    "EnvSample",
    "Sample",
    "Watchdog",
    "breach",
    "breach_handler",
    "disk_usage",
    "parse_mem_available",
    "parse_pressure",
    "pressure_source",
    "read_samples",
    "take_sample",
]

_ENV_RE = re.compile(r"^([a-z]+)-\d+-[0-9a-f]+$")
_STORE_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class EnvSample:
    memory_bytes: int
    cpu_s: float


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    """time.time()"""
    mono: float
    host_available: int
    pressure: dict[str, float]
    """'some avg10' → value, from `pressure_source`."""
    envs: dict[str, EnvSample] = field(default_factory=dict)
    """'run' (the whole run), 'agent', 'product', 'verifier', 'helpers'."""
    disk_bytes: int | None = None
    """Bytes in use on the run's `run_disk` image (None: no image)."""
    disk_cap_bytes: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Breach:
    what: str
    value: float
    threshold: float


def parse_mem_available(meminfo: str) -> int:
    """MemAvailable in bytes (pure)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemAvailable in /proc/meminfo")


def parse_pressure(text: str) -> dict[str, float]:
    """`some avg10=1.00 avg60=…` lines as {'some avg10': 1.0, …} (pure)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for item in rest.split():
            key, _, value = item.partition("=")
            if key.startswith("avg"):
                out[f"{kind} {key}"] = float(value)
    return out


def breach(settings: WatchSettings, sample: Sample) -> Breach | None:
    """Which threshold `sample` crosses, if any (pure)."""
    floor = settings.host_memory_min_free
    if floor is not None and sample.host_available < floor:
        return Breach("host_memory_min_free", sample.host_available, floor)
    if settings.memory_pressure is not None:
        metric, _, limit = settings.memory_pressure.partition(" > ")
        value = sample.pressure.get(metric)
        if value is not None and value > float(limit):
            return Breach("memory_pressure", value, float(limit))
    return None


def pressure_source(cg: RunCgroup) -> str:
    """The run cgroup's memory.pressure where the kernel has it, else the host's."""
    unified = cg.cgroup.dirs.get("unified")
    if unified is not None:
        path = os.path.join(unified, "memory.pressure")
        if os.path.exists(path):
            return path
    return "/proc/pressure/memory"


def _is_mount(path: Path) -> bool:
    from corral.run.rundisk import is_mounted

    return is_mounted(path)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read()


def _env_usage(cg: RunCgroup, rel: str) -> EnvSample:
    dirs = Cgroup(cg.layout, rel).dirs
    mem = 0
    cpu = 0.0
    try:
        if "memory" in dirs:
            mem = int(_read(os.path.join(dirs["memory"], "memory.usage_in_bytes")))
        elif "unified" in dirs:
            mem = int(_read(os.path.join(dirs["unified"], "memory.current")))
    except (OSError, ValueError):
        pass
    try:
        if "unified" in dirs:
            stat = parse_flat_keyed(_read(os.path.join(dirs["unified"], "cpu.stat")))
            cpu = stat.get("usage_usec", 0) / 1e6
        elif "cpuacct" in dirs:
            cpu = int(_read(os.path.join(dirs["cpuacct"], "cpuacct.usage"))) / 1e9
    except (OSError, ValueError):
        pass
    return EnvSample(mem, cpu)


def disk_usage(root: Path) -> tuple[int, int] | None:
    """(bytes used, bytes in all) of the filesystem at `root`, from one statvfs."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


def take_sample(cg: RunCgroup, pressure_path: str, disk_root: Path | None = None) -> Sample:
    """One reading of the host and of every environment of the run (and its image)."""
    with open("/proc/meminfo", encoding="ascii") as fh:
        available = parse_mem_available(fh.read())
    try:
        pressure = parse_pressure(_read(pressure_path))
    except OSError:
        pressure = {}
    envs: dict[str, EnvSample] = {"run": _env_usage(cg, cg.relpath)}
    base = cg.cgroup.dirs.get("memory") or cg.cgroup.dirs.get("unified")
    try:
        names = os.listdir(base) if base else []
    except OSError:
        names = []
    for name in names:
        m = _ENV_RE.match(name)
        env = m.group(1) if m else ("helpers" if name.split("-", 1)[0] == "helpers" else None)
        if env is None or not os.path.isdir(os.path.join(base or "", name)):
            continue
        u = _env_usage(cg, f"{cg.relpath}/{name}")
        prev = envs.get(env, EnvSample(0, 0.0))
        envs[env] = EnvSample(prev.memory_bytes + u.memory_bytes, prev.cpu_s + u.cpu_s)
    disk = disk_usage(disk_root) if disk_root is not None else None
    return Sample(
        time.time(),
        time.monotonic(),
        available,
        pressure,
        envs,
        disk[0] if disk else None,
        disk[1] if disk else None,
    )


def read_samples(path: Path, limit: int = 100_000) -> list[Sample]:
    """The stored samples (the host's own file), at most `limit` of them."""
    out: list[Sample] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if len(out) >= limit:
                    break
                try:
                    d = json.loads(line)
                    envs = {k: EnvSample(**v) for k, v in d.pop("envs").items()}
                    out.append(Sample(**d, envs=envs))
                except (ValueError, TypeError, KeyError):
                    continue
    except OSError:
        return []
    return out


class Watchdog:
    """A thread sampling every `settings.interval` seconds; `on_breach` runs on it."""

    def __init__(
        self,
        settings: WatchSettings,
        cg: RunCgroup,
        *,
        samples: Path,
        on_breach: Callable[[Breach, Sample], None],
    ) -> None:
        self.settings = settings
        self.cg = cg
        self.samples = samples
        self.on_breach = on_breach
        self.pressure_path = pressure_source(cg)
        # The run directory holds the samples; on its own image its disk is read.
        root = samples.parent
        self.disk_root = root if _is_mount(root) else None
        self.taken = 0
        self._armed = True
        self._stored = 0.0
        self._out: TextIO | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="corral-watchdog", daemon=True)

    def start(self) -> None:
        """The first sample is taken (and acted on) here, before the run starts work."""
        self._out = self.samples.open("a", encoding="utf-8")
        self._step()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        if self._out is not None:
            self._out.close()
            self._out = None

    def _step(self) -> None:
        assert self._out is not None
        try:
            sample = take_sample(self.cg, self.pressure_path, self.disk_root)
        except (OSError, ValueError):
            return
        self.taken += 1
        found = breach(self.settings, sample)
        if sample.mono - self._stored >= _STORE_EVERY_S or (found is not None and self._armed):
            self._out.write(sample.to_json() + "\n")
            self._out.flush()
            self._stored = sample.mono
        if found is None:
            self._armed = True
        elif self._armed:
            self._armed = False
            self.on_breach(found, sample)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.interval):
            self._step()


def breach_handler(
    layout: RunLayout,
    cg: RunCgroup,
    action: str,
    *,
    request_stop: Callable[[], None],
    session: Callable[[], int],
) -> Callable[[Breach, Sample], None]:
    """What the coordinator's watchdog does on a breach: `action`, then a journal row.

    Fail closed: a pause the kernel did not apply stops the run instead.
    """
    from corral.broker.actions import Observation
    from corral.broker.journal import Journal
    from corral.errors import CorralError
    from corral.run.pause import pause_run
    from corral.run.store import Store

    def act(found: Breach, sample: Sample) -> None:
        detail: dict[str, object] = {
            "value": found.value,
            "threshold": found.threshold,
            "action": action,
            "what": found.what,
        }
        try:
            if action == "pause":
                pause_run(layout, reason=f"watchdog: {found.what}")
            elif action == "kill":
                cg.kill_and_thaw()
                request_stop()
            else:
                request_stop()
        except CorralError as exc:
            detail["error"] = str(exc)[:500]
            request_stop()
        detail["latency_s"] = round(time.monotonic() - sample.mono, 6)
        n = session()
        with Store(layout.state) as store:
            store.event("watch", session=n or None, **detail)
        journal = Journal(layout.journal)
        try:
            journal.append(
                Observation(
                    run=layout.run_id,
                    session=str(n) if n else None,
                    env="agent",
                    kind="watch",
                    target=found.what,
                    decision="deny",
                    reason=(
                        f"watchdog: {found.what} {found.value:g} against {found.threshold:g}:"
                        f" {action}"
                    ),
                    detail=detail,
                )
            )
        finally:
            journal.close()

    return act
