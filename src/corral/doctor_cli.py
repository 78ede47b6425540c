"""`corral doctor` and the help entry of `corral exec`."""

from __future__ import annotations

import json
import os
import tempfile

import typer

__all__ = ["register"]


def doctor(
    as_json: bool = typer.Option(False, "--json", help="print the layers as JSON"),
    smoke: bool = typer.Option(True, "--smoke/--no-smoke", help="also start a real sandbox once"),
) -> None:
    """Which protection layers this host can provide, and why not."""
    from rich.console import Console

    from corral import doctor as probe

    layers = probe.all_layers()
    rows: list[dict[str, object]] = [
        {
            "layer": s.name,
            "available": s.available,
            "reason": s.reason,
            "hint": s.hint,
            "detail": s.detail,
        }
        for s in layers
    ]
    ready = all(s.available for s in layers if s.name in probe.REQUIRED_LAYERS)
    if smoke and ready:
        ok, reason = _smoke_test()
        rows.append(
            {
                "layer": "sandbox",
                "available": ok,
                "reason": reason,
                "hint": "" if ok else "run `corral exec --json -- true` for details",
                "detail": {},
            }
        )
        ready = ready and ok
    if as_json:
        typer.echo(json.dumps({"ready": ready, "layers": rows}, indent=2))
        raise typer.Exit(0 if ready else 1)
    from corral.doctorview import plain_lines, render_layers

    console = Console()
    if console.is_terminal:
        console.print(render_layers(rows))
    else:
        typer.echo("\n".join(plain_lines(rows)))
    if ready:
        console.print("[green]The default namespace profile can run on this host.[/]")
    else:
        missing = [
            str(r["layer"])
            for r in rows
            if not r["available"]
            and (r["layer"] in probe.REQUIRED_LAYERS or r["layer"] == "sandbox")
        ]
        console.print(
            f"[red]The default profile cannot run: missing {', '.join(missing)}.[/] "
            "`corral exec --allow-degraded LAYER` runs without a layer, at your own risk."
        )
    raise typer.Exit(0 if ready else 1)


def _smoke_test() -> tuple[bool, str]:
    from corral.errors import CorralError
    from corral.exec.cli import sandbox_env
    from corral.sandbox.backend import NamespaceConfig
    from corral.sandbox.reaper import become_subreaper
    from corral.sandbox.spec import SandboxSpec

    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as ws:
        os.chmod(ws, 0o700)
        spec = SandboxSpec(
            argv=("true",), workspace=ws, env=tuple(sorted(sandbox_env("/home/corral", {}).items()))
        )
        try:
            become_subreaper()
            running = NamespaceConfig().load().start(spec)
        except (CorralError, OSError) as exc:
            return False, f"a real sandbox failed to start: {exc}"
        try:
            result = running.wait(30)
        finally:
            running.close()
    if result.exit != 0:
        return False, f"`true` in a sandbox exited {result.exit} ({result.reason})"
    return True, f"`corral exec -- true` works ({result.wall_s * 1000:.0f} ms)"


def _exec_help() -> None:
    """Run one command in a sandbox: corral exec [options] -- CMD [ARG...]."""


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    app.command(
        "exec",
        help="Run one command in a sandbox (see `corral exec --help`).",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(_exec_help)
