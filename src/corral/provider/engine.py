"""The scenario engine: which reply a request gets (pure).

Position is derived from the request, not kept on the server: the turn to
play is the number of assistant turns already in the conversation, not
counting the deferred-tool searches the engine inserted itself (their call ids
carry `corral_s`). So the provider is stateless across requests: a retried
request (same conversation) gets the same turn again, a fresh session starts
at turn 0, and several agents can share one server. The only per-server state
is the attempt counter behind `Fault.attempts`, which the caller passes in.

`decide()` returns a `Decision`: a `Reply` (text and tool calls, rendered per
wire family by `corral.provider.wire`) or a `Failure` (HTTP status, error type,
message: scenario exhausted, condition failed, no matching tool), plus the
fault to apply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.provider.conversation import AssistantTurn, OfferedTool, Request, result_exit_code
from corral.provider.intents import NeedsSearch, Resolved, Unresolved, resolve_call
from corral.provider.scenario import Condition, Fault, Scenario, Turn, WireFamily

__all__ = [
    "Decision",
    "Failure",
    "PlannedCall",
    "Reply",
    "condition_holds",
    "decide",
    "is_prelude",
    "scripted_position",
]

_PRELUDE = re.compile(r"corral_s\d+")
_ID_PREFIX: Mapping[WireFamily, str] = {
    "anthropic": "toolu_",
    "responses": "call_",
    "chat": "call_",
    "gemini": "",
}


@dataclass(frozen=True)
class PlannedCall:
    """A tool call to send. `name` is the wire name (a namespace tool's inner name)."""

    call_id: str
    name: str
    namespace: str | None = None
    arguments: Mapping[str, Any] | None = None
    raw_input: str | None = None

    @property
    def custom(self) -> bool:
        return self.raw_input is not None

    @property
    def full_name(self) -> str:
        return OfferedTool(self.name, namespace=self.namespace).full_name

    @property
    def arguments_json(self) -> str:
        return json.dumps(dict(self.arguments or {}), ensure_ascii=False)

    def summary(self) -> dict[str, Any]:
        if self.raw_input is not None:
            return {"name": self.full_name, "input": self.raw_input}
        return {"name": self.full_name, "arguments": dict(self.arguments or {})}


@dataclass(frozen=True)
class Reply:
    text: str = ""
    calls: tuple[PlannedCall, ...] = ()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.text:
            out["text"] = self.text
        if self.calls:
            out["calls"] = [c.summary() for c in self.calls]
        return out


@dataclass(frozen=True)
class Failure:
    """The request is answered with an HTTP error (the scenario cannot go on)."""

    status: int
    kind: str
    message: str


@dataclass(frozen=True)
class Decision:
    outcome: Reply | Failure
    turn: int | None
    """The scenario position played (None when no turn applies)."""
    script: str
    label: str | None = None
    prelude: bool = False
    """The reply is a deferred-tool search inserted before `turn`."""
    side: bool = False
    """A request offering no tools got `side_reply` instead of the turn."""
    fault: Fault | None = None


def is_prelude(turn: AssistantTurn) -> bool:
    return bool(turn.calls) and all(_PRELUDE.search(c.call_id) for c in turn.calls)


def scripted_position(request: Request) -> int:
    """Turns of the script already played in `request`'s conversation."""
    return sum(1 for t in request.turns if not is_prelude(t))


def _previous_results(request: Request) -> tuple[AssistantTurn | None, bool]:
    """The last scripted assistant turn, and whether a search prelude followed it."""
    searched = False
    for turn in reversed(request.turns):
        if is_prelude(turn):
            searched = True
            continue
        return turn, searched
    return None, searched


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def condition_holds(cond: Condition, turn: AssistantTurn | None) -> tuple[bool, str]:
    """Whether `cond` holds on the results of `turn`, and what was observed."""
    results = turn.results if turn is not None else ()
    text = "\n".join(r.text for r in results)
    code = next((c for c in map(result_exit_code, results) if c != 0), 0)
    is_error = any(r.is_error for r in results)
    checks: list[tuple[bool, str]] = []
    if cond.exit_code is not None:
        ok = bool(results) and code == cond.exit_code
        checks.append((ok, f"exit_code {code if results else 'n/a'} (wanted {cond.exit_code})"))
    for needle in _as_list(cond.contains):
        checks.append((needle in text, f"contains {needle!r}"))
    for needle in _as_list(cond.not_contains):
        checks.append((needle not in text, f"not_contains {needle!r}"))
    if cond.matches is not None:
        checks.append((re.search(cond.matches, text) is not None, f"matches {cond.matches!r}"))
    if cond.is_error is not None:
        checks.append((is_error == cond.is_error, f"is_error {is_error} (wanted {cond.is_error})"))
    failed = [why for ok, why in checks if not ok]
    if not failed:
        return True, "all tests passed"
    snippet = text if len(text) <= 200 else text[:200] + "..."
    return False, f"{'; '.join(failed)}; previous result: {snippet!r}"


def _select(turn: Turn, previous: AssistantTurn | None, where: str) -> Turn | Failure:
    if turn.choose:
        reasons = []
        for i, alt in enumerate(turn.choose):
            if alt.when is None:
                return _select(alt, previous, f"{where}.choose[{i}]")
            ok, why = condition_holds(alt.when, previous)
            if ok:
                return _select(alt, previous, f"{where}.choose[{i}]")
            reasons.append(f"choose[{i}]: {why}")
        return Failure(
            500,
            "scenario_condition_failed",
            f"{where}: no alternative holds: " + " | ".join(reasons),
        )
    if turn.when is not None:
        ok, why = condition_holds(turn.when, previous)
        if not ok:
            if turn.else_ is not None:
                return _select(turn.else_, previous, f"{where}.else")
            return Failure(500, "scenario_condition_failed", f"{where}: condition failed: {why}")
    return turn


def _fault(chosen: Turn, top: Turn, scenario: Scenario, attempt: int) -> Fault | None:
    fault = chosen.fault or top.fault or scenario.fault
    return fault if fault is not None and fault.active(attempt) else None


def _call_id(family: WireFamily, marker: str, position: int, index: int) -> str:
    return f"{_ID_PREFIX[family]}corral_{marker}{position}_{index}"


def _search_tool(scenario: Scenario, request: Request) -> OfferedTool | None:
    if not scenario.tool_search.enabled:
        return None
    by_name = {t.full_name: t for t in request.callable_tools}
    best = scenario.search_pattern.best(list(by_name))
    return by_name[best] if best is not None else None


def decide(scenario: Scenario, request: Request, attempt: int = 1) -> Decision:
    """The reply `request` gets from `scenario` at its `attempt`-th (1-based) try."""
    script, script_name = scenario.script_for(request.opening)
    position = scripted_position(request)
    where = f"{script_name}[{position}]"
    if position >= len(script):
        message = (
            f"scenario {scenario.name!r} exhausted at turn {position}: its script has "
            f"{len(script)} turn(s) and the client asked for another reply"
        )
        fault = scenario.fault if scenario.fault and scenario.fault.active(attempt) else None
        return Decision(
            Failure(500, "scenario_exhausted", message), position, script_name, fault=fault
        )
    top = script[position]
    previous, searched = _previous_results(request)
    chosen = _select(top, previous, where)
    if isinstance(chosen, Failure):
        return Decision(chosen, position, script_name, top.label)
    label = chosen.label or top.label
    fault = _fault(chosen, top, scenario, attempt)

    def made(outcome: Reply | Failure, prelude: bool = False) -> Decision:
        return Decision(outcome, position, script_name, label, prelude=prelude, fault=fault)

    if chosen.calls and not request.tools and scenario.side_reply is not None:
        return Decision(
            Reply(scenario.side_reply), None, script_name, label, side=True, fault=fault
        )

    search_tool = _search_tool(scenario, request)
    calls: list[PlannedCall] = []
    wanted: list[str] = []
    for k, spec in enumerate(chosen.calls):
        resolution = resolve_call(spec, request, search=search_tool is not None)
        if isinstance(resolution, NeedsSearch):
            if search_tool is None or searched:
                why = resolution.unresolved
                if searched:
                    why += f"; {resolution.name} was searched for but is still not callable"
                return made(Failure(500, "scenario_no_matching_tool", f"{where}.calls[{k}]: {why}"))
            wanted.append(resolution.name)
            continue
        if isinstance(resolution, Unresolved):
            message = f"{where}.calls[{k}]: {resolution.message}"
            return made(Failure(500, "scenario_no_matching_tool", message))
        calls.append(_planned(resolution, request.family, position, k))
    if wanted:
        assert search_tool is not None
        names = ",".join(dict.fromkeys(wanted))
        query = scenario.tool_search.query.replace("{names}", names)
        call = PlannedCall(
            _call_id(request.family, "s", position, 0),
            search_tool.name,
            search_tool.namespace,
            {"query": query},
        )
        return made(Reply("", (call,)), prelude=True)
    return made(Reply(chosen.say or "", tuple(calls)))


def _planned(resolved: Resolved, family: WireFamily, position: int, index: int) -> PlannedCall:
    tool = resolved.tool
    return PlannedCall(
        _call_id(family, "t", position, index),
        tool.name,
        tool.namespace,
        resolved.arguments if resolved.raw_input is None else None,
        resolved.raw_input,
    )
