"""The scenario engine on request bodies shaped like each agent CLI's (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.provider.conversation import ToolResult, parse_request, result_exit_code
from corral.provider.engine import Decision, Failure, PlannedCall, Reply, decide
from corral.provider.scenario import Scenario, WireFamily, parse_scenario

Body = dict[str, Any]


def _schema(*props: str, required: tuple[str, ...] = ()) -> Body:
    return {
        "type": "object",
        "properties": {p: {"type": "string"} for p in props},
        "required": list(required or props[:1]),
    }


# -- client-shaped requests ------------------------------------------------------------

CLAUDE_TOOLS: list[Body] = [
    {"name": "Bash", "input_schema": _schema("command", "description", "timeout")},
    {
        "name": "Write",
        "input_schema": _schema("file_path", "content", required=("file_path", "content")),
    },
    {"name": "Edit", "input_schema": _schema("file_path", "old_string", "new_string")},
    {"name": "Read", "input_schema": _schema("file_path", "offset")},
    {"name": "ToolSearch", "input_schema": _schema("query", "max_results")},
]
CLAUDE_SYSTEM = [
    {"type": "text", "text": "You are Claude Code."},
    {"type": "text", "text": "<env>\nPrimary working directory: /work/ws\nPlatform: linux\n</env>"},
]
DEFERRED = (
    "<available-deferred-tools>\nmcp__demo__echo\nmcp__demo__add\n</available-deferred-tools>"
)


def claude(messages: list[Body], tools: list[Body] | None = None) -> Body:
    return {
        "model": "claude-sonnet-4-5",
        "stream": True,
        "system": CLAUDE_SYSTEM,
        "tools": list(CLAUDE_TOOLS if tools is None else tools),
        "messages": messages,
    }


def claude_user(text: str = "do the task") -> Body:
    return {
        "role": "user",
        "content": [{"type": "text", "text": DEFERRED}, {"type": "text", "text": text}],
    }


def claude_round(call: PlannedCall, result: str | list[Body], is_error: bool = False) -> list[Body]:
    return [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": call.call_id,
                    "name": call.full_name,
                    "input": dict(call.arguments or {}),
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.call_id,
                    "content": result,
                    "is_error": is_error,
                }
            ],
        },
    ]


CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": _schema("cmd", "workdir")},
    {"type": "function", "name": "write_stdin", "parameters": _schema("session_id", "chars")},
    {
        "type": "custom",
        "name": "apply_patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": "..."},
    },
    {
        "type": "namespace",
        "name": "mcp__demo__",
        "description": "demo MCP server",
        "tools": [{"type": "function", "name": "echo", "parameters": _schema("text")}],
    },
]


def codex(items: list[Body], tools: list[Body] | None = None) -> Body:
    opening = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sandbox rules"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "<environment_context>\n  <cwd>/srv/proj</cwd>\n</environment_context>",
                }
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "do the task"}],
        },
    ]
    return {
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "stream": True,
        "tools": list(CODEX_TOOLS if tools is None else tools),
        "input": opening + items,
    }


def codex_round(call: PlannedCall, output: str) -> list[Body]:
    if call.custom:
        return [
            {
                "type": "custom_tool_call",
                "call_id": call.call_id,
                "name": call.name,
                "input": call.raw_input,
            },
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": output},
        ]
    item: Body = {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments_json,
    }
    if call.namespace:
        item["namespace"] = call.namespace
    return [item, {"type": "function_call_output", "call_id": call.call_id, "output": output}]


GEMINI_EDIT_REQ = ("file_path", "instruction", "old_string", "new_string")
GEMINI_TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "run_shell_command",
                "parametersJsonSchema": _schema("command", "description"),
            },
            {"name": "write_file", "parametersJsonSchema": _schema("file_path", "content")},
            {
                "name": "replace",
                # Gemini CLI 0.61 requires an `instruction` (invalid_tool_params without).
                "parametersJsonSchema": _schema(
                    "file_path", "instruction", "old_string", "new_string", required=GEMINI_EDIT_REQ
                ),
            },
            {"name": "read_file", "parametersJsonSchema": _schema("absolute_path")},
            {"name": "mcp_demo_echo", "parametersJsonSchema": _schema("text")},
        ]
    }
]


def gemini(contents: list[Body]) -> Body:
    return {
        "systemInstruction": {
            "parts": [{"text": "I'm currently working in the directory: /home/u/app"}]
        },
        "tools": GEMINI_TOOLS,
        "contents": [{"role": "user", "parts": [{"text": "do the task"}]}, *contents],
    }


OPENCODE_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": s}}
    for n, s in [
        ("bash", _schema("command", "description", required=("command", "description"))),
        ("write", _schema("filePath", "content", required=("filePath", "content"))),
        ("edit", _schema("filePath", "oldString", "newString")),
        ("read", _schema("filePath")),
    ]
]


def chat(messages: list[Body]) -> Body:
    return {
        "model": "mock-model",
        "stream": True,
        "tools": OPENCODE_TOOLS,
        "messages": [
            {"role": "system", "content": "Working directory: /opt/oc"},
            {"role": "user", "content": "do it"},
            *messages,
        ],
    }


def run(scenario: Scenario, family: WireFamily, body: Body, attempt: int = 1) -> Decision:
    return decide(scenario, parse_request(family, body, model="gemini-x"), attempt)


def reply_of(decision: Decision) -> Reply:
    assert isinstance(decision.outcome, Reply), decision.outcome
    return decision.outcome


def failure_of(decision: Decision) -> Failure:
    assert isinstance(decision.outcome, Failure), decision.outcome
    return decision.outcome


def only_call(decision: Decision) -> PlannedCall:
    reply = reply_of(decision)
    assert len(reply.calls) == 1, reply
    return reply.calls[0]


WRITE_FILE = parse_scenario(
    """
