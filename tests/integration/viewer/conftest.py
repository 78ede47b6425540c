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
TODO_UI = Path(__file__).parents[3] / "examples" / "todo-ui"
PORT = 8000


def todo_ui_product(dest: Path) -> Path:
    """The shipped todo-ui example's product as its script agent leaves it.

    The mission's scenario.yaml is what the synthetic provider plays and the
    script agent carries out: session 1 writes server.py, session 2 edits it
    (the fix the browser check asked for). The same calls applied here give
    the product a run of that mission ends with.
    """
    import yaml

    scenario = yaml.safe_load((TODO_UI / "scenario.yaml").read_text())
    text: str | None = None
    for conv in scenario["conversations"]:
        for turn in conv["turns"]:
            for call in turn.get("calls", []):
                if "write_file" in call and call["write_file"]["path"] == "server.py":
                    text = call["write_file"]["content"]
                elif "edit_file" in call and call["edit_file"]["path"] == "server.py":
                    edit = call["edit_file"]
                    assert text is not None and text.count(edit["old"]) == 1
                    text = text.replace(edit["old"], edit["new"])
    assert text is not None and "// TODO" not in text
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "server.py").write_text(text)
    return dest


def product_spec(
    scratch: Path,
    script: str = "server.py",
    env: dict[str, str] | None = None,
    product: Path = PRODUCT,
) -> SandboxSpec:
    return SandboxSpec(
        argv=redirect_argv(
            ("/bin/sh", "-c", f"cd {product} && exec python3 {script}"),
            scratch / "stdout.log",
            scratch / "stderr.log",
        ),
        workspace=str(scratch),
        env=tuple(sorted(base_env({"PORT": str(PORT), **(env or {})}).items())),
        binds=(Bind(str(product), writable=False),),
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
    """The shipped todo-ui example's product, viewed."""
    with start_view("server.py", {}, "/health", TODO_UI) as view:
        yield view


@pytest.fixture(scope="module")
def markup_view() -> Iterator[RunningView]:
    """The fixture product (product/server.py): its console text carries markup."""
    with start_view("server.py", {}, "/health") as view:
        yield view


@contextlib.contextmanager
def start_view(
    script: str, env: dict[str, str], ready_path: str, product: Path | None = None
) -> Iterator[RunningView]:
    """The product `script` (in `product`, default product/) in its sandbox, viewed;
    torn down on exit. `product=TODO_UI`: the shipped todo-ui example's product."""
    tmp = Path(tempfile.mkdtemp(prefix="corral-viewer-test-"))
    (tmp / "product").mkdir()
    if product == TODO_UI:
        product = todo_ui_product(tmp / "todo-ui")
    forwards: list[str] = []
    be = load_backend(backend_config("namespace"))
    spec = product_spec(tmp / "product", script, env, product or PRODUCT)
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
