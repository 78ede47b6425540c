"""A product sandbox, a viewer sandbox and the forward between them, as one unit.

`ViewStack` starts the product (its spec as `corral run` builds it), waits
until it answers, starts the viewer sandbox with the product port forwarded
into it (each connection journaled through `on_forward`, which may refuse it
by raising) and closes everything in `close()`, even when a step failed.
The forward runs in `corral run`'s forward helper (run/forward_helper.py),
in the `helpers-forward` cgroup of the run's cgroup (`run_cgroup`), or of a
cgroup of the view's own when it has none (removed by `close()`): the
relay's buffers and sockets are charged there, never to `corral view`.
`serve()` attaches a `Viewer` and serves the dashboard with the viewer
mounted until a stop event (Ctrl-C/SIGTERM in `corral view`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import CgroupError, HelperError, SandboxStartError
from corral.run.forward import probe_ready
from corral.run.forward_helper import HelperForwarder
from corral.run.runcg import RunCgroup, ephemeral_run_cgroup, parse_cgroup_key
from corral.viewer.sandbox import ViewerLimits, ViewerSandbox, viewer_spec

if TYPE_CHECKING:
    from corral.sandbox.backend import Backend, Sandbox, SandboxNet
    from corral.sandbox.spec import SandboxSpec
    from corral.viewer.core import Viewer

__all__ = ["ViewPlan", "ViewStack", "serve"]


@dataclass(frozen=True, slots=True)
class ViewPlan:
    product: SandboxSpec
    product_port: int
    ready_path: str | None
    ready_timeout_s: float
    scratch: Path
    run_id: str | None = None
    session_id: str | None = None
    parent_cgroup: str | None = None
    width: int = 1280
    height: int = 800
    limits: ViewerLimits = field(default_factory=ViewerLimits)
    run_cgroup: str | None = None
    """The key (`RUN_ID[:EPOCH]`) of the run cgroup the forward helper joins; None:
    a cgroup of the view's own, which the sandboxes go below as well."""
    forward_log: Path | None = None
    """The forward helper's stderr (default: beside `scratch`, outside the viewer's reach)."""


#: What a view's own cgroup allows beyond its two sandboxes (the forward helper).
_HELPER_HEADROOM = 256 << 20


class ViewStack:
    """Everything a view runs; `close()` always."""

    def __init__(
        self,
        plan: ViewPlan,
        *,
        product_backend: Backend,
        viewer_backend: Backend,
        on_forward: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.product: Sandbox | None = None
        self.viewer: ViewerSandbox | None = None
        self.product_net: SandboxNet | None = None
        self._forwarder: HelperForwarder | None = None
        self._own_cg: RunCgroup | None = None
        try:
            cg = self._cgroup(plan)
            parent = plan.parent_cgroup or (cg.relpath if cg is self._own_cg else None)
            log = plan.forward_log or plan.scratch.parent / f"{plan.scratch.name}-forward.log"
            self._forwarder = HelperForwarder(on_forward, cg.helper_procs("forward"), log)
            holder: list[SandboxNet] = []
            self.product = product_backend.start(
                plan.product, parent_cgroup=parent, network=holder.append
            )
            product = self.product
            self.product_net = holder[0]
            ready, why = probe_ready(
                holder[0],
                plan.product_port,
                plan.ready_path,
                plan.ready_timeout_s,
                alive=lambda: product.poll() is None,
            )
            if not ready:
                raise SandboxStartError(f"the product is not ready: {why}")
            plan.scratch.mkdir(parents=True, exist_ok=True)
            spec = viewer_spec(
                plan.scratch,
                width=plan.width,
                height=plan.height,
                limits=plan.limits,
                run_id=plan.run_id,
                session_id=plan.session_id,
            )
            self.viewer = ViewerSandbox(
                viewer_backend,
                spec,
                product=holder[0],
                product_port=plan.product_port,
                forwarder=self._forwarder,
                parent_cgroup=parent,
            )
        except BaseException:
            self.close()
            raise

    def _cgroup(self, plan: ViewPlan) -> RunCgroup:
        """The run cgroup the forward helper joins (HelperError when there is none)."""
        try:
            if plan.run_cgroup is not None:
                cg = RunCgroup.detect(*parse_cgroup_key(plan.run_cgroup))
                if cg is None or not cg.exists():
                    raise HelperError(f"layer run cgroup: run cgroup {plan.run_cgroup} is gone")
                return cg
            own = ephemeral_run_cgroup("view")
            if own is None:
                raise HelperError("layer run cgroup: no cgroup hierarchy for the view's forward")
            # Ours from here: `close()` sweeps whatever part of it was made.
            self._own_cg = own
            cap = (plan.product.limits.memory_bytes or 1 << 30) + plan.limits.memory_bytes
            own.create(cap + _HELPER_HEADROOM)
        except CgroupError as exc:
            raise HelperError(f"layer run cgroup: {exc}") from exc
        return own

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.plan.product_port}"

    def close(self) -> None:
        if self.viewer is not None:
            with contextlib.suppress(Exception):
                self.viewer.close()
            self.viewer = None
        if self.product is not None:
            with contextlib.suppress(Exception):
                self.product.interrupt(signal.SIGKILL)
            self.product.close()
            self.product = None
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None
        if self._own_cg is not None:
            with contextlib.suppress(CgroupError, OSError):
                self._own_cg.sweep()
            self._own_cg = None


async def attach(stack: ViewStack, path: str = "/") -> Viewer:
    """Connect a `Viewer` to the stack's Chromium and load the product."""
    from corral.viewer.core import Viewer, open_page_target

    assert stack.viewer is not None
    client = await open_page_target(*stack.viewer.take_devtools())
    viewer = Viewer(client, stack.origin, stack.plan.width, stack.plan.height)
    await viewer.start(path)
    return viewer


async def serve(
    stack: ViewStack,
    *,
    port: int,
    token: str,
    stop: asyncio.Event,
    on_url: Callable[[str], None],
    runs_dir: Path,
    run_id: str | None = None,
) -> None:
    """Serve the dashboard over `runs_dir` with the stack's viewer mounted, until `stop`.

    The viewer's routes are a dashboard extension: the dashboard's token,
    cookie, Host and Origin checks and security headers cover them. `on_url`
    gets the viewer's URL with the token (the first load trades it for the
    cookie and drops it from the address bar).
    """
    from aiohttp import web
    from yarl import URL

    from corral.dashboard.server import create_app
    from corral.viewer.web import extension

    viewer = await attach(stack)
    runner: web.AppRunner | None = None
    sock: socket.socket | None = None
    try:
        app = create_app(runs_dir, token, extensions=[extension(viewer, run_id)])
        sock = _bind(port)
        real = sock.getsockname()[1]
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        query = {"run": run_id, "token": token} if run_id is not None else {"token": token}
        on_url(str(URL(f"http://127.0.0.1:{real}/viewer").with_query(query)))
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()
        if sock is not None:
            sock.close()
        await viewer.aclose()


def _bind(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(64)
    return s
