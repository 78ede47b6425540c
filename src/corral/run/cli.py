"""`corral run`, `status`, `top`, `pause`, `resume`, `stop` (the journal: `corral log`).

Exit status of `run`/`resume`: 0 when every check passed, 1 when the run ended
otherwise (exhausted, stopped, failed), 2 for bad input (a rejected mission
file, an unknown run, an agent that is not installed), 3 when the run is
already being driven by another corral process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]

_RUNS_DIR = typer.Option(
    "--runs-dir",
    help="where runs live (default: $CORRAL_RUNS_DIR, else the nearest .corral/runs upward)",
)
_STORE = typer.Option("--store", help="postgresql://… (default: CORRAL_STORE, else SQLite)")


def _store_url(cmd: str, option: str | None) -> str | None:
    from corral.errors import UsageError
    from corral.store import store_url

    try:
        return store_url(option)
    except UsageError as exc:
        raise _fail(cmd, str(exc), 2) from exc


def _fail(cmd: str, message: str, code: int) -> typer.Exit:
    from corral.display import show

    # Messages can quote the workspace (a git error naming a file).
    typer.echo(f"corral {cmd}: {show(message, 2000)}", err=True)
    return typer.Exit(code)


def _runs(cmd: str, given: Path | None, *, create: bool = False) -> Path:
    from corral.errors import UsageError
    from corral.run.runsdir import resolve_runs_dir

    try:
        return resolve_runs_dir(given, create=create)
    except UsageError as exc:
        raise _fail(cmd, str(exc), 2) from exc


def _drive(cmd: str, layout_root: Path, plain: bool) -> None:
    from corral.errors import CorralError, LayerUnavailableError, UsageError
    from corral.run.coordinator import Coordinator
    from corral.run.environments import RunLayout
    from corral.run.progress import PlainProgress, make_progress
    from corral.run.store import RunLockedError

    layout = RunLayout(layout_root)
    progress = PlainProgress() if plain else make_progress()
    try:
        state = Coordinator(layout, progress).drive()
    except RunLockedError as exc:
        raise _fail(cmd, str(exc), 3) from exc
    except LayerUnavailableError as exc:
        # The mission's backend (or a layer it needs) is missing: refused, as in corral exec.
        raise _fail(cmd, f"refused: {exc}", 125) from exc
    except UsageError as exc:
        raise _fail(cmd, str(exc), 2) from exc
    except CorralError as exc:
        raise _fail(cmd, str(exc), 1) from exc
    finally:
        progress.close()
    typer.echo(f"corral {cmd}: run {layout.run_id} {state}; report: {layout.report}")
    raise typer.Exit(0 if state == "passed" else 1)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the corral app."""
    from corral.run.init import register as register_init

    register_init(app)

    @app.command("run")
    def run(  # noqa: PLR0917
        mission: Annotated[Path, typer.Argument(help="the mission file (Markdown + TOML)")],
        agent: Annotated[
            str | None, typer.Option("--agent", help="script | claude-code | codex | gemini")
        ] = None,
        provider: Annotated[
            str | None,
            typer.Option(
                "--provider",
                help="synthetic[:FILE] | anthropic | openai | gemini | anthropic-compatible:URL"
                " | openai-compatible:URL",
            ),
        ] = None,
        provider_key: Annotated[
            str | None,
            typer.Option(
                "--provider-key", help="a compatible provider's key: env:NAME | file:/PATH"
            ),
        ] = None,
        runs_dir: Annotated[Path | None, _RUNS_DIR] = None,
        run_id: Annotated[str | None, typer.Option("--id", help="the run's id")] = None,
        plain: Annotated[bool, typer.Option("--plain", help="plain progress lines")] = False,
        store: Annotated[str | None, _STORE] = None,
    ) -> None:
        """Drive an agent through sessions until the mission's checks pass."""
        from corral.errors import AgentError, ConfigError, RunDiskError, UsageError
        from corral.run.coordinator import create_run
        from corral.run.mission import load_mission
        from corral.run.rundisk import sweep_stale

        if run_id is not None and (not run_id[:1].isalpha() or "/" in run_id):
            raise _fail("run", f"a run id starts with a letter and has no '/': {run_id!r}", 2)
        runs_dir = _runs("run", runs_dir, create=True)
        if (url := _store_url("run", store)) is not None:
            from corral.store.cli import run_in_store

            run_in_store(
                url,
                mission,
                agent=agent,
                provider=provider,
                run_id=run_id,
                runs_dir=runs_dir,
                plain=plain,
                provider_key=provider_key,
            )
        try:
            sweep_stale(runs_dir)
            m = load_mission(mission, provider, provider_key)
            layout = create_run(m, runs_dir, agent=agent, run_id=run_id)
        except RunDiskError as exc:
            # The run's disk quota could not be set up: refused, like a missing layer.
            raise _fail("run", f"refused: {exc}", 125) from exc
        except (ConfigError, UsageError, AgentError, FileExistsError) as exc:
            raise _fail("run", str(exc), 2) from exc
        typer.echo(f"corral run: run {layout.run_id} in {layout.root}")
        _drive("run", layout.root, plain)

    @app.command("resume")
    def resume(
        run_ref: Annotated[str, typer.Argument(metavar="RUN", help="run id or directory")],
        runs_dir: Annotated[Path | None, _RUNS_DIR] = None,
        plain: Annotated[bool, typer.Option("--plain", help="plain progress lines")] = False,
    ) -> None:
        """Thaw a paused run, or continue one after a stop, a crash or a reboot."""
        runs_dir = _runs("resume", runs_dir)
        from corral.errors import CorralError, RunDiskError, UsageError
        from corral.run.control import find_run
        from corral.run.pause import thaw_run
        from corral.run.rundisk import sweep_stale
        from corral.run.store import RunLock

        try:
            sweep_stale(runs_dir)
            layout = find_run(run_ref, runs_dir)
            driven = RunLock.is_held(layout.root)
            thawed = thaw_run(layout)
        except UsageError as exc:
            raise _fail("resume", str(exc), 2) from exc
        except RunDiskError as exc:
            raise _fail("resume", f"refused: {exc}", 125) from exc
        except CorralError as exc:
            raise _fail("resume", str(exc), 1) from exc
        if thawed and driven:
            typer.echo(f"corral resume: run {layout.run_id} resumed")
            raise typer.Exit(0)
        _drive("resume", layout.root, plain)

    @app.command("pause")
    def pause(
        run_ref: Annotated[str, typer.Argument(metavar="RUN", help="run id or directory")],
        runs_dir: Annotated[Path | None, _RUNS_DIR] = None,
    ) -> None:
        """Freeze every process of a run where it is; `corral resume` thaws it."""
        runs_dir = _runs("pause", runs_dir)
        from corral.errors import CorralError, UsageError
        from corral.run.control import find_run
        from corral.run.pause import pause_run

        try:
            layout = find_run(run_ref, runs_dir)
            fresh = pause_run(layout)
        except UsageError as exc:
            raise _fail("pause", str(exc), 2) from exc
        except CorralError as exc:
            raise _fail("pause", str(exc), 1) from exc
        what = "paused" if fresh else "already paused"
        typer.echo(f"corral pause: run {layout.run_id} {what}")

    @app.command("stop")
    def stop(
        run_ref: Annotated[str, typer.Argument(metavar="RUN", help="run id or directory")],
        runs_dir: Annotated[Path | None, _RUNS_DIR] = None,
        timeout: Annotated[float, typer.Option("--timeout", help="seconds before SIGKILL")] = 20.0,
    ) -> None:
        """Kill everything of a run; its state is kept for `corral resume`."""
        runs_dir = _runs("stop", runs_dir)
        from corral.errors import UsageError
        from corral.run.control import find_run, stop_run
        from corral.run.store import RunLockedError

        try:
            layout = find_run(run_ref, runs_dir)
            state = stop_run(layout, timeout)
        except UsageError as exc:
            raise _fail("stop", str(exc), 2) from exc
        except RunLockedError as exc:
            raise _fail("stop", str(exc), 3) from exc
        typer.echo(f"corral stop: run {layout.run_id} {state}")

    @app.command("status")
    def status(
        run_ref: Annotated[
            str | None, typer.Argument(metavar="[RUN]", help="one run (default: all)")
        ] = None,
        runs_dir: Annotated[Path | None, _RUNS_DIR] = None,
        as_json: Annotated[bool, typer.Option("--json", help="one JSON object per run")] = False,
        store: Annotated[str | None, _STORE] = None,
    ) -> None:
        """Every run: agent, start, state, session n/N, checks passing, allowed/denied."""
        if (url := _store_url("status", store)) is not None:
            from corral.store.cli import status_from_store

            status_from_store(url, as_json)
            return
        runs_dir = _runs("status", runs_dir)
        from rich.console import Console

        from corral.display import text
        from corral.errors import UsageError
        from corral.run.control import find_run, list_runs, run_status
        from corral.run.statusview import detail_lines, plain_line, render_statuses

        try:
            layouts = [find_run(run_ref, runs_dir)] if run_ref else list_runs(runs_dir)
        except UsageError as exc:
            raise _fail("status", str(exc), 2) from exc
        statuses = [run_status(layout) for layout in layouts]
        if as_json:
            for st in statuses:
                sys.stdout.write(json.dumps(st.to_json_dict()) + "\n")
            return
        if not statuses:
            typer.echo(f"no runs in {runs_dir}")
            return
        console = Console()
        # One run asked for by name: what went wrong in it, line by line.
        detail = detail_lines(statuses[0]) if run_ref else []
        if not console.is_terminal:
            # Piped: one line a run, no table whose width would be guessed.
            for st in statuses:
                sys.stdout.write(plain_line(st) + "\n")
            sys.stdout.writelines(line + "\n" for line in detail)
            return
        console.print(render_statuses(statuses, console.width))
        for line in detail:
            console.print(text(line), soft_wrap=False, overflow="fold")

    @app.command("top")
    def top(
        runs_dir: Annotated[Path | None, _RUNS_DIR] = None,
        once: Annotated[bool, typer.Option("--once", help="one table, then exit")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="one JSON object per row")] = False,
    ) -> None:
        """Each live run and environment: memory (current/peak/cap), CPU %, pids, PSI."""
        runs_dir = _runs("top", runs_dir)
        from rich.console import Console

        from corral.run.control import list_runs
        from corral.run.footprint import top_rows

        console = Console()
        while True:
            rows = top_rows(list_runs(runs_dir), interval_s=0.5 if once else 1.0)
            if as_json:
                for row in rows:
                    sys.stdout.write(json.dumps(row.to_json_dict()) + "\n")
                sys.stdout.flush()
            else:
                if not once:
                    console.clear()
                console.print(_top_table(rows) if rows else f"no live runs in {runs_dir}")
            if once:
                return


def _top_table(rows: list[Any]) -> Any:
    from rich.table import Table

    from corral.display import text

    def mib(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**20:.0f}"

    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("run", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("env", no_wrap=True)
    for col in ("MiB now", "peak", "cap", "CPU %", "pids", "PSI10"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        # Text cells: run ids come from directory names.
        table.add_row(
            text(r.run),
            text(r.env),
            text(mib(r.memory_bytes)),
            text(mib(r.peak_bytes)),
            text(mib(r.cap_bytes)),
            text(f"{r.cpu_percent:.1f}"),
            text(r.pids),
            text("-" if r.pressure_some_avg10 is None else f"{r.pressure_some_avg10:.1f}"),
        )
    return table
