"""Typed actions the broker decides on, and the observations it journals (pure).

An *action* is what a sandboxed process attempted: a frozen pydantic model
with a literal `kind` tag; `Action` is their tagged union, so
`TypeAdapter(Action).validate_python({"kind": "net_connect", ...})` yields the
right class. Host fields are canonical (`corral.broker.hosts.canonical_host`):
building an action from a malformed host raises `pydantic.ValidationError`,
which the servers treat as a denial.

An *observation* is one journal row: who (run, session, env), what (kind,
target), the decision (`allow`, `deny` or `observe`), the rule and reason,
byte counts known when it was written, a JSON `detail` and an optional
`cause` (the id of the row it follows from).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.broker.hosts import canonical_host, format_hostport

__all__ = [
    "KINDS",
    "Action",
    "ActionKind",
    "Env",
    "FileOp",
    "HttpRequest",
    "Identity",
    "LandlockDenial",
    "McpCall",
    "NetConnect",
    "Observation",
    "ObservationDecision",
    "ProcessEvent",
    "ProviderCall",
    "SeccompDenial",
    "TcpConnect",
    "UnixConnect",
    "action_target",
]

Env: TypeAlias = Literal["exec", "agent", "product", "verifier"]
ActionKind: TypeAlias = Literal[
    "net_connect",
    "http_request",
    "provider_call",
    "mcp_call",
    "file_op",
    "process_event",
    "unix_connect",
    "watch",
    "tcp_connect",
    "policy",
    "landlock",
    "seccomp",
]
KINDS: tuple[ActionKind, ...] = (
    "net_connect",
    "http_request",
    "provider_call",
    "mcp_call",
    "file_op",
    "process_event",
    "unix_connect",
    "watch",
    "tcp_connect",
    "policy",
    "landlock",
    "seccomp",
)
ObservationDecision: TypeAlias = Literal["allow", "deny", "observe"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class _HostAction(BaseModel):
    model_config = _FROZEN

    host: str
    port: int = Field(ge=1, le=65535)

    @field_validator("host")
    @classmethod
    def _canonical(cls, value: str) -> str:
        return canonical_host(value)


class NetConnect(_HostAction):
    """An opaque TCP tunnel (HTTP CONNECT) to host:port."""

    kind: Literal["net_connect"] = "net_connect"


class TcpConnect(_HostAction):
    """A raw TCP stream to host:port through the broker's SOCKS5 server (`[[tcp]]` rules)."""

    kind: Literal["tcp_connect"] = "tcp_connect"


class HttpRequest(_HostAction):
    """A plain-HTTP request forwarded by the proxy.

    `path` is the raw request path (no query), exactly as sent; `query` is the
    raw query string without `?`.
    """

    kind: Literal["http_request"] = "http_request"
    scheme: Literal["http", "https"] = "http"
    method: str = Field(min_length=1, max_length=32)
    path: str = Field(min_length=1)
    query: str = ""


class ProviderCall(BaseModel):
    """A request to a named credential-injecting route (`/routes/<route>/...`).

    `path` is the path below the route prefix, starting with `/`.
    """

    model_config = _FROZEN

    kind: Literal["provider_call"] = "provider_call"
    route: str = Field(min_length=1, max_length=64)
    method: str = Field(min_length=1, max_length=32)
    path: str = Field(min_length=1)
    query: str = ""


class McpCall(BaseModel):
    """A tool call through the MCP gateway."""

    model_config = _FROZEN

    kind: Literal["mcp_call"] = "mcp_call"
    server: str = Field(min_length=1)
    tool: str = Field(min_length=1)


class FileOp(BaseModel):
    """A file-system access corral mediates or observed (absolute path)."""

    model_config = _FROZEN

    kind: Literal["file_op"] = "file_op"
    op: Literal["read", "write", "create", "delete", "exec", "list"]
    path: str = Field(min_length=1)


