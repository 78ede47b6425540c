"""The contract every agent CLI adapter implements, and the data it works on (pure).

An adapter turns a `LaunchRequest` (the prompt, the executable, where the
model provider and the MCP gateway are *as seen by the agent*) into a
`Launch` (argv, environment, config files for the fresh HOME), and turns what
the CLI printed into an `AgentResult`. Both directions are pure functions,
golden-tested in tests/unit/agents; `corral.run.session` is the shell that
starts processes.

Config files and the wrapper script
-----------------------------------
Inside corral the agent's HOME is a tmpfs that is created empty when the
sandbox starts, and every CLI writes below its config directory while it runs
(`~/.claude.json`, `$CODEX_HOME/sessions`, `~/.gemini/tmp`). A read-only mount
of prepared files would therefore not do, and a writable one would be host
state to stage and clean up. Instead `Launch.wrapped_argv()` is::

    /bin/sh -c SCRIPT corral-agent CLI ARG...

where SCRIPT (`Launch.wrapper_script()`) creates each config file with
`printf '%s' '<content>'` (contents single-quoted), exports the adapter's
environment, changes to the workspace and `exec`s the CLI, which so becomes
the sandbox's main process. No secret is ever part of a Launch: the provider
key inside a sandbox is `PLACEHOLDER_KEY`, and the broker's route replaces it
with the real credential on the host side.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

from corral.errors import AgentError, UsageError
from corral.usage import TokenUsage as Usage

__all__ = [
    "DEFAULT_HOME",
    "PLACEHOLDER_KEY",
    "AgentAdapter",
    "AgentResult",
    "ConfigFile",
    "HasSyntheticModel",
    "Launch",
    "LaunchRequest",
    "McpEndpoint",
    "NpmPackage",
    "ProviderEndpoint",
    "Status",
    "ToolCall",
    "Usage",
    "WireApi",
    "as_int",
    "env_pairs",
    "json_lines",
    "single_quote",
]

WireApi: TypeAlias = Literal["anthropic", "responses", "gemini"]
"""The model API an agent CLI speaks: Anthropic Messages, OpenAI Responses, Gemini."""

Status: TypeAlias = Literal["succeeded", "failed", "timeout", "refused"]
"""How an agent run ended: the CLI reported success; the CLI (or its provider)
failed or printed no result; corral's wall-clock limit killed it; corral
refused to start the sandbox."""

DEFAULT_HOME = "/home/corral"
"""HOME inside a corral sandbox (a fresh tmpfs)."""

PLACEHOLDER_KEY = "corral-brokered"
"""The API key an agent sees; the broker strips it and injects the real one."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def single_quote(text: str) -> str:
    """`text` as one POSIX shell word, always single-quoted (golden outputs stay stable)."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


@dataclass(frozen=True, slots=True)
class NpmPackage:
    """A pinned npm package and where its executable lands below the install prefix.

    `executable` is relative to `<prefix>/node_modules`.
    """

    name: str
    version: str
    executable: str

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class ProviderEndpoint:
    """Where the agent sends model requests, as seen from where the agent runs.

    `base_url` has no trailing slash and no API version (`.../routes/synthetic`,
    not `.../v1`); each adapter appends what its CLI expects.
    """

    base_url: str
    api_key: str = PLACEHOLDER_KEY
    model: str | None = None


@dataclass(frozen=True, slots=True)
class McpEndpoint:
    """An MCP server the agent reaches over streamable HTTP (the corral gateway)."""

    name: str
    url: str

    def __post_init__(self) -> None:
        if not re.match(r"^[a-z0-9][a-z0-9_-]{0,47}$", self.name):
            raise UsageError(f"invalid MCP server name {self.name!r} (lowercase, digits, - and _)")


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything an adapter needs to build a launch.

    `sandboxed` says the CLI runs inside corral: its own sandbox and
    permission prompts are switched off, corral's sandbox is the boundary.
    Outside corral (benchmarks, debugging) the CLI keeps its own checks and
    gets an explicit tool allowlist instead.
    """

    prompt: str
    executable: str
    workspace: str
    provider: ProviderEndpoint
    home: str = DEFAULT_HOME
    mcp: tuple[McpEndpoint, ...] = ()
    sandboxed: bool = True
    request_timeout_s: float = 120.0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for path, what in ((self.workspace, "workspace"), (self.home, "home")):
            if not path.startswith("/"):
                raise UsageError(f"the {what} must be an absolute path, not {path!r}")
        names = [m.name for m in self.mcp]
        if len(set(names)) != len(names):
            raise UsageError(f"duplicate MCP server names: {names}")


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A file the wrapper creates before the CLI starts (absolute path below HOME)."""

    path: str
    content: str


@dataclass(frozen=True, slots=True)
class Launch:
    """A ready-to-run agent command: argv, the variables to add, files to create."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    files: tuple[ConfigFile, ...] = ()

    def __post_init__(self) -> None:
        for name, value in self.env:
            if not _ENV_NAME.match(name) or "\0" in value:
                raise AgentError(f"invalid environment variable {name!r}")
        for f in self.files:
            if not f.path.startswith("/") or "/../" in f.path + "/" or "\0" in f.content:
                raise AgentError(f"invalid config file path {f.path!r}")

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def wrapper_script(self) -> str:
        """The `sh -c` script: create the files, export the variables, exec "$@"."""
        lines = ["set -e", "umask 077"]
        dirs = sorted({f.path.rsplit("/", 1)[0] for f in self.files})
        if dirs:
            lines.append("mkdir -p " + " ".join(single_quote(d) for d in dirs))
        for f in self.files:
            lines.append(f"printf '%s' {single_quote(f.content)} > {single_quote(f.path)}")
        for name, value in self.env:
            lines.append(f"export {name}={single_quote(value)}")
        lines.append(f"cd {single_quote(self.cwd)}")
        lines.append('exec "$@"')
        return "\n".join(lines) + "\n"

    def wrapped_argv(self, shell: str = "/bin/sh") -> tuple[str, ...]:
        """`shell -c SCRIPT corral-agent ARGV...`: one command that sets up and runs the CLI."""
        return (shell, "-c", self.wrapper_script(), "corral-agent", *self.argv)

    def display(self) -> str:
        """The launch as a readable shell transcript (for `--dry-run`)."""
        return self.wrapper_script().replace('exec "$@"', "exec " + shlex.join(self.argv))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the agent used, as its CLI reported it (`ok` None when unknown)."""

    name: str
    ok: bool | None = None


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What an agent run produced, parsed from its CLI's machine-readable output."""

    status: Status
    text: str | None = None
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    turns: int | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    denials: tuple[str, ...] = ()
    session_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "text": self.text,
            "error": self.error,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "cache_read_tokens": self.usage.cache_read_tokens,
                "cache_write_tokens": self.usage.cache_write_tokens,
                "total_tokens": self.usage.total,
            },
            "turns": self.turns,
            "tool_calls": [{"name": t.name, "ok": t.ok} for t in self.tool_calls],
            "denials": list(self.denials),
            "session_id": self.session_id,
        }


