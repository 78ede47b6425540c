"""`corral view RUN`: the product of a run, rendered in a viewer sandbox.

The product starts from a session's snapshot in its product sandbox (as in
`corral run`), Chromium runs in a viewer sandbox that reaches only the
product's port through the journaled forward, and the page is served on
127.0.0.1 as the dashboard over the runs directory with the viewer mounted
(its token, cookie, Origin checks and headers). Ctrl-C or SIGTERM tears everything down.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register", "run_view"]


def _latest_snapshot(root: Path) -> int | None:
    found = []
    snaps = root / "snapshots"
    for d in snaps.iterdir() if snaps.is_dir() else ():
        num = d.name.removeprefix("session-")
        if d.is_dir() and num.isdigit():
            found.append(int(num))
    return max(found) if found else None


def run_view(run_ref: str, session: int | None, port: int, runs_dir: Path) -> int:
    """Serve the view until a signal; the exit status."""
    from corral.broker.actions import Observation
    from corral.broker.journal import Journal
    from corral.errors import UsageError
    from corral.run.control import find_run
    from corral.run.coordinator import load_run
    from corral.run.environments import product_spec
    from corral.run.runcg import RunCgroup
    from corral.sandbox.backend import backend_config, load_backend
    from corral.viewer.sandbox import ViewerLimits
    from corral.viewer.stack import ViewPlan, ViewStack, serve
    from corral.viewer.web import new_token

    layout = find_run(run_ref, runs_dir)
    mission, _ = load_run(layout)
    product = mission.settings.product
    if product is None:
        raise UsageError(f"run {layout.run_id}: its mission has no [product] to view")
    n = session if session is not None else _latest_snapshot(layout.root)
    if n is None or not layout.snapshot(n).is_dir():
        raise UsageError(f"run {layout.run_id}: no snapshot of session {n or '(any)'}")
    kinds = mission.settings.backend
    product_backend = load_backend(backend_config(kinds.product))
    viewer_backend = load_backend(backend_config(kinds.verifier))
    cg = RunCgroup.detect(layout.run_id)
    created = False
    if cg is not None and not cg.exists():
        cg.create(mission.settings.limits.run_memory)
        created = True
    journal = Journal(layout.journal)

    def on_forward(target: str) -> None:
        # On the relay thread; an exception refuses the connection (fail closed).
        journal.append(
            Observation(
                run=layout.run_id,
                session=str(n),
                env="verifier",
                kind="net_connect",
                target=target,
                decision="allow",
                rule="product-port",
                reason="viewer to the product's port through corral's forwarder",
            )
        )

    layout.product_dir(n).mkdir(parents=True, exist_ok=True)
    plan = ViewPlan(
        product_spec(layout, mission, n),
        product.port,
        product.ready_path,
        product.ready_timeout,
        layout.session_dir(n) / "viewer",
        run_id=layout.run_id,
        session_id=str(n),
        parent_cgroup=cg.relpath if cg is not None else None,
        limits=ViewerLimits(memory_bytes=min(1 << 30, mission.settings.limits.run_memory)),
        # The forward to the product is relayed in the run's helpers-forward, charged to it.
        run_cgroup=cg.key if cg is not None else None,
        forward_log=layout.root / "helpers" / "view-forward.log",
    )
    stack: ViewStack | None = None
    try:
        stack = ViewStack(
            plan,
            product_backend=product_backend,
            viewer_backend=viewer_backend,
            on_forward=on_forward,
        )

        async def main(stack: ViewStack) -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)

            def on_url(url: str) -> None:
                print(f"viewer of run {layout.run_id}, session {n}: {url}", flush=True)

            await serve(
                stack,
                port=port,
                token=new_token(),
                stop=stop,
                on_url=on_url,
                runs_dir=runs_dir,
                run_id=layout.run_id,
            )

        asyncio.run(main(stack))
    finally:
        if stack is not None:
            stack.close()
        journal.close()
        if created and cg is not None:
            cg.sweep()
    return 0


def register(app: typer.Typer) -> None:
    @app.command("view")
    def view(
        run_ref: Annotated[str, typer.Argument(metavar="RUN", help="run id, prefix or directory")],
        session: Annotated[int | None, typer.Option("--session", help="session N")] = None,
        port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1 (0: any)")] = 8766,
        runs_dir: Annotated[Path, typer.Option("--runs-dir", help="where runs live")] = Path(
            ".corral/runs"
        ),
    ) -> None:
        """Look at the product of a run without running its code in your browser."""
        from corral.errors import CorralError, UsageError

        if not 0 <= port <= 65535:
            typer.echo("corral view: --port must be in 0..65535", err=True)
            raise typer.Exit(2)
        try:
            code = run_view(run_ref, session, port, runs_dir)
        except UsageError as exc:
            typer.echo(f"corral view: {exc}", err=True)
            raise typer.Exit(2) from exc
        except CorralError as exc:
            typer.echo(f"corral view: {exc}", err=True)
            raise typer.Exit(125) from exc
        sys.exit(code)
