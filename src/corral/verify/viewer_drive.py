"""The M11 attack, driven from the host: a hostile product seen in a browser.

The product (shipped here as data, run with the system python3) serves a page
whose script tries to reach a host canary (img, fetch, WebSocket to a port the
host listens on), sets a cookie, opens a popup and embeds the product's secret.
A host-side Chromium (Playwright driving Debian's chromium) then looks at it:

- `direct=False` (corral): through `corral view`'s stack, the product in its
  product sandbox, Chromium in a viewer sandbox, the host browser on the
  viewer page;
- `direct=True` (`--backend none`: no viewer isolation): the product runs on
  the host and the host browser opens it.

The facts are host-side effects only: canary connections, response bodies,
loaded URLs, cookies, pages, and the product's colour in what is shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["COLOUR", "drive"]

COLOUR = (0x10, 0xD0, 0x70)

_PRODUCT = '''import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
CANARY = os.environ["CANARY_PORT"]
SECRET = os.environ["PRODUCT_SECRET"]
PAGE = f"""<!doctype html><html><head><meta charset="utf-8"><title>x</title>
<style>body {{ margin: 0; background: #10d070; }}</style></head>
<body><p>{SECRET}</p><img src="http://127.0.0.1:{CANARY}/img">
<script>
document.cookie = "product=planted; path=/";
fetch("http://127.0.0.1:{CANARY}/fetch", {{mode: "no-cors"}}).catch(() => {{}});
try {{ new WebSocket("ws://127.0.0.1:{CANARY}/ws"); }} catch (e) {{}}
window.open("/popup");
(async () => {{
  const open = [];
  await Promise.all(Array.from({{length: 300}}, (_, k) => 9100 + k).map(async (p) => {{
    try {{
      const url = "http://127.0.0.1:" + p + "/json/version";
      await fetch(url, {{mode: "no-cors", cache: "no-store"}});
      open.push(p);
    }} catch (e) {{}}
  }}));
  await fetch("/report", {{method: "POST", body: JSON.stringify(open)}});
}})();
</script></body></html>"""
REPORTS = []
class H(BaseHTTPRequestHandler):
    def _send(self, body, ctype="text/html; charset=utf-8"):
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/report":
            self._send(json.dumps(REPORTS).encode(), "application/json")
        else:
            self._send(PAGE.encode())
    def do_POST(self):
        n = min(int(self.headers.get("content-length") or 0), 65536)
        REPORTS.append(json.loads(self.rfile.read(n)))
        self._send(b"ok", "text/plain")
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
'''


class _Canary:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _direct(root: Path, env: dict[str, str]) -> Iterator[tuple[str, Callable[[], bytes]]]:
    port = _free_port()
    proc = subprocess.Popen(
        ["/usr/bin/python3", str(root / "server.py")], env={**env, "PORT": str(port)}
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            time.sleep(0.1)
        yield (
            f"http://127.0.0.1:{port}/",
            lambda: _get(socket.create_connection(("127.0.0.1", port), 5)),
        )
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _viewed(
    root: Path, env: dict[str, str], product_backend: str = "namespace"
) -> Iterator[tuple[str, Callable[[], bytes]]]:
    from corral.run.environments import base_env, redirect_argv
    from corral.sandbox.backend import backend_config, load_backend
    from corral.sandbox.spec import Bind, Limits, NetworkSpec, SandboxSpec
    from corral.viewer.stack import ViewPlan, ViewStack, serve
    from corral.viewer.web import new_token

    scratch = root / "product-scratch"
    scratch.mkdir()
    spec = SandboxSpec(
        argv=redirect_argv(
            ("/bin/sh", "-c", f"exec python3 {root / 'server.py'}"),
            scratch / "stdout.log",
            scratch / "stderr.log",
        ),
        workspace=str(scratch),
        env=tuple(sorted(base_env({"PORT": "8000", **env}).items())),
        binds=(Bind(str(root / "server.py"), writable=False),),
        limits=Limits(memory_bytes=128 << 20, pids=64),
        network=NetworkSpec(),
        env_kind="product",
        hostname="product",
    )
    # The viewer's browser is corral's own namespace sandbox; the product runs
    # on the backend under test.
    viewer_be = load_backend(backend_config("namespace"))
    product_be = load_backend(backend_config(product_backend))
    plan = ViewPlan(spec, 8000, "/", 15.0, root / "viewer")
    stack = ViewStack(
        plan, product_backend=product_be, viewer_backend=viewer_be, on_forward=lambda _t: None
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    urls: list[str] = []
    ready = threading.Event()

    def run() -> None:
        def on_url(url: str) -> None:
            urls.append(url)
            ready.set()

        try:
            loop.run_until_complete(
                serve(
                    stack,
                    port=0,
                    token=new_token(),
                    stop=stop,
                    on_url=on_url,
                    runs_dir=root / "runs",
                )
            )
        finally:
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        ready.wait(60)
        if not urls:
            raise RuntimeError("the viewer did not start")
        net = stack.product_net
        assert net is not None
        yield urls[0], lambda: _get(net.connect(8000))
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        if not thread.is_alive():
            loop.close()
        stack.close()


def _get(sock: socket.socket, limit: int = 65536) -> bytes:
    """GET /report from the product (host side), the body bounded."""
    with sock:
        sock.settimeout(5)
        sock.sendall(b"GET /report HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while len(data) <= limit and (chunk := sock.recv(65536)):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[-1][:limit]


def _scanned(report: Callable[[], bytes], timeout_s: float) -> list[int] | None:
    """The ports in 9100-9399 the product's page reached (None: it never reported)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            got = json.loads(report())
            if isinstance(got, list) and got:
                found = {
                    int(p) for r in got if isinstance(r, list) for p in r if isinstance(p, int)
                }
                return sorted(found)
        time.sleep(0.2)
    return None


def _standin() -> socket.socket:
    """A listener in 9100-9399 on the host's loopback: what a browser's DevTools
    port is to a page running in the host browser (`--backend none`)."""
    for port in range(9100, 9400):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen(16)
        threading.Thread(target=_accept_all, args=(s,), daemon=True).start()
        return s
    raise RuntimeError("no free port in 9100-9399 for the DevTools stand-in")


def _accept_all(s: socket.socket) -> None:
    # Answers like Chromium's DevTools HTTP endpoint does (a fetch of a
    # connection closed without a response fails, as a refused one does).
    while True:
        try:
            conn, _ = s.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):
            conn.settimeout(2)
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")


def _near(rgb: list[int]) -> bool:
    return all(abs(a - b) <= 40 for a, b in zip(rgb, COLOUR, strict=True))


@functools.cache
def drive(direct: bool, product_backend: str = "namespace") -> dict[str, Any]:
    """Run the attack once per mode and product backend (cached: every M11
    probe judges the same run)."""
    from playwright.sync_api import sync_playwright

    canary = _Canary()
    standin = _standin()
    secret = "corral-m11-" + secrets.token_hex(8)
    root = Path(tempfile.mkdtemp(prefix="corral-verify-viewer-"))
    (root / "server.py").write_text(_PRODUCT, encoding="utf-8")
    env = {"CANARY_PORT": str(canary.port), "PRODUCT_SECRET": secret, "PATH": os.defpath}
    opener = _direct
    try:
        viewed = opener(root, env) if direct else _viewed(root, env, product_backend)
        with viewed as (url, report), sync_playwright() as pw:
            origin = url.split("/viewer", 1)[0].rstrip("/")
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            ctx = browser.new_context(viewport={"width": 1800, "height": 1000})
            loaded: list[str] = []
            responses: list[Any] = []
            ctx.on("request", lambda r: loaded.append(r.url))
            # Bodies are read after the page ran: the sync API cannot be
            # re-entered from an event handler.
            ctx.on("response", lambda r: responses.append(r))  # noqa: PLW0108 (no builtins)
            page = ctx.new_page()
            page.goto(url)
            shown = False
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not shown:
                if direct:
                    rgb = page.evaluate(
                        "() => getComputedStyle(document.body).backgroundColor"
                        ".match(/\\d+/g).slice(0, 3).map(Number)"
                    )
                else:
                    rgb = page.evaluate(
                        "() => Array.from(document.getElementById('screen')"
                        ".getContext('2d').getImageData(900, 600, 1, 1).data.slice(0, 3))"
                    )
                shown = _near(list(rgb))
                page.wait_for_timeout(200)
            page.wait_for_timeout(1000)  # the product's script had its chance
            scanned = _scanned(report, 15.0)
            bodies = []
            for r in list(responses):
                with contextlib.suppress(Exception):  # redirects have no body
                    bodies.append(r.body())
            viewer_origin = None if direct else origin
            foreign = [u for u in loaded if viewer_origin is None or not u.startswith(origin + "/")]
            facts: dict[str, Any] = {
                "canary": canary.hits,
                "secret": any(secret.encode() in b for b in bodies),
                "product_origin": sorted(set(foreign))[:5],
                "cookie": [c["name"] for c in ctx.cookies() if c["name"] == "product"],
                "popup": len(ctx.pages) - 1,
                "shown": shown,
                # What the page's scan reached; a report that never came is
                # not a denial (the fact is missing: an error).
                **({"devtools_port": scanned} if scanned is not None else {}),
            }
            ctx.close()
            browser.close()
            return facts
    finally:
        canary.sock.close()
        standin.close()
        with contextlib.suppress(OSError):
            for p in sorted(root.rglob("*"), reverse=True):
                p.unlink() if not p.is_dir() else p.rmdir()
            root.rmdir()


if __name__ == "__main__":
    print(drive(len(sys.argv) > 1 and sys.argv[1] == "direct"))
