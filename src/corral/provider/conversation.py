"""Requests of every wire family, read into one neutral `Request` (pure).

The scenario engine never looks at raw JSON: it sees the tools a request
offers, the assistant turns already in the conversation (with their tool
calls) and the tool results that answered each of them. Unknown item types are
ignored rather than rejected, because the real CLIs add new ones often and the
provider must keep working against them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.provider.scenario import WireFamily

__all__ = [
    "AssistantTurn",
    "OfferedTool",
    "PastCall",
    "Request",
    "ToolResult",
    "parse_request",
    "result_exit_code",
]

Json = Mapping[str, Any]


@dataclass(frozen=True)
class OfferedTool:
    """A tool the client declared. `namespace` is set for Responses namespace tools
    (Codex MCP servers); `custom` for free-form Responses tools (Codex apply_patch);
    `deferred` when the client hides it until found through its search tool."""

    name: str
    schema: Json = field(default_factory=dict)
    namespace: str | None = None
    custom: bool = False
    deferred: bool = False

    @property
    def full_name(self) -> str:
        """The flat name patterns are matched against (`mcp__demo__echo` for a namespace)."""
        if self.namespace is None:
            return self.name
        return f"{self.namespace.rstrip('_')}__{self.name.lstrip('_')}"

    @property
    def properties(self) -> Mapping[str, Any]:
        props = self.schema.get("properties")
        return props if isinstance(props, Mapping) else {}

    @property
    def required(self) -> tuple[str, ...]:
        req = self.schema.get("required")
        return tuple(r for r in req if isinstance(r, str)) if isinstance(req, list) else ()


@dataclass(frozen=True)
class PastCall:
    call_id: str
    name: str


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    text: str
    is_error: bool = False


@dataclass(frozen=True)
class AssistantTurn:
    """One earlier reply of the model and the tool results that answered it."""

    calls: tuple[PastCall, ...] = ()
    text: str = ""
    results: tuple[ToolResult, ...] = ()


@dataclass(frozen=True)
class Request:
    """A model request, whatever its wire family."""

    family: WireFamily
    model: str
    stream: bool
    tools: tuple[OfferedTool, ...]
    turns: tuple[AssistantTurn, ...]
    opening: str
    """User text before the first assistant turn (selects a scenario conversation)."""
    context: str
    """System and user text of the whole request (searched for the working directory)."""
    deferred_names: frozenset[str] = frozenset()
    """Names the client says it can load on demand (beyond `tools`)."""
    discovered: frozenset[str] = frozenset()
    """Names the client already loaded through its search tool (`tool_reference`)."""
    include_usage: bool = False

    @property
    def callable_tools(self) -> tuple[OfferedTool, ...]:
        return tuple(t for t in self.tools if not t.deferred or t.full_name in self.discovered)

    @property
    def all_deferred(self) -> frozenset[str]:
        hidden = {
            t.full_name for t in self.tools if t.deferred and t.full_name not in self.discovered
        }
        return frozenset(hidden | (self.deferred_names - self.discovered))

    @property
    def cwd(self) -> str | None:
        """The working directory the client announced in its prompts, if any."""
        for rx in _CWD_PATTERNS:
            m = rx.search(self.context)
            if m:
                return m.group(1).strip().rstrip(".")
        return None


_CWD_PATTERNS = (
    re.compile(r"<cwd>\s*(/[^<\n]*)</cwd>"),
    re.compile(r"(?i)primary working directory:\s*(/\S+)"),
    re.compile(r"(?i)working directory:\s*(/\S+)"),
    re.compile(r"(?i)currently working in the directory:\s*(/\S+)"),
)
_DEFERRED_BLOCK = re.compile(r"<available-deferred-tools>(.*?)</available-deferred-tools>", re.S)
_EXIT_CODE = re.compile(r"(?i)exit(?:ed)?(?: with)?[ _]code:?\s*(-?\d+)")


def result_exit_code(result: ToolResult) -> int:
    """The exit code a tool result reports: from its text, else 1 if it is an error, else 0."""
    m = _EXIT_CODE.search(result.text)
    if m:
        return int(m.group(1))
    return 1 if result.is_error else 0


# -- helpers ---------------------------------------------------------------------------


def _as_map(value: object) -> Json:
    return value if isinstance(value, Mapping) else {}


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _text_of(content: object) -> str:
    """Plain text of a string or a list of content parts (text / input_text / output_text)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in _as_list(content):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping):
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
            elif part.get("type") == "tool_reference":
                parts.append(f"[tool_reference {part.get('tool_name', '')}]")
    return "\n".join(parts)


def _deferred_names_in(text: str) -> set[str]:
    names: set[str] = set()
    for block in _DEFERRED_BLOCK.findall(text):
        for line in block.splitlines():
            name = line.strip().lstrip("-* ").split()[0] if line.strip().lstrip("-* ") else ""
            name = name.rstrip(":,")
            if name:
                names.add(name)
    return names


