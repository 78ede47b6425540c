"""How an agent CLI is launched and how its sandbox's end is read back (pure).

Every caller that launches an agent CLI (`corral agent run`, its
`--dry-run`, the `corral run` coordinator; the sessions through
`corral.run.session`) builds its `LaunchRequest` with `launch_request`, so a
CLI is configured the same way wherever it runs; `finalize` reads the
sandbox's end into the agent's result. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from corral.agents.base import (
    DEFAULT_HOME,
    AgentResult,
    HasSyntheticModel,
    LaunchRequest,
    McpEndpoint,
    ProviderEndpoint,
)
from corral.agents.routes import MCP_ROUTE, ProviderChoice

__all__ = [
    "EXIT_REFUSED",
    "SANDBOX_BROKER",
    "finalize",
    "launch_request",
    "mcp_endpoints",
]

SANDBOX_BROKER = "http://127.0.0.1:3128"
"""The broker as seen from inside a namespace sandbox (corral.broker.attach)."""

EXIT_REFUSED = 125


def mcp_endpoints(servers: Sequence[str]) -> tuple[McpEndpoint, ...]:
    """The MCP servers as the agent sees them: the gateway behind the broker's `mcp` route."""
    return tuple(
        McpEndpoint(name, f"{SANDBOX_BROKER}/routes/{MCP_ROUTE}/{name}/mcp") for name in servers
    )


def finalize(
    result: AgentResult,
    exit_code: int,
    summary: Mapping[str, Any] | None,
    stderr: str,
    timeout_s: float,
) -> AgentResult:
    """The adapter's result, corrected by how the sandbox ended (pure)."""
    reason = summary.get("reason") if summary is not None else None
    if reason == "timeout" or (summary is None and exit_code == 124):
        return replace(
            result,
            status="timeout",
            error=f"the agent was killed after the {timeout_s:g} s wall-clock limit",
        )
    if reason == "refused" or (summary is None and exit_code == EXIT_REFUSED):
        message = summary.get("message") if summary is not None else None
        tail = [ln for ln in stderr.strip().splitlines() if not ln.startswith("{")][-1:]
        return replace(
            result,
            status="refused",
            error=f"corral refused to start the sandbox: {message or ' '.join(tail) or 'unknown'}",
        )
    if reason == "oom":
        return replace(result, status="failed", error="the agent was killed by the memory limit")
    return result


def launch_request(
    adapter: HasSyntheticModel,
    prompt: str,
    *,
    provider: ProviderChoice,
    executable: str,
    workspace: str,
    base_url: str,
    model: str | None = None,
    home: str = DEFAULT_HOME,
    mcp: tuple[McpEndpoint, ...] = (),
    sandboxed: bool = True,
    request_timeout_s: float = 120.0,
    extra_args: Sequence[str] = (),
) -> LaunchRequest:
    """The request `adapter.launch` gets for one session (pure).

    Every caller that launches an agent CLI (`run_agent`, `corral agent run
    --dry-run`, the `corral run` coordinator) builds its request here, so the
    CLI is configured the same way wherever it runs. `base_url` is the provider
    as the agent sees it. Without an explicit `model`, the synthetic provider
    is asked for the adapter's `synthetic_model` (Codex and Gemini need one the
    scripted provider can drive; see `AgentAdapter.synthetic_model`) and a real
    provider for the CLI's default.
    """
    if not model:
        model = adapter.synthetic_model if provider.kind == "synthetic" else None
    return LaunchRequest(
        prompt=prompt,
        executable=executable,
        workspace=workspace,
        provider=ProviderEndpoint(base_url=base_url, model=model),
        home=home,
        mcp=mcp,
        sandboxed=sandboxed,
        request_timeout_s=request_timeout_s,
        extra_args=tuple(extra_args),
    )
