"""Live-policy proposals on the run page (issue 15), approved from the dashboard.

A real broker serves the run (its control socket in the run's `control/`); a
request it denies shows up on the run page as a proposal; approving it there
(a loopback destination: only with the private box ticked) makes the broker
admit the next request, which the loopback upstream receives. A page on
another origin posting the same form changes nothing. Judged on the host: the
upstream's hits, the broker's answers and the journal's `policy` rows.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.broker.config import BrokerConfig
from corral.broker.control import socket_name
from corral.broker.journal import read_rows
from corral.broker.process import start_broker
from corral.run.store import Store
from tests.integration.broker.testlib import RecordingServer
from tests.integration.dashboard.conftest import until
from tests.integration.dashboard.test_dashboard_hostile import _open

pytestmark = [pytest.mark.requires_chromium, pytest.mark.timeout(120)]


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, int, RecordingServer]]:
    runs = tmp_path / "runs"
    root = runs / "r-1"
    root.mkdir(parents=True, mode=0o700)
    with Store(root / "state.sqlite") as store:
        store.create_run(
            "r-1",
            mission="m",
            agent="script",
            provider="synthetic",
            max_sessions=1,
            memory_cap=1 << 30,
        )
    upstream = RecordingServer()
    broker = start_broker(
        BrokerConfig(),
        root / "journal.sqlite",
        run="r-1",
        listen=["127.0.0.1:0"],
        control=root / "control" / socket_name("session-1", "agent"),
    )
    try:
        port = broker.wait_ready(15).tcp_ports[0]
        yield runs, port, upstream
    finally:
        broker.stop()
        upstream.close()


def _proxied_get(proxy: int, upstream: int, path: str) -> bytes:
    with contextlib.closing(socket.create_connection(("127.0.0.1", proxy), timeout=15)) as s:
        s.sendall(
            f"GET http://127.0.0.1:{upstream}{path} HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        return s.recv(4096).split(b"\r\n", 1)[0]


def _message(page: Any) -> str:
    until(page, "document.getElementById('message').textContent !== ''")
    text = str(page.locator("#message").inner_text())
    page.evaluate("document.getElementById('message').textContent = ''")
    return text


def test_a_denial_is_proposed_and_approving_it_admits_the_next_request(
    live_run: tuple[Path, int, RecordingServer], dashboard: Any, browser: Any
) -> None:
    runs, proxy, upstream = live_run
    assert b" 403" in _proxied_get(proxy, upstream.port, "/denied")
    d = dashboard(runs)
    page, dialogs, _ = _open(browser, d, "/run/r-1")
    row = page.locator("#proposals tbody tr")
    assert row.count() == 1
    assert row.locator(".p-rule").inner_text() == f"127.0.0.1:{upstream.port}"
    pid = str(row.get_attribute("id")).removeprefix("proposal-")
    csrf = row.locator("input[name=csrf]").get_attribute("value")

    # Another origin posts the approval, private box included: refused, nothing added.
    evil = browser.new_context().new_page()
    evil.set_content(
        f'<form id=f method=post action="{d.origin}/run/r-1/approve/{pid}">'
        f'<input name=csrf value="{csrf}"><input name=allow_private value=on></form>'
    )
    with evil.expect_navigation():
        evil.evaluate("document.getElementById('f').submit()")
    assert "403" in evil.content()
    assert b" 403" in _proxied_get(proxy, upstream.port, "/after-cross-site")

    # The dashboard's own button without the private box: refused as `corral approve` is.
    row.locator("button").click()
    assert "--allow-private" in _message(page)
    assert b" 403" in _proxied_get(proxy, upstream.port, "/after-refusal")
    assert not read_rows(runs / "r-1" / "journal.sqlite", kind="policy")

    row.locator("input[name=allow_private]").check()
    row.locator("button").click()
    assert f"rule live:{pid} added" in _message(page)
    assert b" 200" in _proxied_get(proxy, upstream.port, "/approved")
    assert [h.path for h in upstream.hits] == ["/approved"]
    [policy] = read_rows(runs / "r-1" / "journal.sqlite", kind="policy")
    assert policy.detail["rule"]["host"] == "127.0.0.1"
    # Approved: the run page no longer proposes it.
    page.reload()
    assert page.locator("#proposals tbody tr").count() == 0
    assert not dialogs