name: write-file
turns:
  - say: "I'll create it."
    calls: [{shell: "echo hi > hello.txt"}]
  - when: {exit_code: 0}
    say: done
    else: {say: failed}
"""
)


# -- position, retries, exhaustion -----------------------------------------------------


def test_position_is_derived_from_the_conversation() -> None:
    first = run(WRITE_FILE, "anthropic", claude([claude_user()]))
    assert first.turn == 0
    call = only_call(first)
    assert call.name == "Bash" and call.arguments == {"command": "echo hi > hello.txt"}
    assert reply_of(first).text == "I'll create it."
    # A retry of the identical request gets the identical reply (stateless, no drift).
    assert run(WRITE_FILE, "anthropic", claude([claude_user()])) == first
    second = run(WRITE_FILE, "anthropic", claude([claude_user(), *claude_round(call, "")]))
    assert second.turn == 1
    assert reply_of(second) == Reply("done")


def test_exhaustion_is_an_explicit_error_never_a_loop() -> None:
    call = only_call(run(WRITE_FILE, "anthropic", claude([claude_user()])))
    messages = [claude_user(), *claude_round(call, "")]
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        {"role": "user", "content": "and now?"},
    ]
    decision = run(WRITE_FILE, "anthropic", claude(messages))
    failure = failure_of(decision)
    assert failure.status == 500
    assert failure.kind == "scenario_exhausted"
    assert "exhausted at turn 2" in failure.message
    assert decision.turn == 2


def test_consecutive_assistant_messages_count_as_one_turn() -> None:
    call = only_call(run(WRITE_FILE, "anthropic", claude([claude_user()])))
    split = [
        claude_user(),
        {"role": "assistant", "content": [{"type": "text", "text": "I'll create it."}]},
        *claude_round(call, ""),
    ]
    assert run(WRITE_FILE, "anthropic", claude(split)).turn == 1


# -- conditions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "is_error", "code"),
    [
        ("", False, 0),
        ("Exit code 2\nls: cannot access", True, 2),
        ("some error", True, 1),
        (
            "Chunk ID: 1\nWall time: 0.01\nProcess exited with code 0\nOutput:\nexit code 9",
            False,
            0,
        ),
        ("Exit Code: 127", False, 127),
    ],
)
def test_exit_code_of_results(text: str, is_error: bool, code: int) -> None:
    assert result_exit_code(ToolResult("id", text, is_error)) == code


def test_else_branch_on_failed_exit_code_claude() -> None:
    call = only_call(run(WRITE_FILE, "anthropic", claude([claude_user()])))
    body = claude(
        [claude_user(), *claude_round(call, "Exit code 1\npermission denied", is_error=True)]
    )
    decision = run(WRITE_FILE, "anthropic", body)
    assert reply_of(decision) == Reply("failed")
    assert decision.turn == 1


def test_condition_on_codex_exec_output() -> None:
    call = only_call(run(WRITE_FILE, "responses", codex([])))
    assert call.name == "exec_command" and call.arguments == {"cmd": "echo hi > hello.txt"}
    ok = codex(codex_round(call, "Chunk ID: ab\nProcess exited with code 0\nOutput:\n"))
    assert reply_of(run(WRITE_FILE, "responses", ok)) == Reply("done")
    bad = codex(codex_round(call, "Process exited with code 3\nOutput:\noops"))
    assert reply_of(run(WRITE_FILE, "responses", bad)) == Reply("failed")


def test_condition_without_else_fails_loudly() -> None:
    s = parse_scenario(
        "turns:\n - calls: [{shell: ls}]\n - when: {contains: README}\n   say: found\n"
    )
    call = only_call(run(s, "anthropic", claude([claude_user()])))
    failure = failure_of(
        run(s, "anthropic", claude([claude_user(), *claude_round(call, "main.py")]))
    )
    assert failure.kind == "scenario_condition_failed"
    assert (
        "turns[1]" in failure.message
        and "README" in failure.message
        and "main.py" in failure.message
    )


def test_choose_takes_the_first_passing_alternative() -> None:
    s = parse_scenario(
        """
