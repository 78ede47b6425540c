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


def _open_page(browser: Any, view: RunningView) -> tuple[Any, list[str]]:
    ctx = browser.new_context(viewport={"width": 1800, "height": 1000})
    pg = ctx.new_page()
    requests: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(view.url)
    # Polled from Python: the page's CSP (no eval) refuses wait_for_function's predicate.
    assert _wait(lambda: _frames(pg) > 0, 20.0)
    return pg, requests


@pytest.fixture(scope="module")
def page(browser: Any, running_view: RunningView) -> Iterator[tuple[Any, list[str]]]:
    pg, requests = _open_page(browser, running_view)
    yield pg, requests
    pg.context.close()


@pytest.fixture(scope="module")
def markup_page(browser: Any, markup_view: RunningView) -> Iterator[tuple[Any, list[str]]]:
    pg, requests = _open_page(browser, markup_view)
    yield pg, requests
    pg.context.close()


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


# todo-ui's page has Chromium's default look: under the "todos" heading a
# text input, then the "add" button, each with a grey border. The button is
# found from the frame: the two rightmost vertical border lines (at least 15
# grey pixels tall) below the heading are its left and right edges.
_FIND_BUTTON = """() => {
  const W = 600, H = 100, TOP = 60;
  const d = document.getElementById('screen').getContext('2d').getImageData(0, TOP, W, H).data;
  const grey = (x, y) => {
    const i = (y * W + x) * 4;
    const r = d[i], g = d[i + 1], b = d[i + 2];
    return r >= 60 && r <= 200 && Math.abs(r - g) < 25 && Math.abs(r - b) < 25;
  };
  const edges = [];
  for (let x = 0; x < W; x++) {
    let n = 0, y0 = -1, y1 = -1;
    for (let y = 0; y < H; y++) { if (grey(x, y)) { n++; if (y0 < 0) y0 = y; y1 = y; } }
    const apart = edges.length === 0 || x - edges[edges.length - 1][0] > 3;
    if (n >= 15 && apart) edges.push([x, y0, y1]);
  }
  if (edges.length < 2) return null;
  const [l, r] = edges.slice(-2);
  return [l[0], TOP + l[1], r[0], TOP + l[2]];
}"""

_DARK_BELOW = """([top]) => {
  const d = document.getElementById('screen').getContext('2d').getImageData(0, top, 400, 120).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) { if (d[i] + d[i + 1] + d[i + 2] < 384) n++; }
  return n;
}"""


def _button(pg: Any) -> tuple[int, int, int, int] | None:
    box = pg.evaluate(_FIND_BUTTON)
    if box is None or not (15 <= box[2] - box[0] <= 80 and 10 <= box[3] - box[1] <= 40):
        return None
    return (int(box[0]), int(box[1]), int(box[2]), int(box[3]))


def _todos(view: RunningView) -> list[dict[str, Any]]:
    return list(json.loads(view.product_get("/todos")))


def test_shows_the_product_and_loads_only_the_viewer_origin(
    page: tuple[Any, list[str]], running_view: RunningView
) -> None:
    pg, requests = page
    # The product's own page is in the frame's pixels: its button, and the
    # heading's dark text above it on white.
    assert _wait(lambda: _button(pg) is not None), pg.evaluate(_FIND_BUTTON)
    assert _near(_pixel(pg, 900, 600), (255, 255, 255), 10)
    assert pg.evaluate(_DARK_BELOW, [20]) > 50
    # The product's page went through the journaled forward, not the host browser.
    assert running_view.forwards
    assert requests
    assert all(u.startswith(running_view.origin + "/") for u in requests), requests
    assert not any(":8000" in u for u in requests)


def test_a_click_in_the_canvas_reaches_the_product(
    page: tuple[Any, list[str]], running_view: RunningView
) -> None:
    pg, _ = page
    assert _todos(running_view) == []
    box = _button(pg)
    assert box is not None
    # The empty input's text, added by the page's script (checked through the product's API).
    pg.locator("#screen").click(position={"x": (box[0] + box[2]) // 2, "y": (box[1] + box[3]) // 2})
    assert _wait(lambda: _todos(running_view) == [{"id": 1, "title": ""}]), _todos(running_view)


def test_typing_reaches_an_input(page: tuple[Any, list[str]], running_view: RunningView) -> None:
    pg, _ = page
    box = _button(pg)
    assert box is not None
    below = pg.evaluate(_DARK_BELOW, [box[3] + 4])
    pg.locator("#screen").click(position={"x": max(box[0] - 100, 20), "y": (box[1] + box[3]) // 2})
    pg.keyboard.type("buy milk")
    pg.locator("#screen").click(position={"x": (box[0] + box[2]) // 2, "y": (box[1] + box[3]) // 2})

    def titles() -> list[str]:
        return [str(t["title"]) for t in _todos(running_view)]

    assert _wait(lambda: "buy milk" in titles()), titles()
    # ...and the view shows the list the page rendered (text under the input).
    assert _wait(lambda: pg.evaluate(_DARK_BELOW, [box[3] + 4]) > below + 40, 20.0), below
    DOCS_IMG.parent.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(DOCS_IMG))


def test_console_from_before_connect_is_shown_as_text(
    markup_page: tuple[Any, list[str]],
) -> None:
    pg, _ = markup_page
    marker = "before-connect <img src=x onerror=alert(1)>"
    assert _wait(lambda: marker in pg.locator("#events").inner_text())
    # Shown as text: the product's markup made no element in corral's page.
    assert pg.locator("#events img").count() == 0


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
