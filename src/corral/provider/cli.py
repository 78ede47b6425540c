"""`corral provider` commands: serve a scenario, or check one."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from corral.provider.scenario import Scenario

__all__ = ["register"]

_ScenarioArg = Annotated[
    Path, typer.Option("--scenario", "-s", help="Scenario YAML file (see docs/scenarios.md).")
]


def _load(path: Path) -> Scenario:
    from corral.provider.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(path)
    except ScenarioError as exc:
        print(f"corral provider: {exc}", file=sys.stderr)
        raise typer.Exit(2) from exc


async def _serve(scenario: Scenario, host: str, port: int, transcript: Path | None) -> None:
    from corral.provider.server import serve_provider

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serve_provider(scenario, host=host, port=port, transcript=transcript) as server:
        # One parseable line: callers started as a subprocess wait for it to learn the port.
        print(f"corral provider listening on {server.url}", flush=True)
        await stop.wait()


def register(app: typer.Typer) -> None:
    """Add `corral provider serve|check` to the corral app."""
    provider = typer.Typer(
        name="provider",
        help="The synthetic LLM API, scripted by a scenario file.",
        no_args_is_help=True,
    )

    @provider.command("serve")
    def serve(
        scenario: _ScenarioArg,
        port: Annotated[
            int, typer.Option("--port", "-p", help="TCP port; 0 picks a free one.")
        ] = 0,
        host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
        transcript: Annotated[
            Path | None,
            typer.Option("--transcript", help="Append every exchange to this JSONL file."),
        ] = None,
    ) -> None:
        """Serve the Anthropic, OpenAI and Gemini wire formats, replying from SCENARIO."""
        from corral.errors import CorralError

        loaded = _load(scenario)
        try:
            asyncio.run(_serve(loaded, host, port, transcript))
        except CorralError as exc:
            print(f"corral provider: {exc}", file=sys.stderr)
            raise typer.Exit(1) from exc

    @provider.command("check")
    def check(scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")]) -> None:
        """Validate a scenario file; print its turns, or the errors with their line numbers."""
        loaded = _load(scenario)
        print(f"{scenario}: scenario {loaded.name!r} is valid")
        for i, turn in enumerate(loaded.turns):
            what = "choose" if turn.choose else ", ".join(c.describe() for c in turn.calls) or "say"
            print(f"  turn {i}: {turn.label or what}")
        for conv in loaded.conversations:
            print(f"  conversation /{conv.prompt}/: {len(conv.turns)} turn(s)")

    app.add_typer(provider, name="provider")
