"""Viewer figures: screencast fps, click-to-frame latency, viewer memory.

Not a timed test: prints what this machine measures, against the targets
(>= 10 fps on an animating page; click-to-frame <= 150 ms p50 on loopback).

- fps: frames corral received (validated JPEG) from the viewer's Chromium
  over 10 s of a page animating on every animation frame;
- click-to-frame: from `Input.dispatchMouseEvent` sent to the first frame
  after it, on a static page whose colour changes on each mousedown (the
  screencast only emits on change, so that frame is the click's);
- memory: the viewer sandbox's cgroup peak.

    PYTHONPATH=src python bench/viewer.py
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from corral.run.environments import base_env, redirect_argv
from corral.sandbox.backend import backend_config, load_backend
from corral.sandbox.spec import Bind, Limits, NetworkSpec, SandboxSpec
from corral.viewer.inputs import Mouse, Nav
from corral.viewer.stack import ViewPlan, ViewStack, attach

PORT = 8000
SERVER = '''
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
PAGE = b"""<!doctype html><html><body style="margin:0">
<div id="box" style="position:absolute;left:0;top:0;width:100%;height:100%"></div>
<script>
const box = document.getElementById("box");
let n = 0;
const animate = location.hash === "#animate";
function tick() { n += 1; box.style.background = "hsl(" + (n * 7 % 360) + ",80%,50%)";
  if (animate) requestAnimationFrame(tick); }
tick();
document.addEventListener("mousedown", () => { n += 25; box.style.background =
  "hsl(" + (n * 7 % 360) + ",80%,50%)"; });
</script></body></html>"""
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
'''


def _stack(tmp: Path) -> ViewStack:
    prod = tmp / "src"
    prod.mkdir()
    (prod / "server.py").write_text(SERVER, encoding="utf-8")
    scratch = tmp / "product"
    scratch.mkdir()
    spec = SandboxSpec(
        argv=redirect_argv(
            ("/bin/sh", "-c", f"cd {prod} && exec python3 server.py"),
            scratch / "stdout.log",
            scratch / "stderr.log",
        ),
        workspace=str(scratch),
        env=tuple(sorted(base_env({"PORT": str(PORT)}).items())),
        binds=(Bind(str(prod), writable=False),),
        limits=Limits(memory_bytes=128 << 20, pids=64),
        network=NetworkSpec(),
        env_kind="product",
        hostname="product",
    )
    be = load_backend(backend_config("namespace"))
    plan = ViewPlan(spec, PORT, "/", 15.0, tmp / "viewer")
    return ViewStack(plan, product_backend=be, viewer_backend=be, on_forward=lambda _t: None)


async def _measure(stack: ViewStack) -> tuple[float, list[float]]:
    viewer = await attach(stack, "/#animate")
    fq, eq = viewer.subscribe()
    try:
        await asyncio.sleep(2.0)
        start_n, t0 = viewer.frames_seen, time.monotonic()
        await asyncio.sleep(10.0)
        fps = (viewer.frames_seen - start_n) / (time.monotonic() - t0)
        await viewer.dispatch(Nav("go", "/"))
        await asyncio.sleep(2.0)
        latencies = []
        for i in range(30):
            while not fq.empty():
                fq.get_nowait()
            t = time.monotonic()
            x, y = 100 + i, 100
            await viewer.dispatch(Mouse("mousePressed", x, y, "left", 1))
            await asyncio.wait_for(fq.get(), 5.0)
            latencies.append((time.monotonic() - t) * 1000)
            await viewer.dispatch(Mouse("mouseReleased", x, y, "left", 1))
            await asyncio.sleep(0.2)
        return fps, latencies
    finally:
        viewer.unsubscribe(fq, eq)
        await viewer.aclose()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-viewer-"))
    stack = _stack(tmp)
    try:
        fps, lat = asyncio.run(_measure(stack))
        assert stack.viewer is not None
        peak = stack.viewer.peak_memory()
    finally:
        stack.close()
    q = statistics.quantiles(lat, n=10)
    print(f"screencast: {fps:.1f} fps over 10 s of an animating page (target >= 10)")
    print(
        f"click-to-frame: p50 {statistics.median(lat):.0f} ms, p90 {q[8]:.0f} ms "
        f"over {len(lat)} clicks (target p50 <= 150 ms)"
    )
    print(f"viewer sandbox memory peak: {peak / (1 << 20):.0f} MiB")


if __name__ == "__main__":
    main()