class HasSyntheticModel(Protocol):
    """The one thing `corral.agents.launch.launch_request` needs of an agent."""

    @property
    def synthetic_model(self) -> str | None:
        """The model to ask the synthetic provider for (None: the CLI's default)."""
        ...


class AgentAdapter(Protocol):
    """One agent CLI. Implementations are stateless; every method is pure."""

    @property
    def name(self) -> str:
        """The agent's name on the command line (`claude-code`, `codex`, `gemini`)."""
        ...

    @property
    def package(self) -> NpmPackage:
        """The pinned npm package the CLI is installed from."""
        ...

    @property
    def wire(self) -> WireApi:
        """The model API the CLI speaks."""
        ...

    @property
    def synthetic_model(self) -> str | None:
        """The model to ask the synthetic provider for (None: the CLI's default).

        Some model names switch a CLI to a tool protocol the synthetic
        provider does not script (Codex's default model sends one JavaScript
        `exec` tool instead of its function tools).
        """
        ...

    def launch(self, request: LaunchRequest) -> Launch:
        """The argv, environment and config files of one unattended run."""
        ...

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult:
        """The result of a run from the CLI's stdout (status `succeeded` or `failed`)."""
        ...


def json_lines(text: str) -> list[Mapping[str, Any]]:
    """The JSON objects of a JSONL stream; other lines (banners, partial writes) are skipped."""
    import json

    out: list[Mapping[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def as_int(value: object) -> int:
    """A token count from JSON: ints as they are, anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def env_pairs(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Environment pairs in a stable (sorted) order, for golden outputs."""
    return tuple(sorted(env.items()))
