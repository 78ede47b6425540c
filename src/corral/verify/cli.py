"""`corral verify`: the red-team suite against one backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral.verify.backends import BACKENDS as _BACKENDS
from corral.verify.model import CATEGORIES as _CATEGORIES

if TYPE_CHECKING:
    from rich.console import Console

    from corral.verify.report import Report
    from corral.verify.runner import SuiteOptions

__all__ = ["register"]


def verify(  # noqa: PLR0917 (typer maps parameters to options)
    backend: Annotated[str, typer.Option(help=f"one of: {', '.join(_BACKENDS)}")] = "namespace",
    env: Annotated[
        str, typer.Option(help="environment profile passed to `corral exec --env`")
    ] = "agent",
    category: Annotated[
        list[str] | None, typer.Option(help="run only this category (repeatable)")
    ] = None,
    probe: Annotated[
        list[str] | None, typer.Option(help="run only probes with this id or id prefix")
    ] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="write the full JSON report here")
    ] = None,
    markdown: Annotated[Path | None, typer.Option(help="write a Markdown report here")] = None,
    jobs: Annotated[int, typer.Option(min=1, max=32, help="probes run concurrently")] = 4,
    workdir: Annotated[
        str | None, typer.Option(help="empty directory for workspaces (default: /var/tmp)")
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="keep the work directory (workspaces, mission runs) for inspection")
    ] = False,
    netns: Annotated[
        bool, typer.Option(help="build the canary network namespace (needs root)")
    ] = True,
    list_probes: Annotated[bool, typer.Option("--list", help="list the probes and exit")] = False,
) -> None:
    """Attack a sandbox backend with the probe suite and judge each requirement.

    Exit status: 0 when no mandatory requirement failed, 1 when one did,
    2 for bad usage, 3 when the suite could not run.
    """
    from rich.console import Console

    from corral.verify.report import render, to_json, to_markdown
    from corral.verify.runner import SuiteOptions, VerifyError, run_suite, select_probes

    if backend not in _BACKENDS:
        raise typer.BadParameter(f"unknown backend {backend!r}; one of {', '.join(_BACKENDS)}")
    bad = [c for c in category or [] if c not in _CATEGORIES]
    if bad:
        raise typer.BadParameter(f"unknown category {bad[0]!r}; one of {', '.join(_CATEGORIES)}")
    console = Console(stderr=False)
    if list_probes:
        for p in select_probes(category or (), probe or ()):
            line = f"{p.id:40} {p.category:15} {p.requirement:4} {p.expected:8} {p.description}"
            sys.stdout.write(line + "\n")
        raise typer.Exit(0)
    opts = SuiteOptions(
        backend=backend,
        env=env,
        categories=tuple(category or ()),
        probe_ids=tuple(probe or ()),
        jobs=jobs,
        workdir=workdir,
        keep=keep,
        netns=netns,
    )
    err = Console(stderr=True)
    from corral.verify.stop import interrupt_on_signals

    interrupt_on_signals()
    try:
        report = _with_bar(opts, err) if err.is_terminal else run_suite(opts, _plain_progress)
    except VerifyError as exc:
        err.print(f"corral verify: {exc}", markup=False, highlight=False)
        raise typer.Exit(3) from None
    if json_file is not None:
        json_file.write_text(
            json.dumps(to_json(report), indent=2, default=str) + "\n", encoding="utf-8"
        )
    if markdown is not None:
        markdown.write_text(to_markdown(report), encoding="utf-8")
    render(report, console)
    raise typer.Exit(report.exit_code)


def _plain_progress(item: object, done: int, total: int) -> None:
    from corral.verify.model import ProbeResult, Skipped

    if isinstance(item, ProbeResult):
        text = f"{item.probe.id}: {item.observed} ({item.verdict}) {item.wall_s:.2f}s"
    elif isinstance(item, Skipped):
        text = f"{item.probe.id}: {item.status} ({item.reason[:80]})"
    else:
        return
    from corral.display import show

    sys.stderr.write(f"[{done}/{total}] {show(text, 500)}\n")
    sys.stderr.flush()


def _with_bar(opts: SuiteOptions, err: Console) -> Report:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from corral.verify.model import ProbeResult
    from corral.verify.runner import run_suite

    columns = (
        TextColumn("corral verify"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    from corral.display import text
    from corral.verify.model import Skipped
    from corral.verify.runner import select_probes
    from corral.verify.tally import CategoryTally

    tally = CategoryTally(p.category for p in select_probes(opts.categories, opts.probe_ids))
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("", total=None)

        def step(item: object, done: int, total: int) -> None:
            name = item.probe.id if isinstance(item, ProbeResult) else ""
            bar.update(task, completed=done, total=total, description=name)
            if isinstance(item, ProbeResult | Skipped):
                outcome = item.verdict if isinstance(item, ProbeResult) else item.status
                line = tally.add(item.probe.category, outcome)
                if line is not None:
                    bar.console.print(text(line, limit=500))

        return run_suite(opts, step)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the corral app."""
    app.command("verify")(verify)
