"""Pinned agent CLIs from npm in corral's tools folder (never global).

Each agent has its own npm prefix, `<tools>/npm/<agent>/`, so installing one
never touches another; the sandbox mounts that prefix read-only at the same
path. `<tools>` is `$CORRAL_TOOLS`, else `tools/` in the source checkout
corral runs from, else `~/.local/share/corral/tools`. The shell twin of
`install()` is scripts/install-agents.sh (CI calls it); a unit test checks
that both pin the same versions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from corral.agents.base import AgentAdapter
from corral.errors import AgentError

__all__ = [
    "default_tools_dir",
    "executable_path",
    "install",
    "installed_version",
    "npm_install_argv",
    "prefix",
]


def default_tools_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where agent CLIs are installed (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("CORRAL_TOOLS"):
        return Path(env["CORRAL_TOOLS"]).resolve()
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "pyproject.toml").is_file() and (checkout / "src" / "corral").is_dir():
        return checkout / "tools"
    return Path.home() / ".local" / "share" / "corral" / "tools"


def prefix(adapter: AgentAdapter, tools_dir: Path) -> Path:
    """The npm prefix of `adapter` (what the sandbox mounts read-only)."""
    return tools_dir / "npm" / adapter.name


def executable_path(adapter: AgentAdapter, tools_dir: Path) -> Path:
    """The CLI's executable below its prefix (it may not exist yet)."""
    return prefix(adapter, tools_dir) / "node_modules" / adapter.package.executable


def installed_version(adapter: AgentAdapter, tools_dir: Path) -> str | None:
    """The version installed in the prefix, or None."""
    manifest = prefix(adapter, tools_dir) / "node_modules" / adapter.package.name / "package.json"
    try:
        version = json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def npm_install_argv(adapter: AgentAdapter, tools_dir: Path, npm: str = "npm") -> list[str]:
    """The npm command that installs the pinned version (pure)."""
    return [
        npm,
        "install",
        "--prefix",
        str(prefix(adapter, tools_dir)),
        "--save-exact",
        "--no-fund",
        "--no-audit",
        "--loglevel=error",
        adapter.package.spec,
    ]


def install(adapter: AgentAdapter, tools_dir: Path | None = None, timeout_s: float = 600) -> Path:
    """Install the pinned CLI unless that version is already there; its executable.

    Raises AgentError when npm is missing or fails.
    """
    tools = tools_dir or default_tools_dir()
    exe = executable_path(adapter, tools)
    if installed_version(adapter, tools) == adapter.package.version and exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise AgentError("npm is not installed (apt-get install npm)")
    prefix(adapter, tools).mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            npm_install_argv(adapter, tools, npm),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AgentError(f"npm install {adapter.package.spec} failed: {exc}") from exc
    if proc.returncode != 0 or not exe.exists():
        tail = (proc.stderr or proc.stdout).strip()[-1000:]
        raise AgentError(f"npm install {adapter.package.spec} failed: {tail or 'no executable'}")
    return exe
