"""`corral allow`, `corral proposals`, `corral approve`: live policy (the CLI shell).

A run's live brokers are found by their control sockets (`broker/control.py`):
the run directory's `control/` for `corral run` runs, the per-user runtime
directory for `corral exec --run ID`. A change goes to every live broker of
the run; each journals it before it takes effect.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from corral.broker.config import RuleConfig
    from corral.broker.livepolicy import Proposal
    from corral.run.environments import RunLayout

__all__ = ["LiveRun", "approve_proposal", "live_run", "locate", "register", "render_proposals"]


@dataclass(frozen=True, slots=True)
class LiveRun:
    """Where one run's live brokers and its journal are."""

    name: str
    sockets: tuple[Path, ...]
    journal: Path | None


def _sockets(directory: Path) -> tuple[Path, ...]:
    if not directory.is_dir():
        return ()
    return tuple(sorted(p for p in directory.iterdir() if p.name.endswith(".sock")))


def live_run(layout: RunLayout) -> LiveRun:
    """A `corral run` run's live brokers (its `control/` sockets) and journal."""
    from corral.broker.control import run_control_dir

    return LiveRun(layout.run_id, _sockets(run_control_dir(layout.root)), layout.journal)


def locate(ref: str, runs_dir: Path | None) -> LiveRun:
    """The run `ref` names: a `corral run` run (id, prefix, directory) or an exec run id."""
    from corral.broker.control import exec_control_dir, request
    from corral.errors import BrokerError, UsageError

    try:
        from corral.run.control import find_run
        from corral.run.runsdir import resolve_runs_dir

        layout = find_run(ref, resolve_runs_dir(runs_dir))
    except UsageError:
        layout = None
    if layout is not None:
        return live_run(layout)
    try:
        directory = exec_control_dir(ref)
    except BrokerError as exc:
        raise UsageError(f"no run {ref!r}") from exc
    sockets = _sockets(directory)
    if not sockets:
        raise UsageError(f"no run {ref!r} (neither a run directory nor a live `corral exec --run`)")
    journal: Path | None = None
    for sock in sockets:
        try:
            answer = request(sock, {"op": "info"})
        except BrokerError:
            continue
        if answer.get("ok") and isinstance(answer.get("journal"), str):
            journal = Path(answer["journal"])
            break
    return LiveRun(ref, sockets, journal)


def _drop_stale(sock: Path) -> None:
    # Nothing listens on it (its broker was SIGKILLed): it must not look live.
    try:
        if stat.S_ISSOCK(os.lstat(sock).st_mode):
            os.unlink(sock)
    except OSError:
        pass


def send_rule(run: LiveRun, rule: RuleConfig, proposal: str | None) -> list[str]:
    """Add `rule` to every live broker of `run`; one line each (BrokerError if none took it)."""
    from corral.broker.control import request
    from corral.display import show
    from corral.errors import BrokerError

    lines: list[str] = []
    applied = 0
    body: dict[str, Any] = {
        "op": "add_rule",
        "rule": rule.model_dump(mode="json"),
        "proposal": proposal,
    }
    for sock in run.sockets:
        try:
            answer = request(sock, body)
        except BrokerError as exc:
            if isinstance(exc.__cause__, ConnectionRefusedError):
                _drop_stale(sock)
            continue
        name = show(sock.name.removesuffix(".sock"), 80)
        if answer.get("ok"):
            applied += 1
            if answer.get("already"):
                lines.append(f"{name}: rule {rule.id} already present")
            else:
                row = answer.get("journal_id")
                lines.append(f"{name}: rule {rule.id} added (journal row {row})")
        else:
            lines.append(f"{name}: refused: {show(answer.get('error'), 300)}")
    if not applied:
        raise BrokerError(f"no live broker took the rule for run {show(run.name, 80)}")
    return lines


def _proposals(run: LiveRun) -> list[Proposal]:
    from corral.broker.journal import iter_rows
    from corral.broker.livepolicy import proposals
    from corral.errors import UsageError

    if run.journal is None:
        raise UsageError(f"run {run.name}: no journal to read proposals from")
    return proposals(iter_rows(run.journal))


