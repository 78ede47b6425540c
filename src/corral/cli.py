"""The `corral` command line.

`corral exec` is dispatched before typer is imported: it is started once per
sandboxed command and its start-up time is part of every sandbox's latency.
Every other command goes through the typer app, whose areas register their own
commands (each area owns its `cli.py`).
"""

from __future__ import annotations

import os
import sys
from importlib import import_module

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import NoReturn

    import typer

__all__ = ["build_app", "entry", "main"]

# Each module exposes `register(app: typer.Typer) -> None`.
_AREAS: tuple[str, ...] = (
    "corral.doctor_cli",
    "corral.broker.cli",
    "corral.provider.cli",
    "corral.verify.cli",
    "corral.run.cli",
    "corral.agents.cli",
    "corral.dashboard.cli",
    "corral.k8s.cli",
    "corral.store.cli",
    "corral.viewer.cli",
)


def build_app() -> typer.Typer:
    import typer

    app = typer.Typer(
        name="corral",
        help="Run coding agents unattended with verifiable host guarantees.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    def _version(value: bool) -> None:
        if value:
            from corral import __version__

            typer.echo(f"corral {__version__}")
            raise typer.Exit(0)

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", is_eager=True, callback=_version, help="print the version and exit"
        ),
    ) -> None:
        """Run coding agents unattended with verifiable host guarantees."""

    for name in _AREAS:
        import_module(name).register(app)
    return app


def _exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's shutdown.

    Tearing down ~140 modules and a last garbage collection cost `corral
    exec -- true` a fifth of its CPU time. `run_exec` has already closed what
    it opened (an ExitStack: sandbox, cgroup, journal, broker), so only the
    standard streams need flushing; a failed flush exits 120, as the
    interpreter would. When anything is still registered to run at exit (an
    atexit handler: logging's flush; a thread pool's join) or a thread is
    still alive, the ordinary exit runs it.
    """
    import atexit
    import threading

    if (
        atexit._ncallbacks()
        or getattr(threading, "_threading_atexits", None)
        or threading.active_count() > 1
    ):
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        code = 120
    os._exit(code)


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["exec"]:
        from corral.exec.cli import run_exec

        # Set by the compiled front end when it found no (current) launcher.
        start_launcher = os.environ.pop("CORRAL_LAUNCHER_START", None) is not None
        code = run_exec(argv[1:])
        if start_launcher:
            from corral.exec.launcher import start_in_background

            start_in_background()
        sys.exit(code)
    build_app()(prog_name="corral")


def entry() -> None:
    """The `corral` program (console script, `python -m corral`): `main`, then a fast exit.

    `main` itself ends with SystemExit, so a caller in the same process can
    catch it; only the program's own entry may leave without the shutdown.
    """
    try:
        main()
    except SystemExit as exc:
        if sys.argv[1:2] != ["exec"] or not isinstance(exc.code, int):
            raise
        _exit_now(exc.code)
