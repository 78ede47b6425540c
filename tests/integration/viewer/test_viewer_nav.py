"""Resize and off-origin navigation in the viewer, judged from the frames and the host.

Resize: the host browser's window shrinks; the page sends a resize, corral
calls `Emulation.setDeviceMetricsOverride` and the frames come at the new
size (the canvas takes each frame's size).

Off-origin: the product's page (product/offorigin.py) links to a host canary
and assigns `location =` to it, and the address bar is given the canary's
URL. Each time the viewer sends the page back to the product: the frame shows
the product's colours again, the host browser stays on the viewer's page and
loads only the dashboard's origin, and the canary gets no connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.viewer.conftest import TODO_UI, RunningView, start_view
from tests.integration.viewer.test_m11_attack import Canary
from tests.integration.viewer.test_viewer import _frames, _near, _pixel, _wait

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_chromium]

BLUE = (0x30, 0x70, 0xA0)
ORANGE = (0xE0, 0xA0, 0x00)
PRODUCT = "http://127.0.0.1:8000/"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _open(browser: Any, view: RunningView) -> tuple[Any, list[str]]:
    pg = browser.new_context(viewport={"width": 1800, "height": 1000}).new_page()
    requests: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(view.url)
    assert _wait(lambda: _frames(pg) > 0, 20.0)
    return pg, requests


def _canvas_size(pg: Any) -> tuple[int, int]:
    w, h = pg.evaluate(
        "() => { const c = document.getElementById('screen'); return [c.width, c.height]; }"
    )
    return int(w), int(h)


def test_resizing_the_window_resizes_the_frames(browser: Any) -> None:
    with start_view("server.py", {}, "/health", TODO_UI) as view:
        pg, _ = _open(browser, view)
        assert _canvas_size(pg) == (1280, 800)
        pg.set_viewport_size({"width": 1200, "height": 700})
        # The page asks for min(75vw, width - 220) x (height - header - 12).
        assert _wait(lambda: _canvas_size(pg)[0] == 900, 15.0), _canvas_size(pg)
        w, h = _canvas_size(pg)
        assert 600 <= h <= 660, (w, h)
        # Frames keep coming at that size (the screencast was restarted with it).
        seen = _frames(pg)
        pg.locator("#screen").click(position={"x": 60, "y": 92})
        pg.keyboard.type("x")
        assert _wait(lambda: _frames(pg) > seen, 10.0)
        assert _canvas_size(pg) == (w, h)
        pg.context.close()


def _events(pg: Any) -> str:
    return str(pg.locator("#events").inner_text())


def test_off_origin_navigation_is_sent_back_to_the_product(browser: Any) -> None:
    canary = Canary()
    away = f"http://127.0.0.1:{canary.port}"
    try:
        with start_view("offorigin.py", {"CANARY_URL": away}, "/health") as view:
            pg, requests = _open(browser, view)
            assert _wait(lambda: _near(_pixel(pg, 900, 600), BLUE))
            assert _near(_pixel(pg, 300, 150), ORANGE)
            viewer_url = pg.url

            def home() -> bool:
                return _near(_pixel(pg, 900, 600), BLUE) and _near(_pixel(pg, 300, 150), ORANGE)

            def back_home() -> None:
                # Chromium's error page for the refused connection came, then the product.
                assert _wait(lambda: _events(pg).rstrip().endswith("[navigated] " + PRODUCT), 15.0)
                assert _wait(home, 15.0)

            # A link in the product's page, clicked in the canvas.
            pg.locator("#screen").click(position={"x": 300, "y": 150})
            assert _wait(lambda: f"{away}/link" in _events(pg)), _events(pg)
            back_home()
            # `location =` from the product's script.
            pg.fill("#path", "/go")
            pg.press("#path", "Enter")
            assert _wait(lambda: f"{away}/location" in _events(pg)), _events(pg)
            back_home()
            # The address bar given the other origin: refused (it takes a path only).
            before = _events(pg)
            pg.fill("#path", f"{away}/addr")
            pg.press("#path", "Enter")
            pg.wait_for_timeout(1000)
            new = _events(pg)[len(before) :].strip()
            assert new == "[refused] the address must be a path on the product (/...)", new
            assert home()
            assert pg.url == viewer_url
            assert all(u.startswith(view.origin + "/") for u in requests), requests
            pg.context.close()
    finally:
        canary.close()
    assert canary.hits == 0