class _Builder:
    """Accumulates assistant turns and results while walking a conversation."""

    def __init__(self) -> None:
        self.turns: list[AssistantTurn] = []
        self.opening: list[str] = []
        self.context: list[str] = []
        self._in_assistant = False

    def assistant(self, calls: Iterable[PastCall] = (), text: str = "") -> None:
        calls = tuple(calls)
        if self._in_assistant and self.turns:
            last = self.turns[-1]
            joined = "\n".join(t for t in (last.text, text) if t)
            self.turns[-1] = AssistantTurn(last.calls + calls, joined, last.results)
        else:
            self.turns.append(AssistantTurn(calls, text))
        self._in_assistant = True

    def result(self, result: ToolResult) -> None:
        self._in_assistant = False
        if self.turns:
            last = self.turns[-1]
            self.turns[-1] = AssistantTurn(last.calls, last.text, (*last.results, result))

    def user_text(self, text: str) -> None:
        self._in_assistant = False
        if text:
            self.context.append(text)
            if not self.turns:
                self.opening.append(text)


# -- Anthropic Messages ----------------------------------------------------------------


def _anthropic(body: Json) -> Request:
    b = _Builder()
    discovered: set[str] = set()
    system = body.get("system")
    b.context.append(_text_of(system))
    for msg in map(_as_map, _as_list(body.get("messages"))):
        content = msg.get("content")
        blocks = (
            [{"type": "text", "text": content}] if isinstance(content, str) else _as_list(content)
        )
        if msg.get("role") == "assistant":
            calls = []
            texts = []
            for block in map(_as_map, blocks):
                if block.get("type") in ("tool_use", "server_tool_use"):
                    calls.append(PastCall(_str(block.get("id")), _str(block.get("name"))))
                elif block.get("type") == "text":
                    texts.append(_str(block.get("text")))
            b.assistant(calls, "\n".join(texts))
            continue
        texts = []
        for block in map(_as_map, blocks):
            if block.get("type") == "tool_result":
                inner = block.get("content")
                for part in map(_as_map, _as_list(inner)):
                    if part.get("type") == "tool_reference" and isinstance(
                        part.get("tool_name"), str
                    ):
                        discovered.add(part["tool_name"])
                b.result(
                    ToolResult(
                        _str(block.get("tool_use_id")),
                        _text_of(inner),
                        bool(block.get("is_error")),
                    )
                )
            elif block.get("type") == "text":
                texts.append(_str(block.get("text")))
        b.user_text("\n".join(texts))
    tools = []
    for tool in map(_as_map, _as_list(body.get("tools"))):
        name = tool.get("name")
        if isinstance(name, str):
            tools.append(
                OfferedTool(
                    name,
                    _as_map(tool.get("input_schema")),
                    deferred=bool(tool.get("defer_loading")),
                )
            )
    context = "\n".join(b.context)
    return Request(
        family="anthropic",
        model=_str(body.get("model")),
        stream=bool(body.get("stream")),
        tools=tuple(tools),
        turns=tuple(b.turns),
        opening="\n".join(b.opening),
        context=context,
        deferred_names=frozenset(_deferred_names_in(context)),
        discovered=frozenset(discovered),
    )


# -- OpenAI Responses ------------------------------------------------------------------

_RESPONSES_ASSISTANT_ITEMS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "reasoning",
        "local_shell_call",
        "web_search_call",
        "tool_search_call",
    }
)


def _output_text(output: object) -> tuple[str, bool]:
    if isinstance(output, Mapping):  # {"content": ..., "success": false}
        return _text_of(output.get("content")), output.get("success") is False
    return _text_of(output), False


def _responses(body: Json) -> Request:
    b = _Builder()
    b.context.append(_str(body.get("instructions")))
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in map(_as_map, _as_list(items)):
        kind = item.get("type", "message")
        if kind == "message":
            text = _text_of(item.get("content"))
            if item.get("role") == "assistant":
                b.assistant((), text)
            else:
                b.user_text(text)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call", "tool_search_call"):
            name = _str(item.get("name")) or kind
            ns = item.get("namespace")
            if isinstance(ns, str) and ns:
                name = OfferedTool(name, namespace=ns).full_name
            b.assistant([PastCall(_str(item.get("call_id")), name)])
        elif kind in _RESPONSES_ASSISTANT_ITEMS:
            b.assistant()
        elif kind in (
            "function_call_output",
            "custom_tool_call_output",
            "tool_search_output",
            "local_shell_call_output",
        ):
            text, failed = _output_text(item.get("output"))
            b.result(ToolResult(_str(item.get("call_id")), text, failed))
    tools: list[OfferedTool] = []
    for tool in map(_as_map, _as_list(body.get("tools"))):
        kind = tool.get("type")
        name = tool.get("name")
        if kind == "function" and isinstance(name, str):
            tools.append(
                OfferedTool(
                    name, _as_map(tool.get("parameters")), deferred=bool(tool.get("defer_loading"))
                )
            )
        elif kind == "custom" and isinstance(name, str):
            tools.append(OfferedTool(name, custom=True))
        elif kind == "namespace" and isinstance(name, str):
            for inner in map(_as_map, _as_list(tool.get("tools"))):
                if isinstance(inner.get("name"), str):
                    tools.append(
                        OfferedTool(
                            inner["name"],
                            _as_map(inner.get("parameters")),
                            namespace=name,
                            deferred=bool(inner.get("defer_loading")),
                        )
                    )
    return Request(
        family="responses",
        model=_str(body.get("model")),
        stream=bool(body.get("stream")),
        tools=tuple(tools),
        turns=tuple(b.turns),
        opening="\n".join(b.opening),
        context="\n".join(b.context),
    )


