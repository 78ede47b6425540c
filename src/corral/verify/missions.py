"""Mission probes: the files a `corral run` probe is made of, and readings of its run (pure).

A mission probe (`Probe.mission`) attacks or exercises corral's run
environments (agent, product, verifier) by running a whole, tiny `corral run`:
`agent = "script"` (the built-in test agent, which carries out the scenario's
tool calls inside the agent sandbox) and `provider = "synthetic:scenario.yaml"`.
Session 1's agent writes the probe's files into the workspace and runs the
probe's program there. The runner (the only part doing I/O) writes what this
module renders, runs `python -m corral run`, and hands the run directory's
contents to the oracles as facts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from corral.display import md
from corral.verify.model import MissionSpec

__all__ = [
    "PROBE_OUT",
    "PROBE_PY",
    "changed_files",
    "digests",
    "render_mission",
    "render_scenario",
    "report_results",
]

#: Workspace files of the probe's program and its output (read by the host, never followed).
PROBE_PY = ".corral-probe.py"
PROBE_OUT = ".corral-probe.out"

_HEAD = """+++
# corral verify: a mission probe ({probe_id})
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = {max_sessions}
checks_dir = "checks"

[session]
wall_time = "20s"

[limits]
run_memory = "1G"
agent = {{ memory = "256M", pids = 128 }}
product = {{ memory = "128M", pids = 64 }}
verifier = {{ memory = "128M", pids = 64 }}

"""

_BODY = """+++
# corral verify probe {probe_id}

Nothing to build: this mission exists so that `corral verify` can watch the
agent, product and verifier environments of a real run.
"""


def _fill(template: str, ctx: Mapping[str, Any]) -> str:
    return template.format_map(dict(ctx))


def render_mission(
    probe_id: str, spec: MissionSpec, ctx: Mapping[str, Any], backend: str = "namespace"
) -> str:
    """MISSION.md: the fixed head, the probe's `[product]`/`[[checks]]` tables, a body.

    `backend`: the isolation of every environment of the run (the mission's `backend`).
    """
    head = _HEAD.format(probe_id=probe_id, max_sessions=spec.max_sessions)
    if backend != "namespace":
        head = head.replace(
            'checks_dir = "checks"\n', f'checks_dir = "checks"\nbackend = "{backend}"\n', 1
        )
    if spec.verifier_limits is not None:
        head = head.replace(
            'verifier = { memory = "128M", pids = 64 }', f"verifier = {spec.verifier_limits}", 1
        )
    if spec.token_budget is not None:
        head = head.replace(
            "\n\n[session]", f"\ntoken_budget = {spec.token_budget}\n\n[session]", 1
        )
    return head + _fill(spec.front, ctx).strip() + "\n" + _BODY.format(probe_id=probe_id)


def _report_turn(spec: MissionSpec, ctx: Mapping[str, Any], marker: str) -> dict[str, Any]:
    turn: dict[str, Any] = {"label": "report", "say": _fill(spec.say, ctx)}
    if spec.agent_error is not None:
        # The script agent repeats a provider error's body in its own error
        # result, so this text leaves the agent sandbox on the agent's stdout,
        # the channel a hostile agent CLI writes its end reason to.
        body = spec.agent_error.replace("{marker}", marker)
        turn["fault"] = {"status": 500, "body": body}
    return turn


def render_scenario(spec: MissionSpec, ctx: Mapping[str, Any], *, program: str, marker: str) -> str:
    """scenario.yaml (as JSON, which YAML reads): session 1 writes the files and the
    program, runs the program with its output in `PROBE_OUT`, then says `say`; session 2
    (when `spec.next_files`) writes those files and says "done"."""
    writes = [
        {"write_file": {"path": _fill(path, ctx), "content": _fill(content, ctx)}}
        for path, content in spec.files
    ]
    writes.append({"write_file": {"path": PROBE_PY, "content": program}})
    run = f"/usr/bin/python3 -I -S {PROBE_PY} {marker} >{PROBE_OUT} 2>&1; true"
    conversations: list[dict[str, Any]] = [
        {
            "prompt": "(?m)^Session 1 of",
            "turns": [
                {"label": "write", "calls": writes},
                {"label": "probe", "calls": [{"shell": run}]},
                _report_turn(spec, ctx, marker),
            ],
        }
    ]
    if spec.next_files:
        later = [
            {"write_file": {"path": _fill(path, ctx), "content": _fill(content, ctx)}}
            for path, content in spec.next_files
        ]
        conversations.append(
            {
                "prompt": "(?m)^Session 2 of",
                "turns": [{"label": "write", "calls": later}, {"label": "report", "say": "done"}],
            }
        )
    scenario = {
        "name": "corral-verify",
        "turns": [{"say": "Nothing scripted for this prompt."}],
        "conversations": conversations,
    }
    return json.dumps(scenario, indent=1) + "\n"


def digests(files: Mapping[str, bytes]) -> dict[str, str]:
    """SHA-256 of each file's content, by relative path."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def changed_files(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Paths added, removed or whose digest differs ("+x", "-x", "~x"), sorted."""
    out = [f"+{n}" for n in actual if n not in expected]
    out += [f"-{n}" for n in expected if n not in actual]
    out += [f"~{n}" for n in expected if n in actual and actual[n] != expected[n]]
    return sorted(out, key=lambda s: (s[1:], s[0]))


_ROW = re.compile(r"^\|\s*(?P<name>.*?)\s*\|\s*(?P<result>pass|FAIL)\s*\|", re.MULTILINE)


def report_results(report: str, check: str) -> list[str]:
    """The result cells (`pass`/`FAIL`) report.md shows for check `check`, in order."""
    want = md(check, 200)  # as corral.run.report writes a check's name
    return [m.group("result") for m in _ROW.finditer(report) if m.group("name") == want]
