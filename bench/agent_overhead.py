"""What corral costs an agent run: Claude Code and Codex inside corral vs the same run on the host.

The run is the two-turn `scenarios/write-file.yaml` (one shell command, one
text reply) against the synthetic provider. Both sides go through
`corral.run.agent_run.run_agent` with the same launch (argv, config,
environment); "inside" adds the namespace sandbox, the broker and its routes
and journal, "bare" runs the CLI directly with a scratch HOME. Each round runs
every agent bare, inside with the per-user resident broker (the default) and
inside with a cold broker process (`CORRAL_BROKER=cold`), interleaved, so that
machine load hits all sides alike.

Wall time on a loaded host is mostly the scheduler's: a sandbox's cgroup
competes with the host's other sandboxes (`corral/*`) as their sibling, while
a bare CLI in the root cgroup competes with all of them as one group. So a
fourth side, "bare-sib", runs the bare CLI in a fresh cgroup beside the
sandboxes' (v1 `cpu`, or v2 with the cpu controller; skipped without one),
scheduled as a sandbox is; and the ratios are printed by CPU time as well:

- CLI CPU: user + system of everything the CLI ran: bare, this process's
  waited children (`RUSAGE_CHILDREN`); inside, the sandbox cgroup's count.
- total CPU: the CLI's, plus corral's host side: this process (the session,
  the journal; the synthetic provider's thread on both sides), its waited
  children (a cold broker) and the resident broker's own CPU over the run
  (`/proc/PID/stat`).

    .venv/bin/python bench/agent_overhead.py [--runs 7] [--agent claude-code,codex]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from corral.broker.resident import resident_socket
from corral.run.agent_run import AgentRun, run_agent

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "write-file.yaml"
SIDES = ("bare", "bare-sib", "resident", "cold")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Sample:
    wall: float
    cli_cpu: float
    total_cpu: float
    parts: dict[str, float]


def _resident_cpu() -> tuple[int, float] | None:
    """(pid, user + system seconds) of the resident broker this corral attaches to."""
    sock = str(resident_socket())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            if b"resident" not in argv or os.fsencode(sock) not in argv:
                continue
            with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return int(entry), (int(fields[11]) + int(fields[12])) / _TICK
    return None


class Sibling:
    """A cpu cgroup beside the sandboxes' that this process joins for the bare-sib runs."""

    def __init__(self) -> None:
        from corral.sandbox.cgroup import detect_layout

        layout = detect_layout()
        mount = None
        if layout is not None:
            mount = layout.v1_mount("cpu") if layout.kind == "v1" else layout.unified
        self.dir: str | None = None
        self.home: str | None = None
        if layout is None or mount is None or os.geteuid() != 0:
            return
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            for line in fh:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if ("cpu" in ctrls.split(",")) if layout.kind == "v1" else ctrls == "":
                    self.home = os.path.join(mount, path.lstrip("/"))
        parent = os.path.join(mount, "corral")
        if self.home is None or not os.path.isdir(parent):
            return
        self.dir = os.path.join(parent, f"bench-{os.getpid()}")
        os.mkdir(self.dir)

    def _join(self, directory: str) -> None:
        with open(os.path.join(directory, "cgroup.procs"), "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))

    def __enter__(self) -> None:
        assert self.dir is not None
        self._join(self.dir)

    def __exit__(self, *exc: object) -> None:
        assert self.home is not None
        self._join(self.home)

    def close(self) -> None:
        if self.dir is not None:
            os.rmdir(self.dir)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _once(agent: str, side: str, scratch: Path, i: int) -> tuple[Sample, AgentRun]:
    tag = f"{agent}-{side}-{i}"
    ws = scratch / f"ws-{tag}"
    ws.mkdir()
    sandbox = not side.startswith("bare")
    if sandbox:
        os.environ["CORRAL_BROKER"] = side
    res0 = _resident_cpu()
    self0, kids0 = time.process_time(), _children_cpu()
    t0 = time.perf_counter()
    run = run_agent(
        agent,
        "Create hello.txt",
        workspace=ws,
        provider=f"synthetic:{SCENARIO}",
        sandbox=sandbox,
        timeout_s=120,
        state_dir=scratch / f"state-{tag}",
    )
    wall = time.perf_counter() - t0
    host = time.process_time() - self0
    kids = _children_cpu() - kids0
    if run.result.status != "succeeded" or not (ws / "hello.txt").exists():
        raise SystemExit(f"{agent} run failed ({side}): {run.result}")
    parts = dict(run.timings)
    if run.sandbox is None:
        cli, total = kids, kids + host
    else:
        cli = float(run.sandbox.get("cpu_s", 0.0))
        parts["sandbox wall_s"] = float(run.sandbox.get("wall_s", 0.0))
        res1 = _resident_cpu()
        broker = 0.0
        if side == "resident" and res1 is not None:
            broker = res1[1] - (res0[1] if res0 is not None and res0[0] == res1[0] else 0.0)
        parts["broker cpu_s"] = broker
        # A cold broker is a waited child; bwrap's count of the sandbox is the
        # cgroup's already (its children are not waited through this process).
        total = cli + host + kids + broker
    parts["host cpu_s"] = host
    return Sample(wall, cli, total, parts), run


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _median(samples: list[Sample], key: str) -> float:
    return float(statistics.median(float(getattr(s, key)) for s in samples))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--agent", default="claude-code,codex", help="comma-separated")
    args = parser.parse_args()
    agents = [a for a in args.agent.split(",") if a]
    got: dict[tuple[str, str], list[Sample]] = {(a, s): [] for a in agents for s in SIDES}
    load0 = os.getloadavg()[0]
    sibling = Sibling()
    sides = [s for s in SIDES if s != "bare-sib" or sibling.dir is not None]
    try:
        with tempfile.TemporaryDirectory(prefix="corral-bench-agent-") as tmp:
            scratch = Path(tmp)
            for agent in agents:
                # Warm the page cache (binaries of 100-400 MB) and start the resident.
                _once(agent, "bare", scratch, -1)
                _once(agent, "resident", scratch, -1)
            for i in range(args.runs):
                for agent in agents:
                    for side in sides:
                        if side == "bare-sib":
                            with sibling:
                                sample, _ = _once(agent, side, scratch, i)
                        else:
                            sample, _ = _once(agent, side, scratch, i)
                        got[(agent, side)].append(sample)
    finally:
        sibling.close()
    if sibling.dir is None:
        print("  (no bare-sib side: needs root and a cpu cgroup hierarchy with corral/ in it)")
    print(f"{SCENARIO.name}, {args.runs} interleaved rounds")
    print(
        f"  load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}"
    )
    for agent in agents:
        bare = got[(agent, "bare")]
        sib = got.get((agent, "bare-sib")) or []
        print(f"{agent}:")
        print(
            f"  {'side':9} {'wall med':>9} {'p90':>7} {'CLI CPU':>8} {'total CPU':>10}"
            "   ratios (wall / CLI CPU / total CPU) to bare; to bare-sib"
        )
        for side in sides:
            samples = got[(agent, side)]
            walls = [s.wall for s in samples]
            line = (
                f"  {side:9} {_median(samples, 'wall'):8.3f}s {_p90(walls):6.3f}s"
                f" {_median(samples, 'cli_cpu'):7.3f}s {_median(samples, 'total_cpu'):9.3f}s"
            )
            if side == "bare-sib":
                line += "   (the bare CLI, scheduled where a sandbox is)"
            elif side != "bare":
                ratios = [
                    _median(samples, k) / _median(bare, k) for k in ("wall", "cli_cpu", "total_cpu")
                ]
                line += "   " + " / ".join(f"{r:.2f}x" for r in ratios)
                if sib:
                    to_sib = [
                        _median(samples, k) / _median(sib, k)
                        for k in ("wall", "cli_cpu", "total_cpu")
                    ]
                    line += "; " + " / ".join(f"{r:.2f}x" for r in to_sib)
                verdict = "ok" if ratios[2] <= 1.5 else "ABOVE TARGET"
                line += f"  (total CPU <= 1.5x: {verdict})"
            print(line)
        for side in sides:
            keys = sorted({k for s in got[(agent, side)] for k in s.parts})
            medians = [
                f"{k} {statistics.median(s.parts.get(k, 0.0) for s in got[(agent, side)]):.3f}"
                for k in keys
            ]
            print(f"    {side}: " + ", ".join(medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
