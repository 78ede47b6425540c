"""Scenario parsing and validation: what is accepted, and where errors point."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import CorralError, ProviderError
from corral.provider.scenario import (
    Fault,
    ScenarioError,
    ToolPattern,
    load_scenario,
    parse_scenario,
)

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.yaml")
    return str(info.value)


def test_minimal_scenario_and_defaults() -> None:
    s = parse_scenario("turns:\n  - say: hello\n")
    assert s.turns[0].say == "hello"
    assert s.model == "mock-model"
    assert s.tool_search.enabled
    assert s.tool_search.query == "select:{names}"
    assert s.side_reply == "OK"


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_scenarios_load(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.turns


def test_examples_exist() -> None:
    names = {p.name for p in SCENARIOS.glob("*.yaml")}
    assert {"write-file.yaml", "edit-and-mcp.yaml", "failing-provider.yaml"} <= names


def test_unknown_key_is_located() -> None:
    msg = _error("turns:\n  - say: hi\n    sya: typo\n")
    assert msg.startswith("s.yaml:3:")
    assert "turns[0].sya" in msg
    assert "Extra inputs are not permitted" in msg


def test_nested_error_points_at_the_call() -> None:
    text = "turns:\n  - say: a\n  - calls:\n      - shell: ls\n        tool: Bash\n"
    msg = _error(text)
    assert "s.yaml:4:" in msg
    assert "turns[1].calls[0]" in msg
    assert "intent" in msg


def test_call_needs_exactly_one_intent() -> None:
    assert "one intent" in _error("turns:\n - calls:\n   - {shell: ls, read_file: {path: x}}\n")
    assert "needs an intent" in _error("turns:\n - calls:\n   - {search: false}\n")
    assert "'input' needs 'tool'" in _error("turns:\n - calls:\n   - {input: {a: 1}}\n")


def test_turn_shape_rules() -> None:
    assert "'else' needs 'when'" in _error("turns:\n - say: a\n   else: {say: b}\n")
    assert "needs 'say'" in _error("turns:\n - label: empty\n")
    assert "alternatives" in _error("turns:\n - say: x\n   choose: [{say: y}]\n")
    assert "at least one test" in _error("turns:\n - when: {}\n   say: x\n")


def test_bad_patterns_and_regexes_are_rejected() -> None:
    assert "invalid regex" in _error("turns:\n - calls: [{tool: '/(/'}]\n")
    assert "invalid regex" in _error("turns:\n - when: {matches: '('}\n   say: x\n")
    assert "invalid regex" in _error("conversations:\n - prompt: '['\n   turns: [{say: x}]\n")


def test_fault_validation() -> None:
    assert "less than or equal to 599" in _error("turns:\n - say: x\n   fault: {status: 700}\n")
    assert "'body' needs 'status'" in _error("turns:\n - say: x\n   fault: {body: oops}\n")
    assert "cannot be combined" in _error(
        "fault: {status: 500, truncate_after: 2}\nturns: [{say: x}]\n"
    )
    f = Fault(status=529, attempts=2)
    assert f.active(1) and f.active(2) and not f.active(3)
    assert Fault(event_delay=0.1).active(100)


def test_yaml_syntax_error_is_located() -> None:
    msg = _error("turns:\n  - say: [unclosed\n")
    assert msg.startswith("s.yaml:")
    assert "invalid YAML" in msg


def test_empty_and_non_mapping_documents() -> None:
    assert "mapping" in _error("- say: x\n")
    assert "needs 'turns'" in _error("name: nothing\n")


def test_scenario_error_is_a_corral_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path / "missing.yaml")
    assert isinstance(info.value, ProviderError)
    assert isinstance(info.value, CorralError)
    assert isinstance(info.value, ValueError)
    assert "cannot read scenario" in str(info.value)


def test_models_are_frozen() -> None:
    s = parse_scenario("turns: [{say: x}]")
    with pytest.raises(ValueError, match="frozen"):
        setattr(s.turns[0], "say", "y")  # noqa: B010 (assignment to a frozen model)


def test_tool_pattern_globs_alternatives_and_regex() -> None:
    p = ToolPattern("exec_command|shell")
    assert p.best(["shell", "exec_command"]) == "exec_command"
    assert p.best(["shell", "Bash"]) == "shell"
    assert p.best(["Bash"]) is None
    assert p.literal is None
    assert ToolPattern("Bash").literal == "Bash"
    g = ToolPattern("mcp__*__echo")
    assert g.matches("mcp__demo__echo") and not g.matches("mcp__demo__echo2")
    assert g.literal is None
    r = ToolPattern("/mcp__(demo|other)__e.*/")
    assert r.matches("mcp__other__echo") and not r.matches("xmcp__demo__echo")
    assert not ToolPattern("bash").matches("Bash")  # names are case-sensitive
    with pytest.raises(ValueError):
        ToolPattern(" | ")


def test_per_family_call_overrides() -> None:
    s = parse_scenario(
        """
turns:
  - calls:
      - tool: Bash
        input: {command: ls}
        responses: {tool: exec_command, input: {cmd: ls}}
        gemini: {input: {command: ls -la}}
"""
    )
    call = s.turns[0].calls[0]
    anthropic = call.for_family("anthropic")
    assert (
        anthropic is not None and anthropic.tool == "Bash" and anthropic.input == {"command": "ls"}
    )
    responses = call.for_family("responses")
    assert responses is not None and responses.tool == "exec_command"
    assert responses.input == {"cmd": "ls"}
    gemini = call.for_family("gemini")
    assert gemini is not None and gemini.tool == "Bash" and gemini.input == {"command": "ls -la"}


def test_conversation_scripts_by_prompt() -> None:
    s = parse_scenario(
        """
turns: [{say: default}]
conversations:
  - prompt: "(?i)session two"
    turns: [{say: second}]
"""
    )
    turns, name = s.script_for("This is Session Two, go")
    assert name == "conversations[0]" and turns[0].say == "second"
    turns, name = s.script_for("first session")
    assert name == "turns" and turns[0].say == "default"
