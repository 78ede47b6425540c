"""What a run costs, from the kernel's counters: `corral status`'s footprint and `corral top`.

Every figure is read on the host side: the run cgroup's peak and CPU time
from its own files while it exists, else what the coordinator recorded (the
peak at each session's end) and the watchdog's last sample. Disk comes
from the run's own filesystem when it has a `run_disk` quota (the per-run
image's statvfs); without one, `disk_bytes` and `disk_cap_bytes` are null
rather than a guess.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.run.environments import RunLayout
from corral.run.runcg import RunCgroup
from corral.run.store import RunRecord, Store
from corral.run.watchdog import Sample, pressure_source, read_samples, take_sample
from corral.sandbox.cgroup import Cgroup

__all__ = ["TopRow", "footprint", "run_disk_usage", "top_rows"]


def run_disk_usage(root: Path) -> tuple[int | None, int | None]:
    """(bytes used, bytes of the quota) of a run directory on its own `run_disk` image."""
    from corral.run.rundisk import is_mounted

    if not is_mounted(root):
        return None, None
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


def footprint(layout: RunLayout, run: RunRecord) -> dict[str, Any]:
    """`corral status --json`'s "footprint" object."""
    cg = RunCgroup.detect(run.id)
    peak = run.peak_memory
    cpu_s: float | None = None
    if cg is not None and cg.exists():
        usage = cg.cgroup.usage()
        peak = max(peak, usage.peak_memory_bytes)
        cpu_s = usage.cpu_s
    else:
        last = read_samples(layout.root / "footprint.jsonl")[-1:]
        if last and "run" in last[0].envs:
            cpu_s = last[0].envs["run"].cpu_s
    with Store(layout.state, readonly=True) as store:
        watch = [
            {"time": t, "session": s, **d} for t, s, kind, d in store.events() if kind == "watch"
        ]
    disk, disk_cap = run_disk_usage(layout.root)
    return {
        "memory_peak_bytes": peak,
        "memory_cap_bytes": run.memory_cap,
        "cpu_s": cpu_s,
        "disk_bytes": disk,
        "disk_cap_bytes": disk_cap,
        "watchdog": watch,
    }


@dataclass(frozen=True, slots=True)
class TopRow:
    """One line of `corral top`: the run itself ('run') or one of its environments."""

    run: str
    env: str
    memory_bytes: int
    peak_bytes: int | None
    cap_bytes: int | None
    cpu_percent: float
    pids: int
    pressure_some_avg10: float | None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "env": self.env,
            "memory_bytes": self.memory_bytes,
            "memory_peak_bytes": self.peak_bytes,
            "memory_cap_bytes": self.cap_bytes,
            "cpu_percent": round(self.cpu_percent, 1),
            "pids": self.pids,
            "psi_memory_some_avg10": self.pressure_some_avg10,
            "disk_bytes": None,
        }


def _env_cgroups(cg: RunCgroup) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"run": [cg.relpath]}
    for rel in cg.descendants():
        name = rel.rsplit("/", 1)[-1]
        if rel.count("/") != cg.relpath.count("/") + 1:
            continue
        env = "helpers" if name == "helpers" else name.split("-", 1)[0]
        out.setdefault(env, []).append(rel)
    return out


def top_rows(layouts: list[RunLayout], interval_s: float = 0.5) -> list[TopRow]:
    """Two samples `interval_s` apart of every live run; CPU % is their difference."""
    live: list[tuple[RunLayout, RunCgroup, RunRecord, Sample]] = []
    for layout in layouts:
        cg = RunCgroup.detect(layout.run_id)
        if cg is None or not cg.exists():
            continue
        with Store(layout.state, readonly=True) as store:
            run = store.run()
        live.append((layout, cg, run, take_sample(cg, pressure_source(cg))))
    if not live:
        return []
    time.sleep(interval_s)
    rows: list[TopRow] = []
    for _layout, cg, run, first in live:
        second = take_sample(cg, pressure_source(cg))
        dt = max(second.mono - first.mono, 1e-6)
        psi = second.pressure.get("some avg10")
        groups = _env_cgroups(cg)
        for env, sample in second.envs.items():
            before = first.envs.get(env)
            cpu = 0.0 if before is None else (sample.cpu_s - before.cpu_s) / dt * 100
            rels = groups.get(env, [])
            pids = sum(len(Cgroup(cg.layout, r).pids()) for r in rels)
            if env == "run":
                pids = len(cg.pids())
            peak = (
                cg.cgroup.usage().peak_memory_bytes
                if env == "run"
                else max((Cgroup(cg.layout, r).usage().peak_memory_bytes for r in rels), default=0)
            )
            rows.append(
                TopRow(
                    run.id,
                    env,
                    sample.memory_bytes,
                    peak,
                    run.memory_cap if env == "run" else None,
                    max(cpu, 0.0),
                    pids,
                    psi if env == "run" else None,
                )
            )
    return rows
