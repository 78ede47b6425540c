"""The viewer shows the product through pixels only, and input reaches it.

A host-side Chromium (Playwright, Debian's binary) opens the viewer page;
every assertion is on what the host browser loaded or on the product's state
read through the product's own loopback.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.viewer.conftest import RunningView

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_chromium]

# Committed screenshots are refreshed only when asked for (as in the dashboard tests).
DOCS_IMG = (
    Path(__file__).parents[3] / "docs" / "img" / "viewer.png"
    if os.environ.get("CORRAL_SCREENSHOTS") == "1"
    else Path(tempfile.mkdtemp(prefix="corral-shots-")) / "viewer.png"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(browser: Any, running_view: RunningView) -> Iterator[tuple[Any, list[str]]]:
    ctx = browser.new_context(viewport={"width": 1800, "height": 1000})
    pg = ctx.new_page()
    requests: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(running_view.url)
    # Polled from Python: the page's CSP (no eval) refuses wait_for_function's predicate.
    assert _wait(lambda: _frames(pg) > 0, 20.0)
    yield pg, requests
    ctx.close()


def _frames(pg: Any) -> int:
    return int(pg.evaluate("() => window.corralViewer ? window.corralViewer.frames : 0"))


def _pixel(pg: Any, x: int, y: int) -> tuple[int, int, int]:
    rgb = pg.evaluate(
        "([x, y]) => Array.from(document.getElementById('screen')"
        ".getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3))",
        [x, y],
    )
    return (rgb[0], rgb[1], rgb[2])


def _near(a: tuple[int, int, int], b: tuple[int, int, int], tol: int = 40) -> bool:
    return all(abs(p - q) <= tol for p, q in zip(a, b, strict=True))


def _wait(pred: Any, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_shows_the_product_and_loads_only_the_viewer_origin(
    page: tuple[Any, list[str]], running_view: RunningView
) -> None:
    pg, requests = page
    # The product's background (#2060c0) is in the frame's pixels.
    assert _wait(lambda: _near(_pixel(pg, 1000, 600), (0x20, 0x60, 0xC0)))
    # The product's page went through the journaled forward, not the host browser.
    assert running_view.forwards
    assert requests
    assert all(u.startswith(running_view.origin + "/") for u in requests), requests
    assert not any(":8000" in u for u in requests)


def test_click_in_the_canvas_toggles_a_todo(
    page: tuple[Any, list[str]], running_view: RunningView
) -> None:
    pg, _ = page
    before = json.loads(running_view.product_get("/todos"))
    assert before[0]["done"] is False
    # The first todo is a 600x50 box at (20, 100) in the product's page.
    assert _wait(lambda: _near(_pixel(pg, 300, 125), (0xC0, 0x20, 0x20)))
    pg.locator("#screen").click(position={"x": 300, "y": 125})
    assert _wait(lambda: json.loads(running_view.product_get("/todos"))[0]["done"] is True)
    # ...and the view shows it (the box turns green).
    assert _wait(lambda: _near(_pixel(pg, 300, 125), (0x20, 0xC0, 0x40)))


def test_typing_reaches_an_input(page: tuple[Any, list[str]], running_view: RunningView) -> None:
    pg, _ = page
    pg.locator("#screen").click(position={"x": 200, "y": 40})
    pg.keyboard.type("hello viewer")
    pg.keyboard.press("Enter")

    def titles() -> list[str]:
        return [t["title"] for t in json.loads(running_view.product_get("/todos"))]

    assert _wait(lambda: "hello viewer" in titles()), titles()


def test_console_from_before_connect_is_shown_as_text(page: tuple[Any, list[str]]) -> None:
    pg, _ = page
    marker = "before-connect <img src=x onerror=alert(1)>"
    assert _wait(lambda: marker in pg.locator("#events").inner_text())
    # Shown as text: the product's markup made no element in corral's page.
    assert pg.locator("#events img").count() == 0
    DOCS_IMG.parent.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(DOCS_IMG))


def test_token_and_origin_are_required(running_view: RunningView) -> None:
    base = running_view.origin
    for path in ("/viewer", "/viewer/static/viewer.js", "/viewer/ws", "/nope"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + path, timeout=5)
        info.value.close()
        assert info.value.code == 403
        assert "default-src 'self'" in info.value.headers["Content-Security-Policy"]
        assert info.value.headers["X-Content-Type-Options"] == "nosniff"
    cookie = f"corral_dash={running_view.token}"
    # The dashboard's gate covers the viewer's WebSocket: a foreign Origin with
    # the cookie, and the page's own Origin without it, are both refused.
    for headers in (
        {"Cookie": cookie, "Origin": "http://evil.example"},
        {"Origin": running_view.origin},
        {"Cookie": cookie},
    ):
        assert _ws_handshake(base, headers) == 403, headers
    # The control: the same handshake with both is let through.
    assert _ws_handshake(base, {"Cookie": cookie, "Origin": running_view.origin}) == 101


def _ws_handshake(base: str, headers: dict[str, str]) -> int:
    import http.client

    host = base.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=5)
    try:
        conn.request(
            "GET",
            "/viewer/ws",
            headers={
                "Host": host,
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                **headers,
            },
        )
        resp = conn.getresponse()
        if resp.status == 403:
            assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        return resp.status
    finally:
        conn.close()


def test_the_viewer_is_served_by_the_dashboard(page: tuple[Any, list[str]]) -> None:
    pg, _ = page
    # The dashboard's own runs page is on the same origin, behind the same cookie.
    resp = pg.request.get(pg.url.split("/viewer", 1)[0] + "/")
    assert resp.status == 200 and "<h1>Runs</h1>" in resp.text()
    assert resp.headers["x-content-type-options"] == "nosniff"
