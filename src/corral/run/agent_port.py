"""What the coordinator needs from an agent, and where each agent comes from.

The coordinator codes against `RunAgent`: a `corral.agents` adapter
(`launch(LaunchRequest) -> Launch`, `parse_output(stdout, exit) -> AgentResult`,
both pure, and `synthetic_model`) plus `install()`: where its executable is on
the host and which host paths the agent sandbox must see read-only to run it.
The coordinator builds each session's request with
`corral.agents.launch.launch_request`, as `corral agent run` does, so a CLI is
configured the same way in both (e.g. Codex asks the synthetic provider for
`corral-synthetic` and gets its one-entry model catalog).

Agents:

- `claude-code`, `codex`, `gemini`: the real CLIs (`corral.agents`), installed by
  `scripts/install-agents.sh` into `<tools>/npm/<agent>/` (`<tools>` is
  `$CORRAL_TOOLS` or the repository's `tools/`). Not installed ->
  `AgentError` naming the install command.
- `script`: corral's built-in **test agent** (`script_agent.py`), a minimal
  Anthropic-Messages tool loop driven by the synthetic provider's scenario.
  It exists so corral's end-to-end tests need no npm CLI; it is not a
  substitute for a real agent.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from corral._payload import path as payload_path
from corral.agents.base import (
    AgentAdapter,
    AgentResult,
    ConfigFile,
    Launch,
    LaunchRequest,
    Usage,
    WireApi,
    as_int,
    env_pairs,
    json_lines,
)
from corral.errors import AgentError

__all__ = [
    "SCRIPT_AGENT_FILE",
    "AgentInstall",
    "RunAgent",
    "ScriptAgent",
    "resolve_agent",
    "tools_dir",
]

#: Where the built-in test agent's program is (copied into each run's tools/).
SCRIPT_AGENT_FILE = Path(payload_path("script_agent.py"))


@dataclass(frozen=True, slots=True)
class AgentInstall:
    """The agent's executable (a host path, visible at the same path inside) and its ro paths."""

    executable: str
    ro_paths: tuple[str, ...]


class RunAgent(Protocol):
    """One agent as the coordinator uses it."""

    @property
    def name(self) -> str: ...

    @property
    def wire(self) -> WireApi: ...

    @property
    def synthetic_model(self) -> str | None:
        """The model to ask the synthetic provider for when the mission names none."""
        ...

    def install(self, run_tools: Path) -> AgentInstall:
        """Locate (or stage into `run_tools`) the executable; AgentError if missing."""
        ...

    def launch(self, request: LaunchRequest) -> Launch: ...

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult: ...


class ScriptAgent:
    """The built-in test agent (see module docstring). Pure apart from `install`."""

    name = "script"
    wire: WireApi = "anthropic"
    synthetic_model: str | None = None

    def install(self, run_tools: Path) -> AgentInstall:
        run_tools.mkdir(parents=True, exist_ok=True)
        dest = run_tools / "script_agent.py"
        shutil.copyfile(SCRIPT_AGENT_FILE, dest)
        dest.chmod(0o444)
        return AgentInstall(executable=str(dest), ro_paths=(str(run_tools),))

    def launch(self, request: LaunchRequest) -> Launch:
        prompt_file = f"{request.home}/.corral/prompt.md"
        env = {
            "CORRAL_PROVIDER_URL": request.provider.base_url,
            "CORRAL_PROMPT_FILE": prompt_file,
            "CORRAL_API_KEY": request.provider.api_key,
            "CORRAL_MODEL": request.provider.model or "mock-model",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if request.mcp:
            env["CORRAL_MCP_SERVERS"] = json.dumps({m.name: m.url for m in request.mcp})
        return Launch(
            argv=("/usr/bin/python3", "-I", request.executable, *request.extra_args),
            env=env_pairs(env),
            cwd=request.workspace,
            files=(ConfigFile(prompt_file, request.prompt),),
        )

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult:
        results = [e for e in json_lines(stdout) if e.get("type") == "result"]
        if not results:
            return AgentResult(
                status="failed", error=f"the script agent printed no result (exit {exit_code})"
            )
        last = results[-1]
        raw = last.get("usage")
        usage = (
            Usage(as_int(raw.get("input_tokens")), as_int(raw.get("output_tokens")))
            if isinstance(raw, dict)
            else Usage()
        )
        text = str(last.get("result", ""))
        failed = bool(last.get("is_error")) or exit_code != 0
        return AgentResult(
            status="failed" if failed else "succeeded",
            text=None if failed else text,
            error=text if failed else None,
            usage=usage,
            turns=as_int(last.get("num_turns")),
        )


def tools_dir() -> Path:
    """Where `scripts/install-agents.sh` installs the CLIs."""
    env = os.environ.get("CORRAL_TOOLS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "tools"


class _NpmAgent:
    """A `corral.agents` adapter whose CLI lives in `<tools>/npm/<name>/`."""

    def __init__(self, adapter: AgentAdapter) -> None:
        self._adapter = adapter

    @property
    def name(self) -> str:
        return self._adapter.name

    @property
    def wire(self) -> WireApi:
        return self._adapter.wire

    @property
    def synthetic_model(self) -> str | None:
        return self._adapter.synthetic_model

    def install(self, run_tools: Path) -> AgentInstall:
        from corral.agents.install import executable_path, prefix

        exe = executable_path(self._adapter, tools_dir())
        if not exe.exists():
            raise AgentError(
                f"agent CLI '{self.name}' is not installed (looked for {exe}); "
                f"run scripts/install-agents.sh {self.name}"
            )
        return AgentInstall(
            executable=str(exe), ro_paths=(str(prefix(self._adapter, tools_dir()).resolve()),)
        )

    def launch(self, request: LaunchRequest) -> Launch:
        return self._adapter.launch(request)

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult:
        return self._adapter.parse_output(stdout, exit_code)


def resolve_agent(name: str) -> RunAgent:
    """The agent called `name`; AgentError when corral has no such agent."""
    if name == "script":
        return ScriptAgent()
    if name in ("claude-code", "codex", "gemini"):
        from corral.agents.registry import ADAPTERS

        return _NpmAgent(ADAPTERS[name])
    raise AgentError(f"unknown agent {name!r} (known: script, claude-code, codex, gemini)")
