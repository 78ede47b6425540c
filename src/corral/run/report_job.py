"""Write a run's `report.md` and `footprint.svg` from its directory (run in the report helper).

Everything is read back from the run's own durable state (store, journal,
samples), so the helper needs only the run directory, and the memory that
rendering costs (matplotlib, the samples) is charged to the run's cgroup.
"""

from __future__ import annotations

from corral.broker.journal import decision_counts
from corral.run.coordinator import load_run
from corral.run.environments import RunLayout
from corral.run.report import render_detail, render_report
from corral.run.rundetail import run_detail
from corral.run.store import Store

__all__ = ["write_report"]


def _footprint_section(layout: RunLayout, caps: dict[str, int | None]) -> str:
    from corral.run.plot import footprint_section

    try:
        return footprint_section(layout.root, caps)
    except (ImportError, OSError, ValueError) as exc:
        return f"\n(footprint plot not rendered: {type(exc).__name__})\n"


def write_report(layout: RunLayout) -> None:
    """Render and atomically replace `report.md` of the run at `layout`."""
    mission, _ = load_run(layout)
    with Store(layout.state, readonly=True) as store:
        sessions = store.sessions()
        run = store.run()
        checks = {s.n: store.checks(s.n) for s in sessions}
    allowed, denied = decision_counts(layout.journal, layout.run_id)
    text = render_report(
        mission, run, sessions, checks, allowed=allowed, denied=denied, run_dir=str(layout.root)
    )
    last = next((checks[s.n] for s in reversed(sessions) if checks[s.n]), [])
    text += render_detail(run_detail(layout.journal, layout.run_id, last))
    lim = mission.settings.limits
    text += _footprint_section(
        layout,
        {
            "run": lim.run_memory,
            "agent": lim.agent.memory,
            "product": lim.product.memory,
            "verifier": lim.verifier.memory,
        },
    )
    tmp = layout.report.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(layout.report)