turns:
  - calls: [{shell: make test}]
  - choose:
      - when: {contains: FAILED, not_contains: flaky}
        calls: [{shell: make fix}]
      - when: {matches: "passed in [0-9.]+s"}
        say: green
      - when: {is_error: true}
        say: broken
"""
    )
    call = only_call(run(s, "anthropic", claude([claude_user()])))

    def after(result: str, is_error: bool = False) -> Decision:
        return run(s, "anthropic", claude([claude_user(), *claude_round(call, result, is_error)]))

    assert only_call(after("2 FAILED")).arguments == {"command": "make fix"}
    assert reply_of(after("10 passed in 0.3s")) == Reply("green")
    assert reply_of(after("FAILED but flaky", is_error=True)) == Reply("broken")
    failure = failure_of(after("FAILED, flaky"))
    assert "no alternative holds" in failure.message and "choose[2]" in failure.message


def test_contains_list_means_all() -> None:
    s = parse_scenario(
        "turns:\n - calls: [{shell: x}]\n"
        " - when: {contains: [a, b]}\n   say: both\n   else: {say: not both}\n"
    )
    call = only_call(run(s, "chat", chat([])))

    def after(text: str) -> Reply:
        msgs: list[Body] = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": call.arguments_json},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": text},
        ]
        return reply_of(run(s, "chat", chat(msgs)))

    assert after("a and b") == Reply("both")
    assert after("only a") == Reply("not both")


# -- intents per client ----------------------------------------------------------------

SHELL = parse_scenario("turns: [{calls: [{shell: 'ls -la'}]}]")


def test_shell_intent_per_client() -> None:
    assert only_call(run(SHELL, "anthropic", claude([claude_user()]))).arguments == {
        "command": "ls -la"
    }
    assert only_call(run(SHELL, "responses", codex([]))).arguments == {"cmd": "ls -la"}
    g = only_call(run(SHELL, "gemini", gemini([])))
    assert g.name == "run_shell_command" and g.arguments == {"command": "ls -la"}
    oc = only_call(run(SHELL, "chat", chat([])))
    assert oc.name == "bash"
    assert (
        oc.arguments is not None
        and oc.arguments["command"] == "ls -la"
        and oc.arguments["description"]
    )


def test_legacy_codex_shell_takes_an_argv() -> None:
    tools = [
        {
            "type": "function",
            "name": "shell",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            },
        }
    ]
    call = only_call(run(SHELL, "responses", codex([], tools)))
    assert call.arguments == {"command": ["bash", "-lc", "ls -la"]}


WRITE = parse_scenario(
    'turns: [{calls: [{write_file: {path: src/a.txt, content: "one\\ntwo\\n"}}]}]'
)


def test_write_intent_per_client() -> None:
    c = only_call(run(WRITE, "anthropic", claude([claude_user()])))
    assert c.name == "Write" and c.arguments == {
        "file_path": "/work/ws/src/a.txt",
        "content": "one\ntwo\n",
    }
    x = only_call(run(WRITE, "responses", codex([])))
    assert x.name == "apply_patch" and x.custom and x.arguments is None
    assert x.raw_input == "*** Begin Patch\n*** Add File: src/a.txt\n+one\n+two\n*** End Patch\n"
    g = only_call(run(WRITE, "gemini", gemini([])))
    assert g.arguments == {"file_path": "/home/u/app/src/a.txt", "content": "one\ntwo\n"}
    oc = only_call(run(WRITE, "chat", chat([])))
    assert oc.arguments == {"filePath": "/opt/oc/src/a.txt", "content": "one\ntwo\n"}


def test_required_prose_fields_are_filled_only_when_required() -> None:
    # A client that validates its schema refuses a call missing a required
    # `description` / `instruction`; an optional one is left out.
    tools = [
        {
            "type": "function",
            "name": "write_file",
            "parameters": _schema(
                "path", "content", "description", "instruction", required=("path", "instruction")
            ),
        }
    ]
    args = dict(only_call(run(WRITE, "responses", codex([], tools))).arguments or {})
    assert args.keys() == {"path", "content", "instruction"}
    assert "src/a.txt" in args["instruction"]


def test_write_falls_back_to_the_shell() -> None:
    tools = [{"type": "function", "name": "exec_command", "parameters": _schema("cmd")}]
    call = only_call(run(WRITE, "responses", codex([], tools)))
    assert call.name == "exec_command"
    assert call.arguments == {"cmd": "mkdir -p -- src && printf '%s' 'one\ntwo\n' > src/a.txt"}


def test_edit_and_read_intents() -> None:
    s = parse_scenario(
        "turns: [{calls: [{edit_file: {path: a.py, old: x = 1, new: x = 2}},"
        " {read_file: {path: /etc/hostname}}]}]"
    )
    claude_calls = reply_of(run(s, "anthropic", claude([claude_user()]))).calls
    assert [c.name for c in claude_calls] == ["Edit", "Read"]
    assert claude_calls[0].arguments == {
        "file_path": "/work/ws/a.py",
        "old_string": "x = 1",
        "new_string": "x = 2",
    }
    assert claude_calls[1].arguments == {"file_path": "/etc/hostname"}
    assert claude_calls[0].call_id != claude_calls[1].call_id
    codex_calls = reply_of(run(s, "responses", codex([]))).calls
    assert (
        codex_calls[0].raw_input
        == "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n"
    )
    assert codex_calls[1].arguments == {"cmd": "cat -- /etc/hostname"}
    oc = reply_of(run(s, "chat", chat([]))).calls
    assert oc[0].arguments == {
        "filePath": "/opt/oc/a.py",
        "oldString": "x = 1",
        "newString": "x = 2",
    }
    g = reply_of(run(s, "gemini", gemini([]))).calls
    assert g[0].name == "replace" and g[1].arguments == {"absolute_path": "/etc/hostname"}
    g_args = dict(g[0].arguments or {})
    assert set(GEMINI_EDIT_REQ) <= set(g_args)
    assert g_args["file_path"] == "/home/u/app/a.py" and g_args["new_string"] == "x = 2"
    assert isinstance(g_args["instruction"], str) and "a.py" in g_args["instruction"]


def test_relative_path_stays_relative_without_a_known_cwd() -> None:
    body = claude([claude_user()])
    body["system"] = "no directory here"
    assert only_call(run(WRITE, "anthropic", body)).arguments == {
        "file_path": "src/a.txt",
        "content": "one\ntwo\n",
    }


def test_no_suitable_tool_is_a_clear_error() -> None:
    tools = [{"name": "Glob", "input_schema": _schema("pattern")}]
    failure = failure_of(run(SHELL, "anthropic", claude([claude_user()], tools)))
    assert failure.kind == "scenario_no_matching_tool"
    assert "turns[0].calls[0]" in failure.message and "Glob" in failure.message


def test_generic_intent_fallback_ignores_mcp_tools() -> None:
    tools = [
        {"name": "mcp__box__run_command", "input_schema": _schema("command")},
        {"name": "run_in_terminal", "input_schema": _schema("command")},
    ]
    call = only_call(run(SHELL, "anthropic", claude([claude_user()], tools)))
    assert call.name == "run_in_terminal"


# -- explicit tools, MCP, deferred search ----------------------------------------------


def test_explicit_tool_with_per_family_input() -> None:
    s = parse_scenario(
        """
