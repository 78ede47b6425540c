"""JSON bombs posted from inside a real agent sandbox never cost the coordinator their parse.

The agent (in its sandbox, through the broker's provider route) posts a
12 MiB body, which passes the broker's limit and is refused by the
synthetic provider's before parsing, and a 24 MiB one, which the broker
refuses itself (journaled as rule `body-limit`). Both answer 413; the
coordinator's peak RSS (VmHWM, read host-side from /proc) stays small.
Unbounded, `json.loads` of such a body costs ~30x its size in objects.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from corral.broker.journal import read_rows
from tests.integration.run.helpers import new_id, start_corral, vm_hwm, write_mission

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.timeout(120),
]

COORDINATOR_LIMIT = 200 << 20

BOMB = """import os, urllib.error, urllib.request
url = os.environ["CORRAL_PROVIDER_URL"].rstrip("/") + "/v1/messages"
out = []
for mib in (12, 24):
    body = b'{"model":"m","max_tokens":8,"messages":[' + b"{}," * (mib << 18) + b"{}]}"
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        out.append(str(urllib.request.urlopen(req, timeout=60).status))
    except urllib.error.HTTPError as exc:
        out.append(str(exc.code))
    except OSError as exc:
        out.append("error:" + type(exc).__name__)
open("bomb-status", "w").write(" ".join(out))
"""

SCENARIO = """name: bomb
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{write_file: {path: bomb.py, content: BOMB_JSON}}]
      - calls: [{shell: "python3 bomb.py"}]
      - say: "done"
"""


def test_json_bombs_from_a_sandbox_get_413_and_the_coordinator_stays_small(
    tmp_path: Path,
) -> None:
    mission = write_mission(tmp_path / "m", max_sessions=1)
    (tmp_path / "m" / "scenario.yaml").write_text(SCENARIO.replace("BOMB_JSON", json.dumps(BOMB)))
    rid = new_id()
    runs = tmp_path / "runs"
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    peak = 0
    while proc.poll() is None:
        # VmHWM is the kernel's high-water mark: the last value read is the peak so far.
        peak = max(peak, vm_hwm(proc.pid))
        time.sleep(0.05)
    run_dir = runs / rid
    assert (run_dir / "workspace" / "bomb-status").read_text() == "413 413"
    assert peak < COORDINATOR_LIMIT, f"coordinator peaked at {peak >> 20} MiB"
    calls = read_rows(run_dir / "journal.sqlite", kind="provider_call")
    big = [r for r in calls if r.rule == "body-limit"]
    assert len(big) == 1 and big[0].decision == "deny", [(r.decision, r.rule) for r in calls]
    # The 12 MiB one was admitted by the broker and refused by the provider.
    assert any(r.outcome and r.outcome.get("status") == 413 for r in calls)
