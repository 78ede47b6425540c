"""`corral dashboard [--port 8765] [--runs-dir DIR] [--host 127.0.0.1]`."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register", "serve"]

DEFAULT_PORT = 8765


def _loopback_v4(host: str) -> bool:
    # Only this exact address: `localhost` may resolve elsewhere, `0.0.0.0` or
    # `::` listen on every interface, and other 127/8 names are not what the
    # Host check admits.
    try:
        return str(ipaddress.ip_address(host)) == "127.0.0.1"
    except ValueError:
        return False


def serve(runs_dir: Path, port: int, host: str = "127.0.0.1") -> None:
    """Serve until interrupted; prints the URL with the token once it listens."""
    import secrets

    from aiohttp import web

    from corral.dashboard.server import create_app
    from corral.errors import UsageError

    if not _loopback_v4(host):
        raise UsageError(f"the dashboard listens on 127.0.0.1 only (not {host!r})")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port")
    token = secrets.token_urlsafe(32)
    app = create_app(runs_dir, token)

    def _announce(bound: int) -> None:
        print(f"http://127.0.0.1:{bound}/?token={token}", flush=True)

    async def _main() -> None:
        import asyncio

        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=False)
        await site.start()
        _announce(int(runner.addresses[0][1]))
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    import asyncio
    import contextlib

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        port: Annotated[
            int, typer.Option(help="Port on 127.0.0.1 (0: any free one).")
        ] = DEFAULT_PORT,
        runs_dir: Annotated[Path, typer.Option(help="Where the runs are.")] = Path(".corral/runs"),
        host: Annotated[str, typer.Option(help="Only 127.0.0.1 is accepted.")] = "127.0.0.1",
    ) -> None:
        """Serve a page of the runs on http://127.0.0.1:PORT/ (token in the printed URL)."""
        from corral.errors import UsageError

        try:
            serve(runs_dir, port, host)
        except UsageError as exc:
            typer.echo(f"corral dashboard: {exc}", err=True)
            raise typer.Exit(2) from exc
        except OSError as exc:
            typer.echo(f"corral dashboard: cannot listen on {host}:{port}: {exc}", err=True)
            raise typer.Exit(2) from exc
