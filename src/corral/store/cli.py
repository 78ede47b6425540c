"""`corral worker`, `corral submit`, and the `--store` paths of `corral run` / `corral status`.

Exit status: 0 success (`run`: every check passed), 1 the run ended
otherwise or a worker failed, 2 bad input (a bad URL, mission), 3 the store
cannot be reached or migrated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["STORE_OPTION", "register", "run_in_store", "status_from_store"]

STORE_OPTION = typer.Option(
    "--store", help="postgresql://… (default: CORRAL_STORE, else SQLite in the run directory)"
)
_WORK_DIR = typer.Option("--work-dir", help="where this worker materializes the runs it drives")


def _fail(cmd: str, message: str, code: int) -> typer.Exit:
    from corral.display import show

    typer.echo(f"corral {cmd}: {show(message, 2000)}", err=True)
    return typer.Exit(code)


def _fleet(cmd: str, url: str):  # type: ignore[no-untyped-def]
    from corral.errors import StoreError
    from corral.store import open_fleet

    try:
        return open_fleet(url)
    except StoreError as exc:
        raise _fail(cmd, str(exc), 3) from exc


def _url(cmd: str, option: str | None, required: bool = True) -> str | None:
    from corral.errors import UsageError
    from corral.store import store_url

    try:
        url = store_url(option)
    except UsageError as exc:
        raise _fail(cmd, str(exc), 2) from exc
    if url is None and required:
        raise _fail(cmd, "needs --store postgresql://… or CORRAL_STORE", 2)
    return url


def _submit(
    cmd: str,
    url: str,
    mission: Path,
    *,
    agent: str | None,
    provider: str | None,
    run_id: str | None,
    provider_key: str | None = None,
) -> str:
    from corral.errors import AgentError, ConfigError, StoreError, UsageError
    from corral.store.worker import submit

    with _fleet(cmd, url) as fleet:
        try:
            return submit(
                mission,
                fleet,
                agent=agent,
                provider=provider,
                provider_key=provider_key,
                run_id=run_id,
            )
        except (ConfigError, UsageError, AgentError, FileExistsError) as exc:
            raise _fail(cmd, str(exc), 2) from exc
        except StoreError as exc:
            raise _fail(cmd, str(exc), 3) from exc


def run_in_store(
    url: str,
    mission: Path,
    *,
    agent: str | None,
    provider: str | None,
    run_id: str | None,
    runs_dir: Path,
    plain: bool,
    provider_key: str | None = None,
) -> None:
    """`corral run --store`: queue the run, then drive it here under a lease."""
    from corral.errors import CorralError
    from corral.run.progress import PlainProgress, make_progress
    from corral.store.worker import work

    rid = _submit(
        "run",
        url,
        mission,
        agent=agent,
        provider=provider,
        run_id=run_id,
        provider_key=provider_key,
    )
    typer.echo(f"corral run: run {rid} queued in the store; driving it here")
    progress = PlainProgress() if plain else make_progress()
    try:
        rep = work(url, runs_dir, progress=progress, max_runs=1, only=rid)
    except CorralError as exc:
        raise _fail("run", str(exc), 1) from exc
    finally:
        progress.close()
    state = rep.driven[0][1] if rep.driven else "not driven"
    typer.echo(f"corral run: run {rid} {state}")
    raise typer.Exit(0 if state == "passed" else 1)


def status_from_store(url: str, as_json: bool) -> None:
    """`corral status --store`: every run of the fleet."""
    from rich.console import Console
    from rich.table import Table

    from corral.display import text

    with _fleet("status", url) as fleet:
        rows = fleet.runs()
        counts = {q.run.id: fleet.session_counts(q.run.id) for q in rows}
    if as_json:
        for q in rows:
            done, attempts = counts[q.run.id]
            sys.stdout.write(
                json.dumps(
                    {
                        "id": q.run.id,
                        "state": q.run.state,
                        "sessions": done,
                        "interrupted_attempts": attempts,
                        "max_sessions": q.run.max_sessions,
                        "worker": q.lease_owner if q.lease_live else None,
                        "takeovers": q.takeovers,
                        "end_reason": q.run.end_reason,
                    }
                )
                + "\n"
            )
        return
    table = Table(show_header=True, header_style="bold")
    for col in ("run", "state", "sessions", "worker", "takeovers", "ended because"):
        table.add_column(col)
    for q in rows:
        done, attempts = counts[q.run.id]
        table.add_row(
            text(q.run.id),
            text(q.run.state),
            text(
                f"{done}/{q.run.max_sessions}" + (f" (+{attempts} interrupted)" if attempts else "")
            ),
            text(q.lease_owner if q.lease_live and q.lease_owner else ""),
            text(str(q.takeovers)),
            text(q.run.end_reason or "", limit=120),
        )
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add `corral worker`, `corral submit` and `corral store-init`."""

    @app.command("submit")
    def submit_cmd(  # noqa: PLR0917
        mission: Annotated[Path, typer.Argument(help="the mission file (Markdown + TOML)")],
        store: Annotated[str | None, STORE_OPTION] = None,
        agent: Annotated[
            str | None, typer.Option("--agent", help="script | claude-code | codex")
        ] = None,
        provider: Annotated[
            str | None, typer.Option("--provider", help="synthetic[:FILE] | …")
        ] = None,
        run_id: Annotated[str | None, typer.Option("--id", help="the run's id")] = None,
        provider_key: Annotated[
            str | None,
            typer.Option(
                "--provider-key", help="a compatible provider's key: env:NAME | file:/PATH"
            ),
        ] = None,
    ) -> None:
        """Queue a run in the shared store; any `corral worker` drives it."""
        url = _url("submit", store)
        assert url is not None
        if run_id is not None and (not run_id[:1].isalpha() or "/" in run_id):
            raise _fail("submit", f"a run id starts with a letter and has no '/': {run_id!r}", 2)
        rid = _submit(
            "submit",
            url,
            mission,
            agent=agent,
            provider=provider,
            run_id=run_id,
            provider_key=provider_key,
        )
        typer.echo(f"corral submit: run {rid} queued")

    @app.command("store-init")
    def store_init_cmd(
        store: Annotated[str | None, STORE_OPTION] = None,
        worker_role: Annotated[
            str | None,
            typer.Option("--worker-role", help="grant this role what a worker needs, no more"),
        ] = None,
    ) -> None:
        """As the schema's owner: create or migrate the shared store (and grant a worker role)."""
        from corral.errors import StoreError, UsageError
        from corral.store.postgres import grant_worker

        url = _url("store-init", store)
        assert url is not None
        with _fleet("store-init", url) as fleet:
            if worker_role is not None:
                try:
                    grant_worker(fleet._conn, worker_role)
                except UsageError as exc:
                    raise _fail("store-init", str(exc), 2) from exc
                except StoreError as exc:
                    raise _fail("store-init", str(exc), 3) from exc
        typer.echo(
            "corral store-init: schema current"
            + (f"; {worker_role} granted" if worker_role else "")
        )

    @app.command("worker")
    def worker_cmd(  # noqa: PLR0917
        store: Annotated[str | None, STORE_OPTION] = None,
        max_runs: Annotated[
            int | None, typer.Option("--max-runs", min=1, help="stop after N runs")
        ] = None,
        work_dir: Annotated[Path, _WORK_DIR] = Path(".corral/worker"),
        lease: Annotated[
            float, typer.Option("--lease", min=1.0, help="lease expiry, seconds")
        ] = 30.0,
        idle_exit: Annotated[
            float | None, typer.Option("--idle-exit", help="exit once the queue is empty this long")
        ] = None,
        plain: Annotated[bool, typer.Option("--plain", help="plain progress lines")] = False,
    ) -> None:
        """Take queued runs from the store and drive them, one at a time, under a lease."""
        from corral.errors import CorralError
        from corral.run.progress import PlainProgress, make_progress
        from corral.store.worker import work

        url = _url("worker", store)
        assert url is not None
        progress = PlainProgress() if plain else make_progress()
        try:
            rep = work(
                url,
                work_dir,
                progress=progress,
                max_runs=max_runs,
                ttl_s=lease,
                idle_exit_s=idle_exit,
            )
        except CorralError as exc:
            raise _fail("worker", str(exc), 1) from exc
        finally:
            progress.close()
        for rid, state in rep.driven:
            typer.echo(f"corral worker: run {rid} {state}")
