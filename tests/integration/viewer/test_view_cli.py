"""`corral view RUN`: serves the product of a run's snapshot; SIGTERM leaves nothing."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from corral.run.coordinator import create_run
from corral.run.mission import load_mission
from corral.run.runcg import RunCgroup
from tests.integration.run.helpers import new_id
from tests.integration.viewer.conftest import PRODUCT

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_chromium]

REPO = Path(__file__).parents[3]
_CORRAL = (sys.executable, "-m", "corral")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_view_serves_a_snapshot_and_sigterm_leaves_no_process(tmp_path: Path) -> None:
    mission = load_mission(REPO / "examples" / "todo-api" / "MISSION.md")
    runs = tmp_path / "runs"
    layout = create_run(mission, runs, run_id=new_id())
    snap = layout.snapshot(1)
    snap.mkdir(parents=True)
    shutil.copy(PRODUCT / "server.py", snap / "server.py")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [*_CORRAL, "view", layout.run_id, "--runs-dir", str(runs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "&token=" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.rsplit(" ", 1)[1].strip()
        base = url.split("/viewer", 1)[0]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/viewer", timeout=5)
        info.value.close()
        assert info.value.code == 403
        # The token URL answers with the cookie and a redirect to the page.
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(url, timeout=5) as resp:
            assert resp.status == 200 and b"/viewer/static/viewer.js" in resp.read()
            # The token left the address bar; the page is the viewer of this run.
            assert resp.url == f"{base}/viewer?run={layout.run_id}"
        # It is the dashboard: the run's page links its viewer, under the same cookie.
        with opener.open(f"{base}/run/{layout.run_id}", timeout=5) as resp:
            assert f'href="/viewer?run={layout.run_id}"'.encode() in resp.read()
        with pytest.raises(urllib.error.HTTPError) as info:
            opener.open(f"{base}/viewer?run=other", timeout=5)
        info.value.close()
        assert info.value.code == 404
        cg = RunCgroup.detect(layout.run_id)
        assert cg is not None
        pids = cg.pids()
        # The product and the viewer's Chromium (many processes) run in the run's cgroup.
        assert len(pids) >= 3, pids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]
    assert not cg.exists()
    # Every connection the viewer made to the product was journaled.
    db = sqlite3.connect(layout.journal)
    try:
        q = "select count(*) from observations where rule = 'product-port' and env = 'verifier'"
        (count,) = db.execute(q).fetchone()
    finally:
        db.close()
    assert count >= 1