turns:
  - calls:
      - tool: "Bash|exec_command"
        input: {command: pwd}
        responses: {input: {cmd: pwd, workdir: /tmp}}
"""
    )
    assert only_call(run(s, "anthropic", claude([claude_user()]))).arguments == {"command": "pwd"}
    x = only_call(run(s, "responses", codex([])))
    assert x.name == "exec_command" and x.arguments == {"cmd": "pwd", "workdir": "/tmp"}


def test_mcp_intent_across_clients() -> None:
    s = parse_scenario(
        "turns: [{calls: [{mcp: {server: demo, tool: echo, arguments: {text: hi}}}]}]"
    )
    x = only_call(run(s, "responses", codex([])))
    assert (x.name, x.namespace, x.full_name, x.arguments) == (
        "echo",
        "mcp__demo__",
        "mcp__demo__echo",
        {"text": "hi"},
    )
    g = only_call(run(s, "gemini", gemini([])))
    assert g.name == "mcp_demo_echo"
    tools = [*CLAUDE_TOOLS, {"name": "mcp__demo__echo", "input_schema": _schema("text")}]
    c = only_call(run(s, "anthropic", claude([claude_user()], tools)))
    assert c.name == "mcp__demo__echo" and not c.call_id.startswith("toolu_corral_s")


def test_deferred_mcp_tool_goes_through_tool_search_first() -> None:
    s = parse_scenario(
        "turns:\n - calls: [{tool: 'mcp__*__echo', input: {text: hi}}]\n - say: done\n"
    )
    first = run(s, "anthropic", claude([claude_user()]))
    assert first.prelude and first.turn == 0
    search = only_call(first)
    assert search.name == "ToolSearch" and search.arguments == {"query": "select:mcp__demo__echo"}
    # Claude Code answers with a tool_reference and now sends the tool's schema.
    loaded = [
        *CLAUDE_TOOLS,
        {"name": "mcp__demo__echo", "input_schema": _schema("text"), "defer_loading": True},
    ]
    messages = [
        claude_user(),
        *claude_round(search, [{"type": "tool_reference", "tool_name": "mcp__demo__echo"}]),
    ]
    second = run(s, "anthropic", claude(messages, loaded))
    assert not second.prelude and second.turn == 0
    call = only_call(second)
    assert call.name == "mcp__demo__echo" and call.arguments == {"text": "hi"}
    # The search does not consume a turn: after the MCP result comes turn 1.
    third = run(s, "anthropic", claude([*messages, *claude_round(call, "hi")], loaded))
    assert third.turn == 1 and reply_of(third) == Reply("done")


def test_defer_loading_tool_needs_discovery() -> None:
    s = parse_scenario("turns: [{calls: [{mcp: {server: demo, tool: add, arguments: {a: 1}}}]}]")
    tools = [
        *CLAUDE_TOOLS,
        {"name": "mcp__demo__add", "input_schema": _schema("a"), "defer_loading": True},
    ]
    body = claude([{"role": "user", "content": "add"}], tools)
    assert only_call(run(s, "anthropic", body)).name == "ToolSearch"


def test_search_that_does_not_load_the_tool_fails() -> None:
    s = parse_scenario("turns: [{calls: [{mcp: {server: demo, tool: echo}}]}]")
    search = only_call(run(s, "anthropic", claude([claude_user()])))
    messages = [claude_user(), *claude_round(search, "No matching deferred tools found")]
    failure = failure_of(run(s, "anthropic", claude(messages)))
    assert "still not callable" in failure.message


def test_tool_search_can_be_disabled_or_reconfigured() -> None:
    off = parse_scenario(
        "tool_search: {enabled: false}\nturns: [{calls: [{mcp: {server: demo, tool: echo}}]}]"
    )
    assert (
        failure_of(run(off, "anthropic", claude([claude_user()]))).kind
        == "scenario_no_matching_tool"
    )
    custom = parse_scenario(
        "tool_search: {tool: find_tools, query: 'names={names}'}\n"
        "turns: [{calls: [{mcp: {server: demo, tool: echo}}]}]"
    )
    tools = [*CLAUDE_TOOLS[:-1], {"name": "find_tools", "input_schema": _schema("query")}]
    call = only_call(run(custom, "anthropic", claude([claude_user()], tools)))
    assert call.name == "find_tools" and call.arguments == {"query": "names=mcp__demo__echo"}


def test_explicit_call_can_opt_out_of_search() -> None:
    s = parse_scenario("turns: [{calls: [{tool: mcp__x__y, input: {}, search: false}]}]")
    assert (
        failure_of(run(s, "anthropic", claude([{"role": "user", "content": "x"}]))).kind
        == "scenario_no_matching_tool"
    )


# -- side requests, faults, conversations ----------------------------------------------


def test_request_without_tools_gets_the_side_reply() -> None:
    body = claude([{"role": "user", "content": "Write a 5-word title"}], tools=[])
    decision = run(WRITE_FILE, "anthropic", body)
    assert decision.side and reply_of(decision) == Reply("OK")
    strict = WRITE_FILE.model_copy(update={"side_reply": None})
    assert failure_of(run(strict, "anthropic", body)).kind == "scenario_no_matching_tool"


def test_fault_attempts_are_counted_by_the_caller() -> None:
    s = parse_scenario(
        "fault: {event_delay: 0.5}\nturns:\n - say: x\n   fault: {status: 529, attempts: 1}\n"
    )
    first = run(s, "anthropic", claude([claude_user()]), attempt=1)
    assert first.fault is not None and first.fault.status == 529
    second = run(s, "anthropic", claude([claude_user()]), attempt=2)
    assert second.fault is None
    assert reply_of(second) == Reply("x")
    g = parse_scenario("fault: {truncate_after: 3}\nturns: [{say: x}]\n")
    assert run(g, "chat", chat([])).fault == g.fault


def test_conversations_select_a_script_per_session() -> None:
    s = parse_scenario(
        """