# -- OpenAI Chat Completions -----------------------------------------------------------


def _chat(body: Json) -> Request:
    b = _Builder()
    for msg in map(_as_map, _as_list(body.get("messages"))):
        role = msg.get("role")
        if role == "assistant":
            calls = [
                PastCall(_str(c.get("id")), _str(_as_map(c.get("function")).get("name")))
                for c in map(_as_map, _as_list(msg.get("tool_calls")))
            ]
            b.assistant(calls, _text_of(msg.get("content")))
        elif role == "tool":
            b.result(ToolResult(_str(msg.get("tool_call_id")), _text_of(msg.get("content"))))
        elif role in ("system", "developer"):
            b.context.append(_text_of(msg.get("content")))
        else:
            b.user_text(_text_of(msg.get("content")))
    tools = []
    for tool in map(_as_map, _as_list(body.get("tools"))):
        fn = _as_map(tool.get("function"))
        if isinstance(fn.get("name"), str):
            tools.append(OfferedTool(fn["name"], _as_map(fn.get("parameters"))))
    options = _as_map(body.get("stream_options"))
    return Request(
        family="chat",
        model=_str(body.get("model")),
        stream=bool(body.get("stream")),
        tools=tuple(tools),
        turns=tuple(b.turns),
        opening="\n".join(b.opening),
        context="\n".join(b.context),
        include_usage=bool(options.get("include_usage")),
    )


# -- Gemini ----------------------------------------------------------------------------


def _gemini(body: Json, model: str, stream: bool) -> Request:
    b = _Builder()
    sys_inst = _as_map(body.get("systemInstruction") or body.get("system_instruction"))
    b.context.append(_text_of(sys_inst.get("parts")))
    counter = 0
    for content in map(_as_map, _as_list(body.get("contents"))):
        parts = [_as_map(p) for p in _as_list(content.get("parts"))]
        if content.get("role") == "model":
            calls = []
            for p in parts:
                fc = p.get("functionCall") or p.get("function_call")
                if isinstance(fc, Mapping):
                    call_id = _str(fc.get("id")) or f"gemini-{counter}"
                    counter += 1
                    calls.append(PastCall(call_id, _str(fc.get("name"))))
            b.assistant(calls, "\n".join(_str(p.get("text")) for p in parts if "text" in p))
            continue
        texts = []
        for p in parts:
            fr = p.get("functionResponse") or p.get("function_response")
            if isinstance(fr, Mapping):
                resp = fr.get("response")
                if isinstance(resp, Mapping) and isinstance(resp.get("output"), str):
                    text = resp["output"]
                elif isinstance(resp, Mapping) and isinstance(resp.get("error"), str):
                    text = resp["error"]
                else:
                    text = json.dumps(resp, sort_keys=True)
                err = isinstance(resp, Mapping) and "error" in resp
                b.result(ToolResult(_str(fr.get("id")) or _str(fr.get("name")), text, err))
            elif "text" in p:
                texts.append(_str(p.get("text")))
        b.user_text("\n".join(texts))
    tools = []
    for group in map(_as_map, _as_list(body.get("tools"))):
        decls = group.get("functionDeclarations") or group.get("function_declarations")
        for decl in map(_as_map, _as_list(decls)):
            if isinstance(decl.get("name"), str):
                schema = _as_map(decl.get("parametersJsonSchema") or decl.get("parameters"))
                tools.append(OfferedTool(decl["name"], schema))
    return Request(
        family="gemini",
        model=model,
        stream=stream,
        tools=tuple(tools),
        turns=tuple(b.turns),
        opening="\n".join(b.opening),
        context="\n".join(b.context),
    )


def parse_request(
    family: WireFamily, body: Json, *, model: str = "", stream: bool = False
) -> Request:
    """Read a request body of `family` into a `Request`.

    For Gemini the model and streaming mode come from the URL, so they are
    passed in; the other families carry them in the body.
    """
    match family:
        case "anthropic":
            return _anthropic(body)
        case "responses":
            return _responses(body)
        case "chat":
            return _chat(body)
        case "gemini":
            return _gemini(body, model, stream)


def tool_names(tools: Sequence[OfferedTool]) -> list[str]:
    return [t.full_name for t in tools]
