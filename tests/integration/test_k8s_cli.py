"""`corral k8s render` as a user runs it: YAML on stdout; bad input is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_cli_render_and_refusals() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    mission = str(ROOT / "examples" / "todo-cli" / "MISSION.md")
    ok = subprocess.run(
        [sys.executable, "-m", "corral", "k8s", "render", mission, "--runtime-class", "kata"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    docs = list(yaml.safe_load_all(ok.stdout))
    assert {p["spec"]["runtimeClassName"] for p in docs if p["kind"] == "Pod"} == {"kata"}
    for args in (["--runtime-class", "runc"], ["--broker-ip", "not-an-ip"]):
        bad = subprocess.run(
            [sys.executable, "-m", "corral", "k8s", "render", mission, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
        assert bad.returncode == 2 and bad.stdout == ""
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