turns: [{say: "generic"}]
conversations:
  - prompt: "fix the bug"
    turns: [{say: "fixing"}]
"""
    )
    body = claude([{"role": "user", "content": "please fix the bug in x"}])
    decision = run(s, "anthropic", body)
    assert decision.script == "conversations[0]" and reply_of(decision) == Reply("fixing")
    assert reply_of(run(s, "anthropic", claude([claude_user()]))) == Reply("generic")


def test_gemini_function_responses_feed_conditions() -> None:
    call = only_call(run(WRITE_FILE, "gemini", gemini([])))
    contents: list[Body] = [
        {
            "role": "model",
            "parts": [{"functionCall": {"name": call.name, "args": dict(call.arguments or {})}}],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": call.name, "response": {"output": "Exit Code: 1"}}}
            ],
        },
    ]
    assert reply_of(run(WRITE_FILE, "gemini", gemini(contents))) == Reply("failed")


def test_unknown_items_and_odd_shapes_are_tolerated() -> None:
    body = codex(
        [
            {"type": "reasoning", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "thinking"}],
            },
            {"type": "something_new", "payload": 1},
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": {"content": "x", "success": False},
            },
        ]
    )
    body["tools"].append({"type": "web_search"})
    assert run(WRITE_FILE, "responses", body).turn == 1
    weird = {"model": 3, "messages": "nope", "tools": [1, None]}
    assert run(SHELL, "anthropic", weird).side  # no usable tool: a side request
