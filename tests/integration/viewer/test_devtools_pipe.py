"""The viewer's DevTools endpoint is a pipe: the product's JavaScript finds no port.

The product's page (product/devtools_scan.py) fetches 127.0.0.1:9100-9399,
opens a WebSocket to 9222 and navigates there, then reports what answered.
Host-side effects: the product's report, and the viewer sandbox's own
/proc/net/tcp read from the host (every listener in its network namespace).
The control starts the same viewer sandbox with the DevTools port mode corral
used before (`--remote-debugging-port=9222`): there the port is listed and the
page's scan reaches it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import corral.viewer.stack as stack_mod
from corral.viewer.sandbox import viewer_spec
from corral.viewer.stack import ViewPlan, ViewStack
from tests.integration.viewer.conftest import PORT, RunningView, product_spec, start_view

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_chromium]

DEVTOOLS = 9222


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            with contextlib.suppress(OSError):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
    return out


def listening_ports(sandbox_pid: int) -> set[int]:
    """TCP ports listening in the sandbox's network namespace, read by the host."""
    own = os.readlink("/proc/self/ns/net")
    for pid in _descendants(sandbox_pid):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == own:
                continue
            ports: set[int] = set()
            for name in ("tcp", "tcp6"):
                for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
                    f = line.split()
                    if f[3] == "0A":  # TCP_LISTEN
                        ports.add(int(f[1].rsplit(":", 1)[1], 16))
            return ports
        except OSError:
            continue
    raise AssertionError("no process of the sandbox in its own network namespace")


def _reports(get: Any) -> list[dict[str, Any]]:
    return list(json.loads(get("/report")))


def _wait_report(get: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = _reports(get)
        if got:
            return got[0]
        time.sleep(0.2)
    raise AssertionError("the product's page never reported its scan")


def test_the_products_script_finds_no_devtools_port() -> None:
    with start_view("devtools_scan.py", {}, "/health") as view:
        report = _wait_report(view.product_get)
        assert view.stack.viewer is not None
        ports = listening_ports(view.stack.viewer.sandbox.pid)  # type: ignore[attr-defined]
    # The scan works (the product's own port, reached through the forward, answers)...
    assert report["open"] == [str(PORT)], report
    # ...and nothing else does: no DevTools port, no WebSocket to it.
    assert report["ws"] in ("error", "throw"), report
    # The only listener in the viewer's namespace is corral's forward.
    assert ports == {PORT}, ports


@pytest.fixture
def port_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The viewer sandbox as corral started it before: DevTools on its loopback."""

    def old_spec(scratch: Path, **kw: Any) -> Any:
        spec = viewer_spec(scratch, **kw)
        argv = tuple(
            f"--remote-debugging-port={DEVTOOLS}" if a == "--remote-debugging-pipe" else a
            for a in spec.argv
        )
        assert argv != spec.argv
        return replace(spec, argv=(*argv[:-1], f"http://127.0.0.1:{PORT}/"))

    monkeypatch.setattr(stack_mod, "viewer_spec", old_spec)
    yield


@pytest.mark.usefixtures("port_mode")
def test_control_with_a_devtools_port_the_scan_reaches_it(tmp_path: Path) -> None:
    from corral.sandbox.backend import backend_config, load_backend

    (tmp_path / "product").mkdir()
    be = load_backend(backend_config("namespace"))
    plan = ViewPlan(
        product_spec(tmp_path / "product", "devtools_scan.py"),
        PORT,
        "/health",
        15.0,
        tmp_path / "viewer",
    )
    stack = ViewStack(plan, product_backend=be, viewer_backend=be, on_forward=lambda _: None)
    try:
        view = RunningView(stack, "", "", "", [])
        report = _wait_report(view.product_get)
        assert stack.viewer is not None
        ports = listening_ports(stack.viewer.sandbox.pid)  # type: ignore[attr-defined]
    finally:
        stack.close()
    assert DEVTOOLS in ports, ports
    assert str(DEVTOOLS) in report["open"], report
