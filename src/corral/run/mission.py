"""The mission file: Markdown with TOML front matter between `+++` lines (pure).

    +++
    agent = "script"
    provider = "synthetic:scenario.yaml"
    max_sessions = 3
    [product]
    command = "python3 server.py"
    port = 8000
    [[checks]]
    name = "health"
    http = "GET /health"
    +++
    # A small todo HTTP service
    ...

`parse_mission(text, path)` returns a frozen `Mission` or raises
`ConfigError` whose message names the file, the line and what is wrong:
unknown keys, bad values (sizes, durations, ports), TOML syntax errors and a
missing front matter are all rejected. Paths in the front matter
(`synthetic:FILE`, `checks_dir`) are relative to the mission file. Nothing
here touches the file system except `load_mission`, which reads the file.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from corral.broker.config import (
    CredentialConfig,
    HostServiceConfig,
    RuleConfig,
    TcpRuleConfig,
    TlsConfig,
)
from corral.errors import ConfigError, UsageError
from corral.run.checkspec import HttpStep, check_env, check_steps
from corral.run.envnet import EnvNetwork, SecretSettings, check_secret_names
from corral.sandbox.units import format_size, parse_cpus, parse_duration, parse_size

if TYPE_CHECKING:
    from corral.broker.mcp_policy import McpPolicy

__all__ = [
    "AGENTS",
    "Backends",
    "Check",
    "EnvLimits",
    "Limits",
    "Mission",
    "MissionSettings",
    "NetworkSettings",
    "ProductSettings",
    "ProviderRef",
    "SessionSettings",
    "WatchSettings",
    "browser_in_checks",
    "load_mission",
    "parse_mission",
    "parse_provider",
    "split_front_matter",
    "with_provider",
]

#: Agents a mission may name. `script` is corral's built-in *test* agent.
AGENTS: tuple[str, ...] = ("script", "claude-code", "codex", "gemini")
_FENCE = "+++"
_FROZEN = ConfigDict(frozen=True, extra="forbid")
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,40}$")
_HTTP_RE = re.compile(r"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (/\S*)$")


def _size(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("a size is a string like '512M' or a number of bytes")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("a size must be positive")
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    raise ValueError("a size is a string like '512M' or a number of bytes")


def _duration(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("a duration is a string like '30s' or a number of seconds")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("a duration must be positive")
        return float(value)
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    raise ValueError("a duration is a string like '30s' or a number of seconds")


def _cpus(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("cpus is a number like 0.5 or 2")
    try:
        return parse_cpus(str(value))
    except UsageError as exc:
        raise ValueError(str(exc)) from None


class EnvLimits(BaseModel):
    """Resource limits of one environment (agent, product or verifier)."""

    model_config = _FROZEN

    memory: int | None = Field(default=None, description="bytes, swap included")
    cpus: float | None = None
    pids: int | None = Field(default=None, ge=8, le=1_000_000)

    @field_validator("memory", mode="before")
    @classmethod
    def _mem(cls, value: object) -> object:
        return None if value is None else _size(value)

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpu(cls, value: object) -> object:
        return None if value is None else _cpus(value)


class Limits(BaseModel):
    """`[limits]`: the run-wide memory cap and each environment's limits."""

    model_config = _FROZEN

    run_memory: int = Field(default=4 << 30, description="run-wide memory cap (bytes)")
    run_disk: int | None = Field(
        default=None, description="run directory on an ext4 image of this size (bytes); off"
    )
    agent: EnvLimits = EnvLimits(memory=2 << 30, cpus=None, pids=1024)
    product: EnvLimits = EnvLimits(memory=512 << 20, cpus=None, pids=256)
    verifier: EnvLimits = EnvLimits(memory=1 << 30, cpus=None, pids=512)

    @field_validator("run_memory", mode="before")
    @classmethod
    def _mem(cls, value: object) -> object:
        return _size(value)

    @field_validator("run_disk", mode="before")
    @classmethod
    def _disk(cls, value: object) -> object:
        return None if value is None else _size(value)

    @model_validator(mode="after")
    def _fits(self) -> Limits:
        over = [
            (name, env.memory)
            for name in ("agent", "product", "verifier")
            if (env := getattr(self, name)).memory is not None and env.memory > self.run_memory
        ]
        if over:
            least = max(m for _, m in over)
            # The message starts with the key it is about: parse_mission points at its line.
            whose = ", ".join(
                f"limits.{name}.memory = {format_size(m)}"
                + ("" if name in self.model_fields_set else " (the default)")
                for name, m in over
            )
            raise ValueError(
                f"run_memory = {format_size(self.run_memory)} is less than {whose}; "
                f"limits.run_memory must be at least {format_size(least)}"
            )
        return self


