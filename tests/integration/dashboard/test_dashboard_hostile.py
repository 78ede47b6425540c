"""The dashboard in a real Chromium over a run full of agent-chosen markup, and its gate.

Every payload in `hostile.py` would, rendered as HTML, add an element with an
`inj-*` id, fire a dialog or set `window.__xss`; the tests assert none of that
happened and that the payload's text is on the page literally.
"""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from typing import Any

import pytest

from corral.broker.actions import Observation
from corral.broker.journal import Journal
from corral.run.store import Store
from tests.integration.dashboard.conftest import SHOTS, Dashboard, record_dialog, until
from tests.integration.dashboard.hostile import (
    CHECK_OUTPUT,
    INJECTED_IDS,
    JOURNAL_TARGET,
    RULE,
    SUMMARY,
    hostile_run,
)

pytestmark = [pytest.mark.requires_chromium, pytest.mark.timeout(60)]

LIVE_TARGET = '<img id="inj-live" src=x onerror="window.__xss=6;alert(6)">'

HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none';"
        " base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
}


def _request(
    d: Dashboard,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: str | None = None,
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=20)
    hdrs = {"Host": f"127.0.0.1:{d.port}"}
    hdrs.update(headers or {})
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def _assert_headers(resp: http.client.HTTPResponse) -> None:
    for name, value in HEADERS.items():
        assert resp.getheader(name) == value, (resp.status, name, resp.getheaders())


def _open(browser: Any, d: Dashboard, path: str = "/") -> tuple[Any, list[str], list[str]]:
    ctx = browser.new_context()
    page = ctx.new_page()
    dialogs: list[str] = []
    requests: list[str] = []
    page.on("dialog", record_dialog(dialogs))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(d.url)
    assert page.url == d.origin + "/", "the token stayed in the address bar"
    if path != "/":
        page.goto(d.origin + path)
    return page, dialogs, requests


def test_hostile_run_renders_as_text(tmp_path: Path, dashboard: Any, browser: Any) -> None:
    runs = tmp_path / "runs"
    hostile_run(runs)
    d = dashboard(runs)
    page, dialogs, requests = _open(browser, d)
    assert page.locator("#runs").inner_text().count("hostile") == 1
    page.goto(d.origin + "/run/hostile")
    until(page, "document.getElementById('live').dataset.updates >= '1'")
    page.wait_for_timeout(300)
    for ident in INJECTED_IDS:
        assert page.locator(f"#{ident}").count() == 0, f"{ident} was injected"
    assert page.locator("img[src=x], iframe, svg#inj-summary").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert dialogs == []
    text = page.inner_text("body")
    for literal in (CHECK_OUTPUT, JOURNAL_TARGET, SUMMARY, RULE):
        assert literal in text, literal
    # git quotes the name (it holds '"'); the markup is there as text.
    assert '<img id=\\"inj-file\\" src=x onerror=' in page.inner_text("#diff-text")
    assert '<iframe id="inj-diff"' in page.inner_text("#diff-text")
    # Denied actions come first.
    rows = page.locator("#journal-rows tr").all_inner_texts()
    assert "deny" in rows[0] and "allow" in rows[1]
    # The resource plot is an image from the dashboard, not inline markup.
    assert page.locator("img#plot").evaluate("i => i.naturalWidth") > 0
    # A row the journal gains while the page is open arrives over the event stream.
    with Journal(runs / "hostile" / "journal.sqlite") as j:
        j.append(
            Observation(
                run="hostile",
                session="1",
                env="agent",
                kind="http_request",
                target=LIVE_TARGET,
                decision="deny",
                rule="r",
                reason="live",
            )
        )
    until(page, "document.querySelectorAll('#journal-rows tr.live').length === 1")
    assert page.locator("#inj-live").count() == 0
    assert LIVE_TARGET in page.inner_text("#journal-rows tr.live")
    assert page.evaluate("typeof window.__xss") == "undefined" and dialogs == []
    assert all(u.startswith(d.origin + "/") for u in requests), requests
    page.screenshot(path=str(SHOTS / "dashboard-hostile-run.png"), full_page=True)


