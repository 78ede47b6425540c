"""Mapping a scripted call to a tool the request actually offers (pure).

A scenario says *what* to do (`shell: "make test"`, `write_file: {...}`) and
this module finds *how* with the client at hand: Claude Code's Bash / Write /
Edit / Read, Codex's exec_command / shell / apply_patch, Gemini CLI's
run_shell_command / write_file / replace / read_file, opencode's bash / write /
edit / read, and otherwise any tool whose name fits, with arguments filled
from the tool's own JSON schema (the property names it declares and the ones
it requires). An explicit `tool:` pattern bypasses the intents.

The result is `Resolved` (tool + arguments), `NeedsSearch` (the tool exists
but the client keeps it deferred behind its search tool) or `Unresolved` (with
a message naming what the request offered).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.provider.conversation import OfferedTool, Request
from corral.provider.scenario import CallSpec, ToolPattern

__all__ = ["NeedsSearch", "Resolved", "Unresolved", "resolve_call"]


@dataclass(frozen=True)
class Resolved:
    tool: OfferedTool
    arguments: Mapping[str, Any] | None = None
    """Arguments of a function tool."""
    raw_input: str | None = None
    """Input of a free-form (custom) tool."""


@dataclass(frozen=True)
class NeedsSearch:
    name: str
    unresolved: str
    """Why the call fails if no search tool can load `name`."""


@dataclass(frozen=True)
class Unresolved:
    message: str


Resolution = Resolved | NeedsSearch | Unresolved
_Builder = Callable[[OfferedTool], Resolved | None]

_SHELL_DESCRIPTION = "Run a shell command (corral scenario)"


def _pick(tool: OfferedTool, names: Sequence[str], default: str) -> str:
    props = tool.properties
    return next((n for n in names if n in props), default)


def _prop_type(tool: OfferedTool, key: str) -> object:
    prop = tool.properties.get(key)
    return prop.get("type") if isinstance(prop, Mapping) else None


#: Required free-text properties a client validates but only a person reads.
_PROSE_KEYS = ("description", "instruction")


def _fill_required(tool: OfferedTool, args: dict[str, Any], prose: str) -> dict[str, Any]:
    # opencode's bash makes a description mandatory and Gemini CLI's replace an
    # `instruction`; the client rejects the call without them ("params must have
    # required property 'instruction'") before it touches the file.
    for req in tool.required:
        if req not in args and req in _PROSE_KEYS and _prop_type(tool, req) in ("string", None):
            args[req] = prose
    return args


def _abs_path(path: str, request: Request) -> str:
    cwd = request.cwd
    if posixpath.isabs(path) or cwd is None:
        return path
    return posixpath.normpath(posixpath.join(cwd, path))


def _with_input(tool: OfferedTool, text: str) -> Resolved:
    if tool.custom:
        return Resolved(tool, raw_input=text)
    return Resolved(tool, {_pick(tool, ("input", "patch"), "input"): text})


def _is_intent_target(tool: OfferedTool) -> bool:
    # Generic name matching must not pick an MCP tool that happens to say "shell".
    return tool.namespace is None and not tool.full_name.startswith("mcp_")


# -- shell -----------------------------------------------------------------------------


def _shell_builder(cmd: str) -> _Builder:
    def build(tool: OfferedTool) -> Resolved | None:
        if tool.custom:
            return None
        default = "cmd" if tool.name == "exec_command" else "command"
        key = _pick(tool, ("command", "cmd", "script", "commands"), default)
        typ = _prop_type(tool, key)
        as_list = typ == "array" or (typ is None and tool.name == "shell")
        value: object = ["bash", "-lc", cmd] if as_list else cmd
        return Resolved(tool, _fill_required(tool, {key: value}, _SHELL_DESCRIPTION))

    return build


_SHELL_NAMES = ("Bash", "exec_command", "shell_command", "shell", "run_shell_command", "bash")
_SHELL_GENERIC = ToolPattern(r"/(?i).*(shell|bash|exec|command|terminal).*/")


def _shell_candidates(cmd: str) -> Sequence[tuple[ToolPattern, _Builder]]:
    build = _shell_builder(cmd)
    return [(ToolPattern(n), build) for n in _SHELL_NAMES] + [(_SHELL_GENERIC, build)]


# -- files -----------------------------------------------------------------------------

_PATH_KEYS = ("file_path", "filePath", "path", "absolute_path", "filename", "file")


def _add_patch(path: str, content: str) -> str:
    body = "".join(f"+{line}\n" for line in content.splitlines())
    return f"*** Begin Patch\n*** Add File: {path}\n{body}*** End Patch\n"


def _update_patch(path: str, old: str, new: str) -> str:
    minus = "".join(f"-{line}\n" for line in old.splitlines())
    plus = "".join(f"+{line}\n" for line in new.splitlines())
    return f"*** Begin Patch\n*** Update File: {path}\n@@\n{minus}{plus}*** End Patch\n"


def _write_candidates(
    path: str, content: str, request: Request
) -> Sequence[tuple[ToolPattern, _Builder]]:
    def build(tool: OfferedTool) -> Resolved | None:
        if tool.custom:
            return None
        pkey = _pick(tool, _PATH_KEYS, "file_path")
        ckey = _pick(tool, ("content", "contents", "text", "file_text", "data"), "content")
        args = {pkey: _abs_path(path, request), ckey: content}
        return Resolved(tool, _fill_required(tool, args, f"Write {path} (corral scenario)"))

    def patch(tool: OfferedTool) -> Resolved | None:
        return _with_input(tool, _add_patch(path, content))

    names = ("Write", "write_file", "write", "create_file")
    return [(ToolPattern(n), build) for n in names] + [
        (ToolPattern("apply_patch"), patch),
        (ToolPattern(r"/(?i).*(write|create).*file.*|.*file.*(write|create).*/"), build),
    ]


def _edit_candidates(
    path: str, old: str, new: str, request: Request
) -> Sequence[tuple[ToolPattern, _Builder]]:
    def build(tool: OfferedTool) -> Resolved | None:
        if tool.custom:
            return None
        pkey = _pick(tool, _PATH_KEYS, "file_path")
        okey = _pick(tool, ("old_string", "oldString", "old_str", "old"), "old_string")
        nkey = _pick(tool, ("new_string", "newString", "new_str", "new"), "new_string")
        args = {pkey: _abs_path(path, request), okey: old, nkey: new}
        prose = f"In {path}, replace the scripted old text with the new text (corral scenario)"
        return Resolved(tool, _fill_required(tool, args, prose))

    def patch(tool: OfferedTool) -> Resolved | None:
        return _with_input(tool, _update_patch(path, old, new))

    return [(ToolPattern(n), build) for n in ("Edit", "replace", "edit")] + [
        (ToolPattern("apply_patch"), patch),
        (ToolPattern(r"/(?i).*(edit|replace).*/"), build),
    ]


def _read_candidates(path: str, request: Request) -> Sequence[tuple[ToolPattern, _Builder]]:
    def build(tool: OfferedTool) -> Resolved | None:
        if tool.custom:
            return None
        return Resolved(tool, {_pick(tool, _PATH_KEYS, "file_path"): _abs_path(path, request)})

    return [(ToolPattern(n), build) for n in ("Read", "read_file", "read")] + [
        (ToolPattern(r"/(?i).*read.*file.*/"), build),
    ]


# -- resolution ------------------------------------------------------------------------


def _offered(request: Request) -> str:
    names = [t.full_name for t in request.callable_tools]
    deferred = sorted(request.all_deferred)
    text = ", ".join(names) if names else "no tools"
    if deferred:
        text += f"; deferred: {', '.join(deferred)}"
    return text


def _first(
    candidates: Sequence[tuple[ToolPattern, _Builder]],
    tools: Sequence[OfferedTool],
    generic_ok: bool,
) -> Resolved | None:
    for pattern, build in candidates:
        for tool in tools:
            if not pattern.matches(tool.full_name):
                continue
            if pattern.literal is None and not (generic_ok and _is_intent_target(tool)):
                continue
            resolved = build(tool)
            if resolved is not None:
                return resolved
    return None


def _explicit(spec: CallSpec, request: Request, search: bool) -> Resolution:
    fc = spec.for_family(request.family)
    if fc is None or fc.tool is None:
        return Unresolved(f"the call has no tool for the {request.family} wire family")
    pattern = ToolPattern(fc.tool)
    by_name = {t.full_name: t for t in request.callable_tools}
    best = pattern.best(list(by_name))
    if best is not None:
        tool = by_name[best]
        data = fc.input
        if tool.custom:
            text = data if isinstance(data, str) else json.dumps(data)
            return Resolved(tool, raw_input=text)
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                return Unresolved(f"tool {best} takes JSON arguments; input is not JSON")
            if not isinstance(data, dict):
                return Unresolved(
                    f"tool {best} takes a JSON object; input is {type(data).__name__}"
                )
        return Resolved(tool, dict(data or {}))
    message = f"no offered tool matches {fc.tool!r} (offered: {_offered(request)})"
    deferred = pattern.best(sorted(request.all_deferred))
    if deferred is not None:
        return NeedsSearch(deferred, message)
    if search and spec.search and pattern.literal is not None:
        return NeedsSearch(pattern.literal, message)
    return Unresolved(message)


def _mcp(spec: CallSpec, request: Request) -> Resolution:
    assert spec.mcp is not None
    server, name, args = spec.mcp.server, spec.mcp.tool, spec.mcp.arguments
    names = (f"mcp__{server}__{name}", f"mcp_{server}_{name}", f"{server}__{name}")
    for candidate in names:
        for tool in request.callable_tools:
            if tool.full_name == candidate:
                return Resolved(tool, dict(args))
    message = (
        f"no offered tool is MCP tool {name!r} of server {server!r} (offered: {_offered(request)})"
    )
    for candidate in names:
        if candidate in request.all_deferred:
            return NeedsSearch(candidate, message)
    if spec.search and request.family == "anthropic":
        return NeedsSearch(names[0], message)
    return Unresolved(message)


def resolve_call(spec: CallSpec, request: Request, *, search: bool = True) -> Resolution:
    """Find the offered tool and arguments that carry out `spec` for `request`.

    `search` allows answering `NeedsSearch` for an exact name that is not
    listed at all (only useful when the client offers a search tool).
    """
    if spec.mcp is not None:
        return _mcp(spec, request)
    if (
        spec.shell is None
        and spec.write_file is None
        and spec.edit_file is None
        and spec.read_file is None
    ):
        return _explicit(spec, request, search)
    tools = request.callable_tools
    intent = spec.describe()
    fallback_cmd: str | None = None
    if spec.shell is not None:
        candidates = _shell_candidates(spec.shell)
    elif spec.write_file is not None:
        w = spec.write_file
        candidates = _write_candidates(w.path, w.content, request)
        directory = posixpath.dirname(w.path)
        mkdir = f"mkdir -p -- {shlex.quote(directory)} && " if directory else ""
        fallback_cmd = f"{mkdir}printf '%s' {shlex.quote(w.content)} > {shlex.quote(w.path)}"
    elif spec.edit_file is not None:
        e = spec.edit_file
        candidates = _edit_candidates(e.path, e.old, e.new, request)
    else:
        assert spec.read_file is not None
        candidates = _read_candidates(spec.read_file.path, request)
        fallback_cmd = f"cat -- {shlex.quote(spec.read_file.path)}"
    found = _first(candidates, tools, generic_ok=True)
    if found is None and fallback_cmd is not None:
        found = _first(_shell_candidates(fallback_cmd), tools, generic_ok=True)
    if found is not None:
        return found
    return Unresolved(f"no offered tool can do {intent!r} (offered: {_offered(request)})")
