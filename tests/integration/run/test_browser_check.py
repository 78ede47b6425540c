"""`[[checks]] browser = ...`: a mission's Playwright script against the product, in the verifier.

End to end with the script test agent on examples/todo-ui: session 1's page
never shows the added to-do (the browser check fails and its reason says so),
session 2 fixes it (the check passes). The hostile variant: the agent plants a
`checks/test_ui.py`, a `playwright` package and a `sitecustomize.py` that
would pass the check, and its page tries to reach a host canary; the verdict
stays the mission script's and the canary is never contacted.
"""

from __future__ import annotations

import shutil
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import EXAMPLES, corral, new_id, run_cgroup

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_chromium,
    pytest.mark.timeout(120),
]

FAIL_LINE = "after clicking #add, the list #todos does not show 'buy milk'"


def _forwards(run_dir: Path) -> int:
    conn = sqlite3.connect(run_dir / "journal.sqlite")
    try:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM observations WHERE env='verifier' AND kind='net_connect'"
                " AND rule='product-port'"
            ).fetchone()[0]
        )
    finally:
        conn.close()


def test_todo_ui_browser_check_fails_then_passes(tmp_path: Path) -> None:
    rid = new_id()
    runs = tmp_path / "runs"
    mission = EXAMPLES / "todo-ui" / "MISSION.md"
    proc = corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = runs / rid
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        run = store.run()
        first = {c.name: c for c in store.checks(1)}
        second = {c.name: c for c in store.checks(2)}
    assert run.state == "passed"
    ui1, ui2 = first["add a todo in the page"], second["add a todo in the page"]
    # The failing variant: the verdict is the script's exit status, its reason its last line.
    assert not ui1.passed and ui1.exit == 1
    assert FAIL_LINE in ui1.reason, ui1.reason
    assert ui2.passed and "the server has it" in ui2.output
    from corral.display import md

    # The report shows the reason too (as escaped Markdown text).
    assert md(FAIL_LINE) in (run_dir / "report.md").read_text()
    # The browser reached the product only through the journaled forward.
    assert _forwards(run_dir) >= 4
    # Chromium ran in the verifier, charged to the run's cgroup (an agent that
    # writes one file and a stdlib server stay far below this).
    assert run.peak_memory > 150 << 20, run.peak_memory
    assert not run_cgroup(rid).exists()
    _dashboard_shows_the_reason(runs, rid)


def _dashboard_shows_the_reason(runs: Path, rid: str) -> None:
    """The failing browser check's reason on the run's dashboard page, as text (a screenshot)."""
    import os
    import signal

    from playwright.sync_api import sync_playwright

    from tests.integration.dashboard.conftest import SHOTS, start_dashboard

    d = start_dashboard(runs)
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            try:
                page = b.new_page(viewport={"width": 1280, "height": 900})
                page.goto(d.url)
                page.goto(f"{d.origin}/run/{rid}")
                first = page.locator("details.session").first
                first.locator("summary").click()
                failed = first.locator("table.checks tr.fail")
                assert FAIL_LINE in failed.inner_text()
                first.screenshot(path=str(SHOTS / "dashboard-browser-check.png"))
            finally:
                b.close()
    finally:
        os.killpg(d.proc.pid, signal.SIGTERM)
        d.proc.wait(10)
        if d.proc.stdout is not None:
            d.proc.stdout.close()


class _Canary:
    """A host TCP listener counting connections (the page's script aims at it)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()


@pytest.fixture
def canary() -> Iterator[_Canary]:
    c = _Canary()
    yield c
    c.sock.close()


_PLANTS = """
          - write_file:
              path: checks/test_ui.py
              content: "import sys; print('workspace check'); sys.exit(0)\\n"
          - write_file:
              path: playwright/__init__.py
              content: "import sys; print('workspace playwright'); sys.exit(0)\\n"
          - write_file:
              path: playwright/sync_api.py
              content: "import sys; sys.exit(0)\\n"
          - write_file:
              path: sitecustomize.py
              content: "import sys; sys.exit(0)\\n"
          - write_file:
              path: test_ui.py
              content: "import sys; sys.exit(0)\\n"
"""


def test_agent_files_cannot_replace_the_browser_check(tmp_path: Path, canary: _Canary) -> None:
    m = tmp_path / "m"
    shutil.copytree(EXAMPLES / "todo-ui", m)
    text = (m / "MISSION.md").read_text().replace("max_sessions = 3", "max_sessions = 1")
    (m / "MISSION.md").write_text(text)
    scen = (m / "scenario.yaml").read_text()
    # The page's script also tries to reach the host (the canary) from the verifier's browser.
    scen = scen.replace(
        "  // TODO: show the list",
        f'  fetch("http://127.0.0.1:{canary.port}/x", {{mode: "no-cors"}}).catch(() => 0);'
        "\n                  // TODO: show the list",
        1,
    )
    marker = "        calls:\n          - write_file:\n              path: server.py\n"
    assert marker in scen
    scen = scen.replace(
        marker,
        "        calls:" + _PLANTS + "          - write_file:\n              path: server.py\n",
        1,
    )
    (m / "scenario.yaml").write_text(scen)
    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run",
        str(m / "MISSION.md"),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=100,
    )
    run_dir = runs / rid
    # The plants are in the workspace the checks run against...
    snap = run_dir / "snapshots" / "session-1"
    assert (snap / "checks" / "test_ui.py").is_file() and (snap / "sitecustomize.py").is_file()
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        checks = {c.name: c for c in store.checks(1)}
    ui = checks["add a todo in the page"]
    # ...yet the verdict is the mission's script: it ran, with the real Playwright.
    assert not ui.passed and FAIL_LINE in ui.reason, (ui.reason, ui.output, proc.stdout)
    assert "workspace" not in ui.output
    assert proc.returncode != 0
    # The product's page ran in the verifier's Chromium and could not reach the host.
    assert canary.hits == 0
