"""Which MCP servers an agent may use, and the decision on each tool call (pure).

An MCP policy file (YAML or JSON, never read from the workspace) names the
servers and what may be called on them::

    servers:
      demo:
        command: [python3, /opt/mcp/demo.py]   # run on the host side, in its own sandbox
        ro: [/opt/mcp]                        # extra read-only paths for that sandbox
        workspace: /srv/demo-data             # its writable directory (default: a fresh one)
        tools: [echo, write_marker]           # allowlist; omitted = every tool
        deny_tools: [shred]                   # always refused
        arguments:                            # per tool, per argument
          write_marker:
            name: {allow: "^[a-z0-9_-]{1,32}$"}
            text: {deny: "(?i)password", max_length: 4096}

`decide_tool_call` checks the server and the tool with the broker's decision
engine (an `McpCall` against `McpRuleConfig` rules), then the argument rules:
`allow` must match the whole value, `deny` must not be found in it,
`max_length` bounds it. A value that is not a string is checked in its JSON
form; a missing argument is checked as the empty string. Any error while
deciding denies (rule `policy-error`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.broker.actions import McpCall
from corral.broker.config import BrokerConfig, McpRuleConfig
from corral.broker.policy import Decision, DecisionContext, Policy, decide
from corral.errors import ConfigError

__all__ = [
    "ArgumentRule",
    "McpPolicy",
    "McpServerConfig",
    "decide_tool_call",
    "load_mcp_policy",
    "parse_mcp_policy",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")


class ArgumentRule(BaseModel):
    """A constraint on one argument of one tool."""

    model_config = _FROZEN

    allow: str | None = None
    deny: str | None = None
    max_length: int | None = Field(default=None, ge=0)

    @field_validator("allow", "deny")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
        return value

    def violation(self, value: str) -> str | None:
        """Why `value` breaks this rule, or None."""
        if self.max_length is not None and len(value) > self.max_length:
            return f"is {len(value)} characters long (at most {self.max_length})"
        if self.allow is not None and re.fullmatch(self.allow, value) is None:
            return f"does not match {self.allow!r}"
        if self.deny is not None and re.search(self.deny, value) is not None:
            return f"matches the denied pattern {self.deny!r}"
        return None


class McpServerConfig(BaseModel):
    """One MCP server: how to start it (in its own sandbox) and what it may be asked."""

    model_config = _FROZEN

    command: tuple[str, ...] = Field(min_length=1)
    workspace: str | None = None
    ro: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    allow_egress: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()
    arguments: dict[str, dict[str, ArgumentRule]] = Field(default_factory=dict)
    call_timeout_s: float = Field(default=60.0, gt=0)
    memory: str = "512M"

    @field_validator("workspace")
    @classmethod
    def _abs(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"workspace must be an absolute path: {value!r}")
        return value

    @field_validator("ro")
    @classmethod
    def _abs_all(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for p in value:
            if not p.startswith("/"):
                raise ValueError(f"ro paths must be absolute: {p!r}")
        return value


class McpPolicy(BaseModel):
    """The MCP servers of a session, by name."""

    model_config = _FROZEN

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"invalid MCP server name {name!r} (lowercase, digits, - and _)")
        return value

    def broker_policy(self) -> Policy:
        """The broker's compiled rules for the server/tool part of each decision."""
        rules = tuple(
            McpRuleConfig(id=f"mcp:{name}", server=name, tools=cfg.tools)
            for name, cfg in self.servers.items()
        )
        return Policy.from_config(BrokerConfig(mcp=rules))


def parse_mcp_policy(doc: object, source: str = "<mcp policy>") -> McpPolicy:
    """Validate a parsed policy document; ConfigError names the problem."""
    try:
        return McpPolicy.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise ConfigError(f"{source}: {problems}") from None


def load_mcp_policy(path: str | Path) -> McpPolicy:
    """Read a YAML/JSON policy file (the only I/O here)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_mcp_policy(doc if doc is not None else {}, str(path))


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def decide_tool_call(
    policy: McpPolicy,
    compiled: Policy,
    server: str,
    tool: str,
    arguments: Mapping[str, Any] | None,
    *,
    ctx: DecisionContext | None = None,
) -> Decision:
    """Allow or deny calling `tool` on `server` with `arguments`. Never raises.

    `compiled` is `policy.broker_policy()` (compile it once per session).
    """
    try:
        cfg = policy.servers.get(server)
        if cfg is None:
            return Decision("deny", "default-deny", f"no MCP server {server!r} in the policy")
        if tool in cfg.deny_tools:
            return Decision("deny", f"mcp:{server}:deny", f"tool {server}/{tool} is denied")
        verdict = decide(McpCall(server=server, tool=tool), ctx or DecisionContext(), compiled)
        if not verdict.allowed:
            return verdict
        args = arguments or {}
        for name, rule in cfg.arguments.get(tool, {}).items():
            why = rule.violation(_as_text(args.get(name)))
            if why is not None:
                return Decision(
                    "deny",
                    f"mcp:{server}:args:{tool}.{name}",
                    f"argument {name!r} of {server}/{tool} {why}",
                )
        return verdict
    except Exception as exc:
        return Decision("deny", "policy-error", f"policy failed: {type(exc).__name__}: {exc}")
