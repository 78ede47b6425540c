"""Scenario files: the script the synthetic provider plays (pure; no I/O but `load_scenario`).

A scenario is an ordered list of turns. Each turn is what the fake model answers
to one request: a text reply (`say`), one or more tool calls (`calls`), or a
choice among alternatives (`choose`, or `when` + `else`) decided by the
previous tool result. The format is documented in docs/scenarios.md.

Every model is frozen and rejects unknown keys (`extra="forbid"`). Parsing
errors are raised as `ScenarioError` naming the file, the YAML line and column
and the path of the offending key (`turns[2].calls[0]: ...`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from corral.errors import ProviderError

__all__ = [
    "CallSpec",
    "Condition",
    "Conversation",
    "EditFile",
    "Fault",
    "FormatCall",
    "McpCall",
    "ReadFile",
    "Scenario",
    "ScenarioError",
    "ToolPattern",
    "ToolSearchConfig",
    "Turn",
    "WireFamily",
    "WriteFile",
    "load_scenario",
    "parse_scenario",
]

WireFamily = Literal["anthropic", "responses", "chat", "gemini"]
"""The request dialects the provider speaks: Anthropic Messages, OpenAI Responses,
OpenAI Chat Completions and Gemini generateContent."""


class ScenarioError(ProviderError, ValueError):
    """A scenario file or document was rejected; the message locates the problem."""


_FROZEN = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ToolPattern:
    """A tool-name pattern: `/regex/`, or `|`-separated globs tried in order.

    `Bash` matches exactly Bash; `exec_command|shell` prefers exec_command and
    falls back to shell; `mcp__*__echo` is a glob; `/mcp__.*__echo/` a regex
    (full match). Matching is case-sensitive, like tool names.
    """

    def __init__(self, text: str) -> None:
        if not text or not text.strip():
            raise ValueError("empty tool pattern")
        self.text = text
        self._regex: re.Pattern[str] | None = None
        self._globs: tuple[str, ...] = ()
        if len(text) >= 2 and text.startswith("/") and text.endswith("/"):
            try:
                self._regex = re.compile(text[1:-1])
            except re.error as exc:
                raise ValueError(f"invalid regex in tool pattern {text!r}: {exc}") from exc
        else:
            self._globs = tuple(part.strip() for part in text.split("|") if part.strip())
            if not self._globs:
                raise ValueError(f"empty tool pattern {text!r}")

    @property
    def literal(self) -> str | None:
        """The single exact name this pattern denotes, if it has no wildcard."""
        if self._regex is not None or len(self._globs) != 1:
            return None
        glob = self._globs[0]
        return None if any(c in glob for c in "*?[") else glob

    def matches(self, name: str) -> bool:
        return self.rank(name) is not None

    def rank(self, name: str) -> int | None:
        """Preference of `name` (0 = best alternative), or None when it does not match."""
        if self._regex is not None:
            return 0 if self._regex.fullmatch(name) else None
        for i, glob in enumerate(self._globs):
            if fnmatch.fnmatchcase(name, glob):
                return i
        return None

    def best(self, names: Sequence[str]) -> str | None:
        """The matching name with the best rank; ties keep the order of `names`."""
        ranked = [(r, i, n) for i, n in enumerate(names) if (r := self.rank(n)) is not None]
        return min(ranked)[2] if ranked else None

    def __repr__(self) -> str:
        return f"ToolPattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolPattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def _pattern(value: str) -> str:
    ToolPattern(value)  # raises ValueError with a readable message
    return value


def _opt_pattern(value: str | None) -> str | None:
    return None if value is None else _pattern(value)


class Fault(BaseModel):
    """Something to break in the reply, for testing how clients cope.

    `status` replaces the reply by an HTTP error (with `body`, or the wire
    family's usual error envelope). `first_byte_delay` waits before anything is
    sent; `event_delay` waits between stream events; `truncate_after` closes
    the connection after that many stream events (or, for a non-streaming
    reply, in the middle of the body); `malformed_at` replaces that stream
    event's data by broken JSON. `attempts` limits the fault to the first N
    attempts of the same turn (retries of an identical conversation), so a
    client's retry succeeds; None means every attempt.
    """

    model_config = _FROZEN

    status: int | None = Field(default=None, ge=400, le=599)
    body: dict[str, Any] | str | None = None
    first_byte_delay: float = Field(default=0.0, ge=0.0, le=600.0)
    event_delay: float = Field(default=0.0, ge=0.0, le=60.0)
    truncate_after: int | None = Field(default=None, ge=0)
    malformed_at: int | None = Field(default=None, ge=0)
    attempts: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Fault:
        if self.body is not None and self.status is None:
            raise ValueError("'body' needs 'status'")
        if self.status is not None and (
            self.truncate_after is not None or self.malformed_at is not None
        ):
            raise ValueError(
                "'status' replaces the reply; it cannot be combined with a stream fault"
            )
        return self

    def active(self, attempt: int) -> bool:
        """Whether the fault applies to the `attempt`-th (1-based) try of its turn."""
        return self.attempts is None or attempt <= self.attempts


class Condition(BaseModel):
    """A test on the previous tool results (those answering the last scripted turn).

    All given fields must hold. `exit_code` is the first non-zero exit code
    among the results, or 0; a result's code is read from its text (`Exit code
    N`, `exited with code N`, `Exit Code: N`), else 1 when the client flagged it
    as an error, else 0. `contains` / `not_contains` search the joined result
    texts (a list means every item); `matches` is a regex search; `is_error`
    tests whether any result was flagged as an error by the client.
    """

    model_config = _FROZEN

    exit_code: int | None = None
    contains: str | list[str] | None = None
    not_contains: str | list[str] | None = None
    matches: str | None = None
    is_error: bool | None = None

    @field_validator("matches")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regex {value!r}: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _nonempty(self) -> Condition:
        if all(
            v is None
            for v in (self.exit_code, self.contains, self.not_contains, self.matches, self.is_error)
        ):
            raise ValueError("a condition needs at least one test")
        return self


class WriteFile(BaseModel):
    model_config = _FROZEN
    path: str = Field(min_length=1)
    content: str


class EditFile(BaseModel):
    model_config = _FROZEN
    path: str = Field(min_length=1)
    old: str = Field(min_length=1)
    new: str


class ReadFile(BaseModel):
    model_config = _FROZEN
    path: str = Field(min_length=1)


class McpCall(BaseModel):
    """An MCP tool `tool` of server `server`, under whatever name the client gives it
    (`mcp__server__tool` for Claude Code, a `mcp__server__` namespace for Codex,
    `mcp_server_tool` for Gemini CLI)."""

    model_config = _FROZEN
    server: str = Field(min_length=1)
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class FormatCall(BaseModel):
    """A tool call written for one wire family: the tool pattern and its input."""

    model_config = _FROZEN
    tool: str | None = None
    input: dict[str, Any] | str | None = None

    _check_tool = field_validator("tool")(_opt_pattern)


class CallSpec(BaseModel):
    """One tool call: exactly one intent (`shell`, `write_file`, `edit_file`,
    `read_file`, `mcp`) or an explicit `tool` pattern with `input`, optionally
    overridden per wire family (`anthropic`, `responses`, `chat`, `gemini`).
    An explicit call may set `search: false` to never go through the client's
    deferred-tool search for it."""

    model_config = _FROZEN

    shell: str | None = None
    write_file: WriteFile | None = None
    edit_file: EditFile | None = None
    read_file: ReadFile | None = None
    mcp: McpCall | None = None
    tool: str | None = None
    input: dict[str, Any] | str | None = None
    anthropic: FormatCall | None = None
    responses: FormatCall | None = None
    chat: FormatCall | None = None
    gemini: FormatCall | None = None
    search: bool = True

    _check_tool = field_validator("tool")(_opt_pattern)

    @model_validator(mode="after")
    def _exactly_one(self) -> CallSpec:
        intents = [
            k for k in ("shell", "write_file", "edit_file", "read_file", "mcp") if getattr(self, k)
        ]
        per_format = [k for k in ("anthropic", "responses", "chat", "gemini") if getattr(self, k)]
        explicit = self.tool is not None or self.input is not None or bool(per_format)
        if len(intents) > 1:
            raise ValueError(f"a call has one intent, got {', '.join(intents)}")
        if intents and explicit:
            raise ValueError(
                f"'{intents[0]}' is an intent; do not combine it with tool/input/per-format keys"
            )
        if not intents and not explicit:
            raise ValueError(
                "a call needs an intent (shell, write_file, edit_file, read_file, mcp) "
                "or a 'tool' pattern with 'input'"
            )
        if self.input is not None and self.tool is None:
            raise ValueError("'input' needs 'tool'")
        return self

    def for_family(self, family: WireFamily) -> FormatCall | None:
        """The explicit (tool, input) for `family`: its override merged over the default."""
        override: FormatCall | None = getattr(self, family)
        tool = (override.tool if override and override.tool else None) or self.tool
        if tool is None:
            return None
        data = override.input if override and override.input is not None else self.input
        return FormatCall(tool=tool, input=data if data is not None else {})

    def describe(self) -> str:
        if self.shell is not None:
            return f"shell: {self.shell}"
        if self.write_file is not None:
            return f"write_file: {self.write_file.path}"
        if self.edit_file is not None:
            return f"edit_file: {self.edit_file.path}"
        if self.read_file is not None:
            return f"read_file: {self.read_file.path}"
        if self.mcp is not None:
            return f"mcp: {self.mcp.server}/{self.mcp.tool}"
        return f"tool: {self.tool or 'per-format'}"


class Turn(BaseModel):
    """One reply of the fake model.

    `say` is text; `calls` are tool calls (`say` may accompany them as a
    preamble). `when` guards the turn with a `Condition` on the previous tool
    results; if it fails, `else` (another turn) is played instead, and without
    `else` the request gets an error. `choose` lists alternatives whose first
    passing `when` (or first without `when`) is played. `fault` breaks the
    reply. Whatever is played, the turn consumes one position of the script.
    """

    model_config = _FROZEN

    label: str | None = None
    say: str | None = None
    calls: tuple[CallSpec, ...] = ()
    when: Condition | None = None
    else_: Turn | None = Field(default=None, alias="else")
    choose: tuple[Turn, ...] = ()
    fault: Fault | None = None

    @model_validator(mode="after")
    def _shape(self) -> Turn:
        if self.choose and (self.say is not None or self.calls or self.else_ is not None):
            raise ValueError("'choose' lists alternatives; put say/calls/else inside them")
        if self.else_ is not None and self.when is None:
            raise ValueError("'else' needs 'when'")
        if not self.choose and self.say is None and not self.calls and self.fault is None:
            raise ValueError("a turn needs 'say', 'calls', 'choose' or 'fault'")
        return self


class ToolSearchConfig(BaseModel):
    """How to reach a tool the client keeps deferred (Claude Code's ToolSearch).

    When a call's tool is not among the request's callable tools but the
    client lists it as deferred (`defer_loading`, or an
    `<available-deferred-tools>` block) — or, for an exact name, whenever a
    search tool is offered — the provider first answers with a call to the
    search tool (`tool`), input `{"query": query}` where `{names}` is replaced
    by the comma-joined tool names. That extra reply does not consume a turn.
    """

    model_config = _FROZEN

    enabled: bool = True
    tool: str = "ToolSearch|tool_search"
    query: str = "select:{names}"

    _check_tool = field_validator("tool")(_pattern)


class Conversation(BaseModel):
    """A script used only for conversations whose opening user text matches `prompt`."""

    model_config = _FROZEN

    prompt: str
    turns: tuple[Turn, ...] = Field(min_length=1)

    @field_validator("prompt")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regex {value!r}: {exc}") from exc
        return value


class Scenario(BaseModel):
    """A whole scenario file. See docs/scenarios.md."""

    model_config = _FROZEN

    name: str = "scenario"
    description: str = ""
    model: str = Field(default="mock-model", min_length=1)
    turns: tuple[Turn, ...] = ()
    conversations: tuple[Conversation, ...] = ()
    fault: Fault | None = None
    tool_search: ToolSearchConfig = ToolSearchConfig()
    side_reply: str | None = "OK"

    @model_validator(mode="after")
    def _has_script(self) -> Scenario:
        if not self.turns and not self.conversations:
            raise ValueError("a scenario needs 'turns' (or 'conversations')")
        return self

    @property
    def search_pattern(self) -> ToolPattern:
        return ToolPattern(self.tool_search.tool)

    def script_for(self, opening: str) -> tuple[tuple[Turn, ...], str]:
        """The turns that apply to a conversation opening with `opening`, and a label."""
        for i, conv in enumerate(self.conversations):
            if re.search(conv.prompt, opening):
                return conv.turns, f"conversations[{i}]"
        return self.turns, "turns"


# -- loading ---------------------------------------------------------------------------


def _node_at(node: yaml.Node, loc: Sequence[int | str]) -> yaml.Node:
    """The deepest YAML node along a pydantic error location."""
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == key:
                    node = v
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            if 0 <= key < len(node.value):
                node = node.value[key]
            else:
                return node
        else:
            return node
    return node


def _loc_text(loc: Sequence[int | str]) -> str:
    out = ""
    for key in loc:
        if isinstance(key, int):
            out += f"[{key}]"
        else:
            out += f".{key}" if out else key
    return out or "(top level)"


def _meaningful_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    # pydantic inserts union-member tags ("str", "list[str]", "function-after[...]") into locs.
    return tuple(k for k in loc if isinstance(k, int) or not re.search(r"[\[\]()]|^(str|int)$", k))


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Parse and validate a scenario document.

    Raises `ScenarioError` whose message is `source:line:col: key.path: reason`
    for the first problems found (one per line).
    """
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(f"{where}: invalid YAML: {problem}") from exc
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: a scenario is a YAML mapping with a 'turns' list")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _meaningful_loc(tuple(err["loc"]))
            where = source
            if root is not None:
                mark = _node_at(root, loc).start_mark
                where = f"{source}:{mark.line + 1}:{mark.column + 1}"
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {_loc_text(loc)}: {msg}")
        raise ScenarioError("\n".join(dict.fromkeys(lines))) from exc


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (see `parse_scenario`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read scenario: {exc.strerror or exc}") from exc
    return parse_scenario(text, str(p))
