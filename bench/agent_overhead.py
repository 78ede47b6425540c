"""What corral costs an agent run: Claude Code inside corral vs the same run on the host.

The run is the two-turn `scenarios/write-file.yaml` (one shell command, one
text reply) against the synthetic provider. Both sides go through
`corral.run.agent_run.run_agent` with the same launch (argv, config,
environment); "inside" adds the namespace sandbox, the broker and its routes
and journal, "bare" runs the CLI directly with a scratch HOME. Runs alternate
so that machine load hits both alike. Prints the median and p90 end-to-end
wall time of each and the ratio (target: inside <= 1.5x bare), plus where the
inside time goes (provider start, the session, the sandbox's own wall time).
"Inside" is measured twice, interleaved: with the per-user resident broker
(the default) and with a cold broker process per run (`CORRAL_BROKER=cold`).

    .venv/bin/python bench/agent_overhead.py [--runs 7] [--agent claude-code]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from corral.run.agent_run import AgentRun, run_agent

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "write-file.yaml"


def _once(
    agent: str, sandbox: bool, scratch: Path, i: int, tag: str = ""
) -> tuple[float, AgentRun]:
    ws = scratch / f"ws-{'in' if sandbox else 'bare'}{tag}-{i}"
    ws.mkdir()
    t0 = time.perf_counter()
    run = run_agent(
        agent,
        "Create hello.txt",
        workspace=ws,
        provider=f"synthetic:{SCENARIO}",
        sandbox=sandbox,
        timeout_s=120,
        state_dir=scratch / f"state-{'in' if sandbox else 'bare'}{tag}-{i}",
    )
    wall = time.perf_counter() - t0
    if run.result.status != "succeeded" or not (ws / "hello.txt").exists():
        raise SystemExit(f"{agent} run failed ({'inside' if sandbox else 'bare'}): {run.result}")
    return wall, run


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--agent", default="claude-code")
    args = parser.parse_args()
    bare: list[float] = []
    sides: dict[str, list[float]] = {"resident": [], "cold": []}
    parts: dict[str, dict[str, list[float]]] = {k: {} for k in sides}
    with tempfile.TemporaryDirectory(prefix="corral-bench-agent-") as tmp:
        scratch = Path(tmp)
        _once(args.agent, False, scratch, -1)  # warm the page cache (a 400 MB binary)
        os.environ["CORRAL_BROKER"] = "resident"
        _once(args.agent, True, scratch, -1)  # start the resident (the first run pays it)
        for i in range(args.runs):
            wall, _ = _once(args.agent, False, scratch, i)
            bare.append(wall)
            for side, walls in sides.items():
                os.environ["CORRAL_BROKER"] = side
                wall, run = _once(args.agent, True, scratch, i, side)
                walls.append(wall)
                for key, value in run.timings.items():
                    parts[side].setdefault(key, []).append(value)
                if run.sandbox is not None:
                    wall_s = float(run.sandbox.get("wall_s", 0.0))
                    parts[side].setdefault("sandbox wall_s", []).append(wall_s)
    med_bare = statistics.median(bare)
    print(f"{args.agent}, {SCENARIO.name}, {args.runs} runs each (end-to-end wall time)")
    print(f"  load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"  bare (no corral):   median {med_bare:.3f} s   p90 {_p90(bare):.3f} s")
    for side, walls in sides.items():
        med = statistics.median(walls)
        print(f"  inside, {side:8} broker: median {med:.3f} s   p90 {_p90(walls):.3f} s")
        for key, values in sorted(parts[side].items()):
            print(f"    {key:18} median {statistics.median(values):.3f} s")
        ratio = med / med_bare
        verdict = "ok" if ratio <= 1.5 else "ABOVE TARGET"
        print(f"    ratio inside/bare: {ratio:.2f}x  (target <= 1.5x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