def approve_proposal(run: LiveRun, proposal_id: str, *, allow_private: bool) -> list[str]:
    """Turn proposal `proposal_id` into a rule of every live broker of `run`.

    `corral approve` and the dashboard's Approve button both come here. A
    proposal that would admit loopback, private or link-local destinations
    is refused (UsageError) unless `allow_private`; JournalError, BrokerError
    as `send_rule`.
    """
    from corral.errors import UsageError

    found = [p for p in _proposals(run) if p.id == proposal_id]
    if not found:
        raise UsageError(f"no proposal {proposal_id!r} for run {run.name}")
    chosen = found[0]
    if chosen.private and not allow_private:
        raise UsageError(
            f"proposal {chosen.id} would allow private or loopback addresses; "
            "pass --allow-private if that is meant"
        )
    return send_rule(run, chosen.rule, chosen.id)


def render_proposals(items: list[Proposal]) -> Any:
    """The rich table `corral proposals` prints (hosts shown as data)."""
    from rich.table import Table

    from corral.display import text

    table = Table(box=None, header_style="bold")
    for col in ("id", "rule", "count", "first seen", "last seen", "note"):
        table.add_column(col)
    for p in items:
        ports = ",".join(str(x) for x in p.rule.ports)
        table.add_row(
            p.id,
            text(f"{p.rule.host}:{ports}"),
            str(p.count),
            text(p.first_seen),
            text(p.last_seen),
            "private: needs --allow-private" if p.private else "",
        )
    return table


# Module level: typer evaluates the (string) annotations in this module's globals.
_RUNS_OPT = typer.Option("--runs-dir", help="where runs live (as corral status)")
_PRIVATE_OPT = typer.Option(
    "--allow-private", help="permit loopback, private and link-local destinations"
)


def register(app: typer.Typer) -> None:
    """Add `allow`, `proposals` and `approve` to the corral app."""

    def _fail(cmd: str, exc: Exception, code: int) -> typer.Exit:
        from corral.display import show

        typer.echo(f"corral {cmd}: {show(exc, 2000)}", err=True)
        return typer.Exit(code)

    @app.command("allow")
    def allow(
        run: Annotated[str, typer.Argument(metavar="RUN", help="run id (or exec --run id)")],
        rule: Annotated[
            str, typer.Argument(metavar="RULE", help="HOST, HOST:PORT, *.suffix or a JSON rule")
        ],
        allow_private: Annotated[bool, _PRIVATE_OPT] = False,
        runs_dir: Annotated[Path | None, _RUNS_OPT] = None,
    ) -> None:
        """Add an allow rule to a running run; journaled, effective for the next request."""
        from corral.broker.livepolicy import parse_rule
        from corral.errors import BrokerError, UsageError

        try:
            parsed = parse_rule(rule, allow_private=allow_private)
            live = locate(run, runs_dir)
        except UsageError as exc:
            raise _fail("allow", exc, 2) from exc
        try:
            lines = send_rule(live, parsed, None)
        except BrokerError as exc:
            raise _fail("allow", exc, 1) from exc
        for line in lines:
            typer.echo(line)

    @app.command("proposals")
    def proposals_cmd(
        run: Annotated[str, typer.Argument(metavar="RUN", help="run id (or exec --run id)")],
        as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
        runs_dir: Annotated[Path | None, _RUNS_OPT] = None,
    ) -> None:
        """Denials of a run grouped into proposed rules (count, first and last seen)."""
        from corral.errors import JournalError, UsageError

        try:
            items = _proposals(locate(run, runs_dir))
        except UsageError as exc:
            raise _fail("proposals", exc, 2) from exc
        except JournalError as exc:
            raise _fail("proposals", exc, 1) from exc
        if as_json:
            for p in items:
                # ASCII-only: a hostile name cannot act on the terminal.
                sys.stdout.write(json.dumps(p.to_json_dict()) + "\n")
            return
        from rich.console import Console

        if not items:
            typer.echo("no proposals")
            return
        Console().print(render_proposals(items))

    @app.command("approve")
    def approve(
        run: Annotated[str, typer.Argument(metavar="RUN", help="run id (or exec --run id)")],
        proposal_id: Annotated[str, typer.Argument(metavar="PROPOSAL_ID")],
        allow_private: Annotated[bool, _PRIVATE_OPT] = False,
        runs_dir: Annotated[Path | None, _RUNS_OPT] = None,
    ) -> None:
        """Turn one proposal into a rule of the running run."""
        from corral.errors import BrokerError, JournalError, UsageError

        try:
            live = locate(run, runs_dir)
            lines = approve_proposal(live, proposal_id, allow_private=allow_private)
        except UsageError as exc:
            raise _fail("approve", exc, 2) from exc
        except (JournalError, BrokerError) as exc:
            raise _fail("approve", exc, 1) from exc
        for line in lines:
            typer.echo(line)
