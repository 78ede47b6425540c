"""`footprint.svg`: memory, CPU and disk over time per environment, from the watchdog's samples.

matplotlib is imported here only, when a report is rendered (never on
`corral exec`'s path), with the Agg backend: no display is touched. The
samples are the coordinator's own file (`footprint.jsonl`); environment names
are matched from corral's own cgroup names. Disk (the run's `run_disk` image,
its size drawn as the cap) gets a third panel when the samples have it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.run.watchdog import Sample, read_samples

__all__ = ["footprint_section", "render_svg"]

_MiB = 1 << 20


def _series(samples: Sequence[Sample]) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """env → (seconds since the first sample, MiB, CPU % since the previous sample)."""
    t0 = samples[0].mono
    out: dict[str, tuple[list[float], list[float], list[float]]] = {}
    prev: dict[str, tuple[float, float]] = {}
    for s in samples:
        for env, u in s.envs.items():
            ts, mem, cpu = out.setdefault(env, ([], [], []))
            ts.append(s.mono - t0)
            mem.append(u.memory_bytes / _MiB)
            last = prev.get(env)
            dt = s.mono - last[0] if last else 0.0
            cpu.append(max(0.0, (u.cpu_s - last[1]) / dt * 100) if last and dt > 0 else 0.0)
            prev[env] = (s.mono, u.cpu_s)
    return out


def render_svg(samples: Sequence[Sample], caps: Mapping[str, int | None], dest: Path) -> None:
    """Draw memory (with each cap) and CPU % per environment into `dest`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(samples)
    disk = [(s.mono - samples[0].mono, s.disk_bytes, s.disk_cap_bytes) for s in samples]
    disk = [d for d in disk if d[1] is not None]
    fig, axes = plt.subplots(3 if disk else 2, 1, figsize=(8, 8 if disk else 6), sharex=True)
    ax_mem, ax_cpu = axes[0], axes[1]
    try:
        for env, (ts, mem, cpu) in sorted(series.items()):
            (line,) = ax_mem.plot(ts, mem, label=env)
            cap = caps.get(env)
            if cap is not None:
                ax_mem.axhline(
                    cap / _MiB, color=line.get_color(), linestyle="--", label=f"{env} cap"
                )
            ax_cpu.plot(ts, cpu, label=env)
        ax_mem.set_ylabel("memory (MiB)")
        ax_mem.legend(fontsize="small", loc="upper left")
        ax_cpu.set_ylabel("CPU (% of one core)")
        if disk:
            ax_disk = axes[2]
            (line,) = ax_disk.plot(
                [d[0] for d in disk], [(d[1] or 0) / _MiB for d in disk], label="run disk"
            )
            cap = disk[-1][2]
            if cap:
                ax_disk.axhline(
                    cap / _MiB, color=line.get_color(), linestyle="--", label="disk cap"
                )
            ax_disk.set_ylabel("disk (MiB)")
            ax_disk.legend(fontsize="small", loc="upper left")
        axes[-1].set_xlabel("seconds since the run started")
        ax_mem.set_title("run footprint (kernel counters, watchdog samples)")
        fig.tight_layout()
        tmp = dest.with_suffix(".tmp.svg")
        fig.savefig(tmp, format="svg")
        tmp.replace(dest)
    finally:
        plt.close(fig)


def footprint_section(run_dir: Path, caps: Mapping[str, int | None]) -> str:
    """Render `footprint.svg` and return the report's lines linking it ('' without samples)."""
    samples = read_samples(run_dir / "footprint.jsonl")
    if len(samples) < 2:
        return ""
    render_svg(samples, caps, run_dir / "footprint.svg")
    what = (
        "memory, CPU and disk"
        if any(s.disk_bytes is not None for s in samples)
        else ("memory and CPU")
    )
    return f"\n## Footprint\n\n![{what} per environment](footprint.svg)\n"