class SessionSettings(BaseModel):
    """`[session]`: the bounds of one agent session."""

    model_config = _FROZEN

    wall_time: float = 1800.0
    token_budget: int | None = Field(default=None, ge=1)

    @field_validator("wall_time", mode="before")
    @classmethod
    def _wall(cls, value: object) -> object:
        return _duration(value)


_PRESSURE_RE = re.compile(r"^(some|full) (avg10|avg60|avg300) > (\d+(?:\.\d+)?)$")


class WatchSettings(BaseModel):
    """`[watch]`: the watchdog's thresholds (see `corral.run.watchdog`)."""

    model_config = _FROZEN

    host_memory_min_free: int | None = None
    memory_pressure: str | None = None
    on_breach: Literal["pause", "stop", "kill"] = "pause"
    interval: float = Field(default=0.1, gt=0, le=0.1)

    @field_validator("host_memory_min_free", mode="before")
    @classmethod
    def _free(cls, value: object) -> object:
        return None if value is None else _size(value)

    @field_validator("memory_pressure")
    @classmethod
    def _pressure(cls, value: str | None) -> str | None:
        if value is not None and _PRESSURE_RE.match(value) is None:
            raise ValueError(f"memory_pressure is like 'some avg10 > 40', not {value!r}")
        return value


