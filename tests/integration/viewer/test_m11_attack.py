"""M11: a hostile product seen through the viewer never reaches the host browser.

The product's page tries to contact a canary the test listens on at the host's
loopback (img, fetch, WebSocket), sets a cookie, opens a popup and embeds its
secret. Through the viewer, the host browser must load only the viewer's
origin, never receive the secret, never contact the canary, gain no product
cookie or popup, and still show the product (its colour in the frame). The
control opens the same product directly in the host browser (what having no
viewer isolation means): there every one of those happens.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.viewer.conftest import PRODUCT, free_port, start_view
from tests.integration.viewer.test_viewer import _frames, _near, _pixel, _wait

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_chromium]


class Canary:
    """A TCP listener on the host's loopback that records every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.hits = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    c = Canary()
    yield c
    c.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _open(browser: Any, url: str) -> tuple[Any, Any, list[str], list[Any]]:
    ctx = browser.new_context(viewport={"width": 1800, "height": 1000})
    pg = ctx.new_page()
    urls: list[str] = []
    responses: list[Any] = []
    ctx.on("request", lambda r: urls.append(r.url))
    # Playwright cannot wrap a builtin method as a handler.
    ctx.on("response", lambda r: responses.append(r))  # noqa: PLW0108
    pg.goto(url)
    return ctx, pg, urls, responses


def _bodies(pg: Any, responses: list[Any]) -> list[bytes]:
    """Every response body the host browser received (read outside the event
    handlers: the sync API cannot be re-entered from one)."""
    pg.wait_for_timeout(300)  # lets Playwright deliver pending events
    out = []
    for r in list(responses):
        # Redirects and aborted loads have no body.
        with contextlib.suppress(Exception):
            out.append(r.body())
    return out


def test_hostile_product_through_the_viewer(browser: Any, canary: Canary) -> None:
    secret = "corral-secret-" + secrets.token_hex(8)
    env = {"CANARY_PORT": str(canary.port), "PRODUCT_SECRET": secret}
    with start_view("attack.py", env, "/") as view:
        ctx, pg, urls, responses = _open(browser, view.url)
        try:
            assert _wait(lambda: _frames(pg) > 0, 20.0)
            # The product is shown: its background colour is in the frame.
            assert _wait(lambda: _near(_pixel(pg, 900, 600), (0x10, 0xD0, 0x70)))
            time.sleep(1.0)  # the product's script had its chance
            assert canary.hits == 0
            assert all(u.startswith(view.origin + "/") for u in urls), urls
            bodies = _bodies(pg, responses)
            assert len(bodies) >= 3  # the page, its script and style at least
            assert not any(secret.encode() in b for b in bodies)
            assert [c["name"] for c in ctx.cookies()] == ["corral_dash"]
            assert len(ctx.pages) == 1
        finally:
            ctx.close()


def test_control_the_same_product_opened_directly_attacks_the_host(
    browser: Any, canary: Canary
) -> None:
    secret = "corral-secret-" + secrets.token_hex(8)
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "CANARY_PORT": str(canary.port),
        "PRODUCT_SECRET": secret,
    }
    proc = subprocess.Popen([sys.executable, str(PRODUCT / "attack.py")], env=env)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        ctx, pg, urls, responses = _open(browser, f"http://127.0.0.1:{port}/")
        try:
            assert _wait(lambda: canary.hits > 0, 10.0)
            assert any(secret.encode() in b for b in _bodies(pg, responses))
            assert any(f":{port}/" in u for u in urls)
            assert "product" in [c["name"] for c in ctx.cookies()]
        finally:
            ctx.close()
    finally:
        proc.kill()
        proc.wait()