def test_no_token_wrong_token_wrong_host(tmp_path: Path, dashboard: Any) -> None:
    runs = tmp_path / "runs"
    hostile_run(runs)
    d = dashboard(runs)
    for path in ("/", "/run/hostile", "/static/dash.js", "/run/hostile/events", "/nowhere"):
        resp = _request(d, "GET", path)
        assert resp.status == 403, path
        _assert_headers(resp)
    bad = _request(d, "GET", "/?token=" + "A" * len(d.token))
    assert bad.status == 403 and bad.getheader("set-cookie") is None
    _assert_headers(bad)
    cookie = {"Cookie": f"corral_dash={d.token}"}
    # DNS rebinding: a name the attacker controls, resolved to 127.0.0.1.
    for host in (f"evil.example:{d.port}", "127.0.0.1", f"127.0.0.2:{d.port}"):
        resp = _request(d, "GET", "/", headers={**cookie, "Host": host})
        assert resp.status == 403, host
        _assert_headers(resp)
    first = _request(d, "GET", f"/run/hostile?token={d.token}")
    assert first.status == 303 and first.getheader("location") == "/run/hostile"
    set_cookie = first.getheader("set-cookie") or ""
    assert f"corral_dash={d.token}" in set_cookie
    assert "HttpOnly" in set_cookie and re.search(r"SameSite=Strict", set_cookie)
    _assert_headers(first)
    for path, status in (
        ("/", 200),
        ("/run/hostile", 200),
        ("/static/dash.css", 200),
        ("/nowhere", 404),
        ("/run/nope", 404),
        ("/run/hostile/footprint.svg", 200),
    ):
        resp = _request(d, "GET", path, headers=cookie)
        assert resp.status == status, path
        _assert_headers(resp)
    ws = _request(
        d,
        "GET",
        "/run/hostile/events",
        headers={
            **cookie,
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Origin": "http://evil.example",
        },
    )
    assert ws.status == 403
    _assert_headers(ws)


def _created_run(runs: Path) -> None:
    root = runs / "idle"
    root.mkdir(parents=True)
    with Store(root / "state.sqlite") as store:
        store.create_run(
            "idle",
            mission="m",
            agent="script",
            provider="synthetic",
            max_sessions=1,
            memory_cap=1 << 30,
        )


def _state(runs: Path) -> str:
    with Store(runs / "idle" / "state.sqlite", readonly=True) as store:
        return store.run().state


def test_cross_site_posts_change_nothing(tmp_path: Path, dashboard: Any, browser: Any) -> None:
    runs = tmp_path / "runs"
    _created_run(runs)
    d = dashboard(runs)
    cookie = {
        "Cookie": f"corral_dash={d.token}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    page, _, _ = _open(browser, d, "/run/idle")
    csrf = page.locator("form.action input[name=csrf]").first.get_attribute("value")
    assert csrf
    attempts = [
        {},  # no Origin
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": f"http://127.0.0.1:{d.port + 1}"},
    ]
    for extra in attempts:
        resp = _request(
            d, "POST", "/run/idle/stop", headers={**cookie, **extra}, body=f"csrf={csrf}"
        )
        assert resp.status == 403, extra
        _assert_headers(resp)
    for body in ("", "csrf=wrong", "csrf=" + d.token):
        resp = _request(
            d, "POST", "/run/idle/stop", headers={**cookie, "Origin": d.origin}, body=body
        )
        assert resp.status == 403, body
    # A page on another origin submits a form at the dashboard (the browser
    # sends the cookie only if SameSite allowed it; Origin is checked anyway).
    evil = browser.new_context().new_page()
    evil.set_content(
        f'<form id=f method=post action="{d.origin}/run/idle/stop">'
        f'<input name=csrf value="{csrf}"></form>'
    )
    with evil.expect_navigation():
        evil.evaluate("document.getElementById('f').submit()")
    assert "403" in evil.content()
    assert _state(runs) == "created", "a cross-site request stopped the run"
    # The dashboard's own button does it.
    page.locator("form[action$='/stop'] button").click()
    until(page, "document.getElementById('message').textContent !== ''")
    assert page.locator("#message").inner_text() == "run is stopped"
    assert _state(runs) == "stopped"


def test_runs_list_screenshot(tmp_path: Path, dashboard: Any, browser: Any) -> None:
    runs = tmp_path / "runs"
    hostile_run(runs, "r1-hostile")
    _created_run(runs)
    d = dashboard(runs)
    page, dialogs, _ = _open(browser, d)
    assert page.locator("#runs tbody tr").count() == 2
    assert dialogs == []
    page.screenshot(path=str(SHOTS / "dashboard-runs.png"), full_page=True)