class NetworkSettings(BaseModel):
    """`[network]`: destinations the agent may reach besides the provider.

    `[[network.host_services]]` and `[[network.tcp]]` are the broker's
    (docs/broker.md, "Host services" and "Raw TCP"); so are
    `[[network.rules]]` (method/path rules, enforced inside HTTPS by
    interception), `[[network.credentials]]` (placeholders) and
    `[network.upstream_tls]` (docs/broker.md, "TLS interception").
    """

    model_config = _FROZEN

    allow: tuple[str, ...] = ()
    host_services: tuple[HostServiceConfig, ...] = ()
    tcp: tuple[TcpRuleConfig, ...] = ()
    # issue 14: the product's and the verifier's own allowlists (corral.run.envnet).
    product: EnvNetwork = EnvNetwork()
    verifier: EnvNetwork = EnvNetwork()
    rules: tuple[RuleConfig, ...] = ()
    credentials: tuple[CredentialConfig, ...] = ()
    upstream_tls: TlsConfig = TlsConfig()

    @field_validator("allow")
    @classmethod
    def _allow(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from corral.broker.config import check_allow_list

        return check_allow_list(value)

    @model_validator(mode="after")
    def _together(self) -> NetworkSettings:
        # Rule ids and credential names must be unique across the allow list
        # and the tables: checked at load, not when a session starts.
        from corral.broker.config import BrokerConfig

        base = BrokerConfig.from_allow_flags(self.allow)
        BrokerConfig.model_validate(
            {
                "rules": [*base.rules, *self.rules],
                "credentials": self.credentials,
                "host_services": self.host_services,
                "tcp": self.tcp,
            }
        )
        return self


class McpServer(BaseModel):
    """`[mcp.servers.NAME]`: an MCP server offered to the agent through the gateway.

    `command` (a string or a list) plus `args` is run in a sandbox of its own
    with `env`; `ro` paths (relative ones are the mission file's) are visible
    to it read-only. `tools`/`deny_tools`/`arguments` are its tool policy
    (`corral.broker.mcp_policy`).
    """

    model_config = _FROZEN

    command: tuple[str, ...] = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    ro: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()
    arguments: dict[str, dict[str, dict[str, str | int]]] = Field(default_factory=dict)
    memory: str = "512M"
    call_timeout: float = 60.0

    @field_validator("command", mode="before")
    @classmethod
    def _cmd(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("memory")
    @classmethod
    def _mem(cls, value: str) -> str:
        _size(value)
        return value

    @field_validator("call_timeout", mode="before")
    @classmethod
    def _t(cls, value: object) -> object:
        return _duration(value)


class McpSettings(BaseModel):
    model_config = _FROZEN

    servers: dict[str, McpServer] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _policy(self) -> McpSettings:
        from corral.broker.mcp_policy import parse_mcp_policy

        try:
            parse_mcp_policy(_policy_doc(self, Path("/")), "[mcp]")
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("[mcp]: ")) from None
        return self


def _policy_doc(mcp: McpSettings, base: Path) -> dict[str, object]:
    return {
        "servers": {
            name: {
                "command": [*s.command, *s.args],
                "env": s.env,
                "ro": [str(base / p) for p in s.ro],
                "tools": s.tools,
                "deny_tools": s.deny_tools,
                "arguments": s.arguments,
                "memory": s.memory,
                "call_timeout_s": s.call_timeout,
            }
            for name, s in mcp.servers.items()
        }
    }


class ProductSettings(BaseModel):
    """`[product]`: how the product is started from a snapshot and when it is ready."""

    model_config = _FROZEN

    command: str = Field(min_length=1)
    port: int = Field(ge=1024, le=65535)
    ready_path: str | None = None
    ready_timeout: float = 20.0
    env: dict[str, str] = Field(default_factory=dict)
    ports: tuple[Annotated[int, Field(ge=1024, le=65535)], ...] = Field(default=(), max_length=16)
    data: bool = False
    data_for_agent: Literal["none", "ro"] = "none"

    @model_validator(mode="before")
    @classmethod
    def _first_port(cls, value: object) -> object:
        from corral.run.product import first_port

        return first_port(value)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        from corral.run.product import check_env

        return check_env(value)

    @property
    def all_ports(self) -> tuple[int, ...]:
        """`port` first, then the other `ports` (each forwarded to the verifier)."""
        return (self.port, *[p for p in dict.fromkeys(self.ports) if p != self.port])

    @field_validator("ready_timeout", mode="before")
    @classmethod
    def _t(cls, value: object) -> object:
        return _duration(value)

    @field_validator("ready_path")
    @classmethod
    def _p(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"ready_path starts with '/': {value!r}")
        return value


class Check(BaseModel):
    """`[[checks]]`: one acceptance check, run in a verifier sandbox of its own.

    Exactly one of `run` (a shell command; passes when it exits 0), `http`
    (`"METHOD /path"` against the product with `expect_*` assertions),
    `steps` (`[[checks.steps]]`, a sequence of such requests; see
    `corral.run.checkspec`) and `browser` (a Python Playwright script of the
    mission's, a path relative to the mission file inside `checks_dir`;
    passes when it exits 0, see docs/run.md). `setup` and `teardown` are
    shell commands run in the same sandbox before and (always) after it;
    `env`, `memory`, `pids` and `timeout` are this check's own.
    """

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=120)
    run: str | None = None
    http: str | None = None
    browser: str | None = None
    body: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    expect_status: int = Field(default=200, ge=100, le=599)
    expect_body: str | None = None
    timeout: float = 60.0
    restart_product: bool = False
    # issue 14: assertions, steps, setup/teardown, env and limits (corral.run.checkspec).
    expect_headers: dict[str, str] = Field(default_factory=dict)
    expect_regex: str | None = None
    expect_json: dict[str, Any] = Field(default_factory=dict)
    expect_sha256: str | None = None
    expect_size: int | None = Field(default=None, ge=0)
    steps: tuple[HttpStep, ...] = ()
    setup: str | None = Field(default=None, min_length=1)
    teardown: str | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    memory: int | None = None
    pids: int | None = Field(default=None, ge=8, le=1_000_000)

    @field_validator("timeout", mode="before")
    @classmethod
    def _t(cls, value: object) -> object:
        return _duration(value)

    @field_validator("memory", mode="before")
    @classmethod
    def _m(cls, value: object) -> object:
        return None if value is None else _size(value)

    @field_validator("env")
    @classmethod
    def _e(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env(value)

    @field_validator("http")
    @classmethod
    def _h(cls, value: str | None) -> str | None:
        if value is not None and _HTTP_RE.match(value) is None:
            raise ValueError(f"http is 'METHOD /path', e.g. 'GET /todos', not {value!r}")
        return value

    @field_validator("browser")
    @classmethod
    def _b(cls, value: str | None) -> str | None:
        if value is not None:
            parts = value.split("/")
            if value.startswith("/") or ".." in parts or not value.endswith(".py"):
                raise ValueError(f"browser is a relative path to a .py file, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one(self) -> Check:
        given = sum(
            x
            for x in (
                self.run is not None,
                self.http is not None,
                bool(self.steps),
                self.browser is not None,
            )
        )
        if given != 1:
            raise ValueError(
                f"check {self.name!r}: give exactly one of 'run', 'http', 'steps' and 'browser'"
            )
        inline = {k for k in _STEP_KEYS if k in self.model_fields_set}
        if self.http is None and inline:
            raise ValueError(f"check {self.name!r}: {', '.join(sorted(inline))} need 'http'")
        try:
            check_steps(self.http_steps())
        except ValueError as exc:
            raise ValueError(f"check {self.name!r}: {exc}") from None
        return self

    @property
    def kind(self) -> Literal["run", "http", "browser"]:
        if self.run is not None:
            return "run"
        # `steps` is a sequence of http requests: an http check too.
        return "browser" if self.browser is not None else "http"

    def http_steps(self) -> tuple[HttpStep, ...]:
        """The requests of an http check (one for `http = ...`); () for `run` and `browser`."""
        if self.http is None:
            return self.steps
        return (HttpStep.model_validate(self.model_dump(include={"http", *_STEP_KEYS})),)


_STEP_KEYS = frozenset(HttpStep.model_fields) - {"http", "capture"}


BackendKind = Literal["namespace", "gvisor", "microvm"]


class Backends(BaseModel):
    """`backend`: the isolation each environment runs in (default namespace).

    `backend = "gvisor"` names one for every environment; a table
    (`[backend]` with `agent`, `product`, `verifier`) names them one by one.
    """

    model_config = _FROZEN

    agent: BackendKind = "namespace"
    product: BackendKind = "namespace"
    verifier: BackendKind = "namespace"

    @model_validator(mode="before")
    @classmethod
    def _one_for_all(cls, value: object) -> object:
        if isinstance(value, str):
            return {"agent": value, "product": value, "verifier": value}
        return value


class MissionSettings(BaseModel):
    """The front matter, validated."""

    model_config = _FROZEN

    name: str | None = None
    agent: Literal["script", "claude-code", "codex", "gemini"] = "script"
    provider: str = "synthetic:scenario.yaml"
    provider_key: str | None = Field(
        default=None, description="a compatible provider's key: 'env:NAME' or 'file:/path'"
    )
    model: str | None = None
    max_sessions: int = Field(default=5, ge=1, le=1000)
    token_budget: int | None = Field(default=None, ge=1, description="run-wide")
    session: SessionSettings = SessionSettings()
    limits: Limits = Limits()
    watch: WatchSettings = WatchSettings()
    network: NetworkSettings = NetworkSettings()
    mcp: McpSettings = McpSettings()
    backend: Backends = Backends()
    product: ProductSettings | None = None
    checks_dir: str | None = None
    checks: Annotated[tuple[Check, ...], Field(min_length=1)]
    secrets: dict[str, SecretSettings] = Field(default_factory=dict)

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: dict[str, SecretSettings]) -> dict[str, SecretSettings]:
        return check_secret_names(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and _NAME_RE.match(value) is None:
            raise ValueError(f"name is lowercase letters, digits and '-': {value!r}")
        return value

    @field_validator("provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        parse_provider(value)
        return value

    @field_validator("provider_key")
    @classmethod
    def _provider_key(cls, value: str | None) -> str | None:
        if value is not None:
            from corral.agents.routes import parse_key_ref

            try:
                parse_key_ref(value)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _http_needs_product(self) -> MissionSettings:
        if self.product is None and any(c.kind == "http" for c in self.checks):
            raise ValueError("http checks need a [product] section")
        for c in self.checks:
            if c.browser is None:
                continue
            if self.product is None:
                raise ValueError("browser checks need a [product] section")
            # The script must be the mission's own (copied into the run when it
            # is created), never a file the agent could have written.
            if self.checks_dir is None or browser_in_checks(c.browser, self.checks_dir) is None:
                raise ValueError(f"check {c.name!r}: browser {c.browser!r} must lie in checks_dir")
        names = [c.name for c in self.checks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate check names: {dupes}")
        if self.product is None and any(c.restart_product for c in self.checks):
            raise ValueError("restart_product needs a [product] section")
        parse_provider(self.provider, self.provider_key)
        big = [c.name for c in self.checks if c.memory and c.memory > self.limits.run_memory]
        if big:
            raise ValueError(f"check {big[0]!r}: memory is more than limits.run_memory")
        return self


def browser_in_checks(browser: str, checks_dir: str) -> str | None:
    """`browser`'s path inside `checks_dir` (both relative to the mission), else None."""
    rel = PurePosixPath(posixpath.normpath(browser))
    base = PurePosixPath(posixpath.normpath(checks_dir))
    if rel == base or not rel.is_relative_to(base) or base.is_absolute():
        return None
    return str(rel.relative_to(base))


@dataclass(frozen=True, slots=True)
class ProviderRef:
    """`synthetic:FILE`, `anthropic`, `openai`, `gemini` or `{anthropic,openai}-compatible:URL`."""

    kind: Literal[
        "synthetic", "anthropic", "openai", "gemini", "anthropic-compatible", "openai-compatible"
    ]
    scenario: str | None = None
    url: str | None = None
    key: str | None = None
    """A compatible provider's key source (`env:NAME`, `file:/path`), kept beside, not in, str()."""

    def __str__(self) -> str:
        if self.kind == "synthetic":
            return f"synthetic:{self.scenario}"
        return f"{self.kind}:{self.url}" if self.url is not None else self.kind


def parse_provider(text: str, key: str | None = None) -> ProviderRef:
    """Parse a provider setting (and a compatible provider's key source); raises ValueError."""
    for kind in ("anthropic-compatible", "openai-compatible"):
        if text.startswith(kind + ":"):
            from corral.agents.routes import compatible_url, parse_key_ref

            try:
                url = compatible_url(text[len(kind) + 1 :])
                ref = None if key is None else parse_key_ref(key)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
            return ProviderRef(kind, url=url, key=ref)
    if key is not None:
        raise ValueError("provider_key is for anthropic-compatible:URL or openai-compatible:URL")
    if text in ("anthropic", "openai", "gemini"):
        return ProviderRef(text)  # type: ignore[arg-type]
    if text.startswith("synthetic:") and len(text) > len("synthetic:"):
        return ProviderRef("synthetic", text[len("synthetic:") :])
    if text == "synthetic":
        return ProviderRef("synthetic", "scenario.yaml")
    raise ValueError(
        "provider is 'synthetic:FILE', 'anthropic', 'openai', 'gemini', 'anthropic-compatible:URL' "
        f"or 'openai-compatible:URL', not {text!r}"
    )


@dataclass(frozen=True, slots=True)
class Mission:
    """A validated mission: its settings, its product description and where it came from."""

    settings: MissionSettings
    description: str
    path: Path
    text: str

    @property
    def name(self) -> str:
        if self.settings.name:
            return self.settings.name
        stem = self.path.parent.name if self.path.stem.upper() == "MISSION" else self.path.stem
        slug = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
        if not slug or not slug[0].isalpha():
            slug = "m-" + slug
        return slug[:40] or "mission"

    @property
    def provider(self) -> ProviderRef:
        return parse_provider(self.settings.provider, self.settings.provider_key)

    def resolve(self, relative: str) -> Path:
        """A path from the front matter, relative to the mission file."""
        p = Path(relative)
        return p if p.is_absolute() else (self.path.parent / p)

    def mcp_policy(self) -> McpPolicy:
        """`[mcp.servers.*]` as the gateway's policy (relative `ro` paths resolved)."""
        from corral.broker.mcp_policy import parse_mcp_policy

        doc = _policy_doc(self.settings.mcp, self.path.parent.absolute())
        return parse_mcp_policy(doc, f"{self.path} [mcp]")

    @property
    def scenario_path(self) -> Path | None:
        ref = self.provider
        return self.resolve(ref.scenario) if ref.kind == "synthetic" and ref.scenario else None

    @property
    def checks_dir(self) -> Path | None:
        d = self.settings.checks_dir
        return self.resolve(d) if d else None


def split_front_matter(text: str, path: str = "MISSION.md") -> tuple[str, int, str]:
    """(front matter, line number of its first line, body); ConfigError if missing."""
    lines = text.splitlines()
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start >= len(lines) or lines[start].strip() != _FENCE:
        raise ConfigError(
            f"{path}:{start + 1}: a mission starts with TOML front matter between '+++' lines"
        )
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == _FENCE:
            front = "\n".join(lines[start + 1 : end])
            body = "\n".join(lines[end + 1 :]).strip()
            return front, start + 2, body
    raise ConfigError(f"{path}:{start + 1}: the front matter's closing '+++' is missing")


def _locate(front: str, loc: tuple[int | str, ...]) -> int | None:
    """Best-effort 0-based line within `front` of the key path `loc`."""
    lines = front.splitlines()
    keys = [k for k in loc if isinstance(k, str)]
    index = next((k for k in loc if isinstance(k, int)), None)
    best: int | None = None
    section: list[str] = []
    array_counts: dict[str, int] = {}
    for i, raw in enumerate(lines):
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"^\[\[\s*([^\]]+?)\s*\]\]$", line) or re.match(r"^\[\s*([^\]]+?)\s*\]$", line)
        if m:
            section = [p.strip().strip('"') for p in m.group(1).split(".")]
            if line.startswith("[["):
                name = ".".join(section)
                array_counts[name] = array_counts.get(name, -1) + 1
            if (
                keys[: len(section)] == section
                and best is None
                and len(section) == len(keys)
                and (not line.startswith("[[") or array_counts[".".join(section)] == (index or 0))
            ):
                best = i
            continue
        km = re.match(r"^([A-Za-z0-9_\-\".]+)\s*=", line)
        if not km:
            continue
        full = section + [p.strip().strip('"') for p in km.group(1).split(".")]
        in_right_item = True
        if section and ".".join(section) in array_counts:
            in_right_item = array_counts[".".join(section)] == (index or 0)
        if not in_right_item:
            continue
        if full == keys[: len(full)] and len(full) >= 1:
            if full == keys:
                return i
            if best is None or len(full) > 1:
                best = i
    return best


def _fmt_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "front matter"


def _line_of(front: str, first_line: int, loc: tuple[int | str, ...], msg: str) -> int:
    """The mission line an error at `loc` is about; the opening `+++` when none is.

    A model-level message that starts with one of its keys (`run_memory = ...`)
    is about that key's line; a missing key is reported at the nearest enclosing
    table that exists.
    """
    key = re.match(r"^(?:Value error, )?([a-z_]+) = ", msg)
    if key is not None:
        where = _locate(front, (*loc, key.group(1)))
        if where is not None:
            return where + first_line
    for n in range(len(loc), 0, -1):
        where = _locate(front, loc[:n])
        if where is not None:
            return where + first_line
    return first_line - 1


def _refuse_duplicate_checks(data: dict[str, Any], front: str, first_line: int, name: str) -> None:
    checks = data.get("checks")
    if not isinstance(checks, list):
        return
    seen: dict[str, int] = {}
    for i, check in enumerate(checks):
        cname = check.get("name") if isinstance(check, dict) else None
        if not isinstance(cname, str):
            continue
        if cname in seen:
            line = _line_of(front, first_line, ("checks", i, "name"), "")
            first = _line_of(front, first_line, ("checks", seen[cname], "name"), "")
            raise ConfigError(
                f"{name}:{line}: duplicate check name {cname!r} (first used on line {first})"
            )
        seen[cname] = i


def parse_mission(text: str, path: str | Path = "MISSION.md") -> Mission:
    """Validate a mission document; raises ConfigError naming the line and the problem."""
    name = str(path)
    front, first_line, body = split_front_matter(text, name)
    try:
        data: dict[str, Any] = tomllib.loads(front)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line = int(m.group(1)) + first_line - 1
            msg = msg[: m.start()].strip()
            raise ConfigError(f"{name}:{line}: TOML syntax error: {msg}") from None
        raise ConfigError(f"{name}: TOML syntax error: {msg}") from None
    _refuse_duplicate_checks(data, front, first_line, name)
    try:
        settings = MissionSettings.model_validate(data)
    except ValidationError as exc:
        problems: list[str] = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            # pydantic appends the union/validator name to some locations.
            loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
            lineno = _line_of(front, first_line, loc, str(err["msg"]))
            if err["type"] == "extra_forbidden":
                what = f"unknown key '{_fmt_loc(loc)}'"
            elif err["type"] == "missing":
                what = f"missing required key '{_fmt_loc(loc)}'"
            else:
                reason = str(err["msg"]).removeprefix("Value error, ")
                what = f"'{_fmt_loc(loc)}': {reason}"
            problems.append(f"{name}:{lineno}: {what}")
        raise ConfigError("\n".join(problems)) from None
    if not body:
        raise ConfigError(f"{name}: the mission has no product description after the front matter")
    return Mission(settings=settings, description=body, path=Path(path), text=text)


def with_provider(mission: Mission, provider: str | None, key: str | None = None) -> Mission:
    """`mission` with `--provider`/`--provider-key` in place of its own; ConfigError if bad.

    The file's `provider_key` only goes with the file's own provider (a key
    meant for one server is not sent to another named on the command line).
    """
    own = mission.settings.provider
    if provider is None or (provider == "synthetic" and own.startswith("synthetic")):
        provider = own
    if key is None and provider == mission.settings.provider:
        key = mission.settings.provider_key
    try:
        parse_provider(provider, key)
    except ValueError as exc:
        raise ConfigError(f"{mission.path}: provider {provider!r}: {exc}") from None
    settings = mission.settings.model_copy(update={"provider": provider, "provider_key": key})
    return dataclasses.replace(mission, settings=settings)


def load_mission(
    path: str | Path, provider: str | None = None, provider_key: str | None = None
) -> Mission:
    """Read and validate a mission file (see `parse_mission`).

    `provider` (`--provider`) replaces the file's before anything is checked
    against it, so a mission without a scenario runs with a real provider.
    """
    p = Path(path).absolute()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the mission: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: the mission is not UTF-8 text") from exc
    mission = parse_mission(text, p)
    if provider is not None or provider_key is not None:
        mission = with_provider(mission, provider, provider_key)
    scen = mission.scenario_path
    if scen is not None and not scen.is_file():
        raise ConfigError(f"{p}: provider scenario {scen} does not exist")
    cdir = mission.checks_dir
    if cdir is not None and not cdir.is_dir():
        raise ConfigError(f"{p}: checks_dir {cdir} is not a directory")
    for c in mission.settings.checks:
        if c.browser is not None and not mission.resolve(c.browser).is_file():
            raise ConfigError(f"{p}: browser check {mission.resolve(c.browser)} does not exist")
    return mission
