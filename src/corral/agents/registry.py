"""The agent adapters corral knows, by name (explicit dispatch, no lookup by attribute)."""

from __future__ import annotations

from collections.abc import Mapping

from corral.agents.base import AgentAdapter
from corral.agents.claude_code import ClaudeCode
from corral.agents.codex import Codex
from corral.agents.gemini import GeminiCli
from corral.errors import UsageError

__all__ = ["ADAPTERS", "get_adapter"]

ADAPTERS: Mapping[str, AgentAdapter] = {
    "claude-code": ClaudeCode(),
    "codex": Codex(),
    "gemini": GeminiCli(),
}


def get_adapter(name: str) -> AgentAdapter:
    """The adapter called `name`; UsageError lists the known ones."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise UsageError(f"unknown agent {name!r} (known: {', '.join(ADAPTERS)})") from None
