"""A sparse file the agent leaves in the workspace never costs the host its apparent size.

The agent makes a 512 MiB sparse file (4 KiB on disk). Host git refuses it
from its size before reading it (the commit's size budget), the run fails
with that reason recorded, nothing of 512 MiB lands in `snapshots/`, and the
coordinator's own peak RSS (VmHWM, read host-side from /proc) stays small.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.run.helpers import corral, new_id, start_corral, write_mission

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.timeout(120),
]

COORDINATOR_LIMIT = 200 << 20


def _hwm(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def test_sparse_file_mission_fails_cleanly_and_the_host_never_pays(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m", max_sessions=1)
    scenario = tmp_path / "m" / "scenario.yaml"
    scenario.write_text(
        scenario.read_text().replace(
            "sleep 0; echo one > stage1", "truncate -s 512M sparse && echo one > stage1"
        )
    )
    rid = new_id()
    runs = tmp_path / "runs"
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    peak = 0
    while proc.poll() is None:
        # VmHWM is the kernel's high-water mark: the last value read is the peak so far.
        peak = max(peak, _hwm(proc.pid) or 0)
        time.sleep(0.05)
    assert peak < COORDINATOR_LIMIT, f"coordinator peaked at {peak >> 20} MiB"
    assert proc.returncode != 0
    status = corral("status", rid, "--json", "--runs-dir", str(runs), cwd=tmp_path)
    doc = json.loads(status.stdout)
    assert doc["state"] == "failed", doc
    assert "host-git budget" in json.dumps(doc), doc
    run_dir = runs / rid
    assert (run_dir / "workspace" / "sparse").stat().st_size == 512 << 20
    snaps = run_dir / "snapshots"
    files = [p for p in snaps.rglob("*") if p.is_file()] if snaps.exists() else []
    assert sum(p.stat().st_blocks * 512 for p in files) < 1 << 20
