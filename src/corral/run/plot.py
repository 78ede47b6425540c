"""`footprint.svg`: memory and CPU over time per environment, from the watchdog's samples.

matplotlib is imported here only, when a report is rendered (never on
`corral exec`'s path), with the Agg backend: no display is touched. The
samples are the coordinator's own file (`footprint.jsonl`); environment names
are matched from corral's own cgroup names. Disk is not sampled yet, so it is
not drawn.
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
    fig, (ax_mem, ax_cpu) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
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
        ax_cpu.set_xlabel("seconds since the run started")
        ax_mem.set_title("run footprint (kernel counters, watchdog samples; disk not sampled)")
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
    return "\n## Footprint\n\n![memory and CPU per environment](footprint.svg)\n"
