"""A running view (product + viewer sandboxes + the dashboard serving the viewer) for the tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.run.environments import base_env, redirect_argv
from corral.sandbox.backend import backend_config, load_backend
from corral.sandbox.spec import Bind, Limits, NetworkSpec, SandboxSpec
from corral.viewer.stack import ViewPlan, ViewStack, serve
from corral.viewer.web import new_token

PRODUCT = Path(__file__).parent / "product"
PORT = 8000


def product_spec(
    scratch: Path, script: str = "server.py", env: dict[str, str] | None = None
) -> SandboxSpec:
    return SandboxSpec(
        argv=redirect_argv(
            ("/bin/sh", "-c", f"cd {PRODUCT} && exec python3 {script}"),
            scratch / "stdout.log",
            scratch / "stderr.log",
        ),
        workspace=str(scratch),
        env=tuple(sorted(base_env({"PORT": str(PORT), **(env or {})}).items())),
        binds=(Bind(str(PRODUCT), writable=False),),
        limits=Limits(memory_bytes=128 << 20, pids=64),
        network=NetworkSpec(),
        env_kind="product",
        hostname="product",
    )


@dataclass
class RunningView:
    stack: ViewStack
    url: str
    origin: str
    token: str
    forwards: list[str]

    def product_get(self, path: str) -> bytes:
        """GET from the product's own loopback (host side, for assertions only)."""
        assert self.stack.product_net is not None
        sock = self.stack.product_net.connect(PORT)
        with sock:
            sock.settimeout(5)
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return data.split(b"\r\n\r\n", 1)[1]


@pytest.fixture(scope="module")
def running_view() -> Iterator[RunningView]:
    with start_view("server.py", {}, "/health") as view:
        yield view


@contextlib.contextmanager
def start_view(script: str, env: dict[str, str], ready_path: str) -> Iterator[RunningView]:
    """The product `script` (in product/) in its sandbox, viewed; torn down on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="corral-viewer-test-"))
    (tmp / "product").mkdir()
    forwards: list[str] = []
    be = load_backend(backend_config("namespace"))
    spec = product_spec(tmp / "product", script, env)
    plan = ViewPlan(spec, PORT, ready_path, 15.0, tmp / "viewer")
    stack = ViewStack(plan, product_backend=be, viewer_backend=be, on_forward=forwards.append)
    token = new_token()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    urls: list[str] = []
    ready = threading.Event()
    errors: list[BaseException] = []

    def on_url(url: str) -> None:
        urls.append(url)
        ready.set()

    def main() -> None:
        try:
            loop.run_until_complete(
                serve(
                    stack,
                    port=0,
                    token=token,
                    stop=stop,
                    on_url=on_url,
                    runs_dir=tmp / "runs",
                )
            )
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "the view did not start"
        assert not errors, errors
        url = urls[0]
        origin = url.split("/viewer", 1)[0]
        yield RunningView(stack, url, origin, token, forwards)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        loop.close()
        stack.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
