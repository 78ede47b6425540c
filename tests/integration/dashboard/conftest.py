"""A real `corral dashboard` process and a real Chromium (Playwright) looking at it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.run.conftest import _sweep_runs  # noqa: F401  (sweeps the runs' cgroups)

REPO = Path(__file__).resolve().parents[3]
# The committed screenshots in docs/img are refreshed only when asked for, so a test run
# leaves the working tree as it found it; otherwise they go to a scratch directory.
SHOTS = (
    REPO / "docs" / "img"
    if os.environ.get("CORRAL_SCREENSHOTS") == "1"
    else Path(tempfile.mkdtemp(prefix="corral-shots-"))
)


@dataclass(frozen=True)
class Dashboard:
    url: str
    origin: str
    port: int
    token: str
    proc: subprocess.Popen[str]


def start_dashboard(runs_dir: Path) -> Dashboard:
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "dashboard", "--port", "0", "--runs-dir", str(runs_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]{40,})", line)
    if m is None:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise AssertionError(f"dashboard printed {line!r}")
    port = int(m.group(1))
    return Dashboard(line, f"http://127.0.0.1:{port}", port, m.group(2), proc)


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Any]:
    """A factory: `dashboard(runs_dir)` starts one; all are stopped afterwards."""
    started: list[Dashboard] = []

    def _start(runs_dir: Path) -> Dashboard:
        d = start_dashboard(runs_dir)
        started.append(d)
        return d

    yield _start
    for d in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.proc.pid, signal.SIGTERM)
        try:
            d.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(d.proc.pid, signal.SIGKILL)
            d.proc.wait()
        if d.proc.stdout is not None:
            d.proc.stdout.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield b
        finally:
            b.close()


def until(page: Any, expression: str, timeout_s: float = 20.0) -> None:
    """Poll `expression` in the page (the CSP forbids the eval `wait_for_function` uses)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.evaluate(expression):
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"timed out waiting for {expression}")


def record_dialog(into: list[str]) -> Any:
    """A `dialog` handler that notes the message and dismisses the dialog."""

    def _on(dialog: Any) -> None:
        into.append(str(dialog.message))
        dialog.dismiss()

    return _on
