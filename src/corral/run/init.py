"""`corral init [DIR] --describe "…"`: a starter MISSION.md (the text is pure, the shell thin).

The file has the description as its body, the defaults spelled out (agent,
provider, limits, sessions), one check that runs and means something (the
agent left at least one file) and commented examples of the other kinds: an
HTTP check against a product, a restart, a script from `checks_dir`. It is
validated with `parse_mission` before it is written, and never written over
an existing file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["MISSION_FILE", "register", "render_mission", "write_mission"]

MISSION_FILE = "MISSION.md"
_MAX_DESCRIPTION = 64 * 1024

_TEMPLATE = """+++
# Written by `corral init`. Reference: docs/run.md ("The mission file").
agent = {agent}  # script | claude-code | codex | gemini
provider = {provider}  # synthetic:FILE | anthropic | openai | gemini | ...-compatible:URL
max_sessions = 5  # the run ends after this many agent sessions
# token_budget = 2000000  # run-wide token cap

[session]
wall_time = "30m"  # one agent session's wall time

[limits]
run_memory = "4G"  # everything the run starts, together
agent = {{ memory = "2G", pids = 1024 }}
product = {{ memory = "512M", pids = 256 }}
verifier = {{ memory = "1G", pids = 512 }}

# The product, started from a read-only snapshot of each session's commit:
# [product]
# command = "python3 server.py"
# ports = [8000, 8001]  # each forwarded to the checks ($PRODUCT_PORTS)
# ready_path = "/health"
# env = {{ LOG_LEVEL = "info" }}
# data = true  # $CORRAL_DATA: kept across restarts and sessions

# Replace this placeholder with real acceptance checks: it passes once the
# agent has left at least one file in the workspace.
[[checks]]
name = "the workspace is not empty"
run = 'test -n "$(ls -A)"'
timeout = "10s"

# An HTTP check against the product (needs [product]):
# [[checks]]
# name = "health"
# http = "GET /health"
# expect_status = 200
# expect_body = "ok"
#
# The same product restarted first (data = true shows what survived):
# [[checks]]
# name = "survives a restart"
# http = "GET /items"
# restart_product = true
# expect_body = "milk"
#
# A script from a folder the agent never sees (checks_dir = "checks" above):
# [[checks]]
# name = "round trip"
# run = "python3 $CORRAL_CHECKS/test_api.py"
+++
{description}
"""


def _clean(description: str) -> str:
    text = description.replace("\r\n", "\n").strip()
    if not text:
        raise ValueError("the description is empty: pass --describe TEXT or pipe it on stdin")
    if len(text) > _MAX_DESCRIPTION:
        raise ValueError(f"the description is over {_MAX_DESCRIPTION // 1024} KiB")
    bad = next((c for c in text if ord(c) < 32 and c not in "\n\t"), None)
    if bad is not None:
        raise ValueError(f"the description has a control character ({ord(bad):#04x})")
    return text


def render_mission(
    description: str, agent: str = "claude-code", provider: str = "anthropic"
) -> str:
    """The starter mission's text; ValueError for an unusable description or setting."""
    from corral.errors import ConfigError
    from corral.run.mission import parse_mission

    text = _TEMPLATE.format(
        description=_clean(description), agent=json.dumps(agent), provider=json.dumps(provider)
    )
    try:
        parse_mission(text, MISSION_FILE)
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix(f"{MISSION_FILE}:")) from None
    return text


def write_mission(directory: Path, text: str) -> Path:
    """Create `directory/MISSION.md`; FileExistsError if anything is at that name."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MISSION_FILE
    # O_EXCL: never over an existing file, nor through a symlink planted there.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def register(app: typer.Typer) -> None:
    @app.command("init")
    def init(
        directory: Annotated[Path, typer.Argument(help="where to write MISSION.md")] = Path("."),
        describe: Annotated[
            str | None,
            typer.Option("--describe", help="the product description (default: stdin)"),
        ] = None,
        agent: Annotated[str, typer.Option("--agent", help="the mission's agent")] = "claude-code",
        provider: Annotated[
            str, typer.Option("--provider", help="the mission's provider")
        ] = "anthropic",
    ) -> None:
        """Write a starter MISSION.md with the description as its body."""
        if describe is None:
            if sys.stdin.isatty():
                typer.echo("corral init: pass --describe TEXT or pipe the description", err=True)
                raise typer.Exit(2)
            describe = sys.stdin.read(_MAX_DESCRIPTION + 1)
        try:
            text = render_mission(describe, agent, provider)
        except ValueError as exc:
            typer.echo(f"corral init: {exc}", err=True)
            raise typer.Exit(2) from None
        try:
            path = write_mission(directory, text)
        except FileExistsError:
            typer.echo(
                f"corral init: {directory / MISSION_FILE} exists; not overwriting it", err=True
            )
            raise typer.Exit(2) from None
        except OSError as exc:
            typer.echo(f"corral init: cannot write {directory / MISSION_FILE}: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"corral init: wrote {path}")
        typer.echo("edit its checks, then run:")
        typer.echo(f"  corral run {path}")