class ProcessEvent(BaseModel):
    """Something corral observed about a process: it is journaled, never decided.

    `event` examples: `oom_kill`, `pids_limit`, `timeout`, `killed_at_teardown`,
    `seccomp`, `landlock`, `broker_start`, `broker_stop`.
    """

    model_config = _FROZEN

    kind: Literal["process_event"] = "process_event"
    event: str = Field(min_length=1, max_length=64)
    pid: int | None = None
    name: str = ""


class UnixConnect(BaseModel):
    """A sandbox's connect() to a pathname unix socket, as the supervisor decided it.

    `path` is the address exactly as the sandbox wrote it (at most 108 bytes).
    """

    model_config = _FROZEN

    kind: Literal["unix_connect"] = "unix_connect"
    path: str = Field(min_length=1, max_length=256)
    pid: int | None = None


class LandlockDenial(BaseModel):
    """A file-system access Landlock refused, as kernel audit reported it.

    `access`: the Landlock blockers (e.g. `fs.write_file`); `path`: the path
    the kernel logged, sanitized (it is sandbox-controlled text).
    """

    model_config = _FROZEN

    kind: Literal["landlock"] = "landlock"
    access: str = Field(min_length=1, max_length=128)
    path: str = Field(max_length=1100)
    pid: int | None = None


class SeccompDenial(BaseModel):
    """A syscall the seccomp filter refused, as kernel audit reported it."""

    model_config = _FROZEN

    kind: Literal["seccomp"] = "seccomp"
    syscall: str = Field(min_length=1, max_length=64)
    nr: int | None = None
    pid: int | None = None


Action: TypeAlias = Annotated[
    NetConnect
    | HttpRequest
    | ProviderCall
    | McpCall
    | FileOp
    | ProcessEvent
    | UnixConnect
    | TcpConnect
    | LandlockDenial
    | SeccompDenial,
    Field(discriminator="kind"),
]


def action_target(action: Action) -> str:
    """The journal's one-line `target` for an action (never holds a query string)."""
    match action:
        case NetConnect():
            return format_hostport(action.host, action.port)
        case TcpConnect():
            return "tcp://" + format_hostport(action.host, action.port)
        case HttpRequest():
            return (
                f"{action.method} {action.scheme}://"
                f"{format_hostport(action.host, action.port)}{action.path}"
            )
        case ProviderCall():
            return f"{action.route} {action.method} {action.path}"
        case McpCall():
            return f"{action.server}/{action.tool}"
        case FileOp():
            return f"{action.op} {action.path}"
        case ProcessEvent():
            suffix = f" pid={action.pid}" if action.pid is not None else ""
            return f"{action.event}{suffix}{' ' + action.name if action.name else ''}"
        case UnixConnect():
            return f"unix:{action.path}"
        case LandlockDenial():
            return f"{action.access} {action.path}"
        case SeccompDenial():
            return action.syscall


class Identity(BaseModel):
    """Who acted: the run, the session and the environment."""

    model_config = _FROZEN

    run: str | None = None
    session: str | None = None
    env: Env = "exec"


def _now() -> datetime:
    return datetime.now(UTC)


class Observation(BaseModel):
    """One journal row as written (see docs/design.md section 6a for the JSON shape)."""

    model_config = _FROZEN

    time: datetime = Field(default_factory=_now)
    run: str | None = None
    session: str | None = None
    env: Env = "exec"
    kind: ActionKind
    target: str
    decision: ObservationDecision
    rule: str | None = None
    reason: str
    bytes_up: int = Field(default=0, ge=0)
    bytes_down: int = Field(default=0, ge=0)
    detail: dict[str, Any] = Field(default_factory=dict)
    cause: int | None = None

    @classmethod
    def of(
        cls,
        action: Action,
        identity: Identity,
        *,
        decision: ObservationDecision,
        rule: str | None,
        reason: str,
        detail: dict[str, Any] | None = None,
        cause: int | None = None,
    ) -> Observation:
        """The observation recording `decision` on `action` by `identity`."""
        return cls(
            run=identity.run,
            session=identity.session,
            env=identity.env,
            kind=action.kind,
            target=action_target(action),
            decision=decision,
            rule=rule,
            reason=reason,
            detail=detail or {},
            cause=cause,
        )
