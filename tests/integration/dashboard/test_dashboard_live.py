"""The dashboard follows a real run (script agent, real sandboxes) while it is driven."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.dashboard.conftest import SHOTS, record_dialog, until
from tests.integration.run.helpers import new_id, sessions, start_corral, wait_for, write_mission

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_chromium,
    pytest.mark.slow,
    pytest.mark.timeout(150),
]


def test_run_page_updates_live(tmp_path: Path, dashboard: Any, browser: Any) -> None:
    mission = write_mission(tmp_path / "mission", agent_sleep=4, max_sessions=3)
    runs = tmp_path / "runs"
    rid = new_id()
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    try:
        d = dashboard(runs)
        run_dir = runs / rid
        wait_for(lambda: bool(sessions(run_dir)), 60, "session 1 to start")
        page = browser.new_context().new_page()
        dialogs: list[str] = []
        page.on("dialog", record_dialog(dialogs))
        page.goto(d.url)
        assert rid in page.locator("#runs").inner_text()
        page.goto(f"{d.origin}/run/{rid}")
        first_state = page.locator("#run-state").inner_text()
        assert first_state == "running", first_state
        # Only the event stream can change these: the page is not reloaded.
        until(page, "document.getElementById('run-state').textContent === 'passed'", 120)
        until(page, "document.querySelectorAll('#journal-rows tr.live').length > 0")
        assert int(page.evaluate("document.getElementById('live').dataset.updates")) >= 2
        assert page.locator("#run-checks").inner_text() == "2/2"
        assert proc.wait(timeout=30) == 0
        page.reload()
        assert page.locator("#sessions tbody tr").count() == 2
        assert "fixed" in page.inner_text("#diff-text")
        assert page.locator(".check-output").count() >= 2
        assert dialogs == []
        page.screenshot(path=str(SHOTS / "dashboard-run.png"), full_page=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
