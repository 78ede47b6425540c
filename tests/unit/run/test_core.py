"""Pure parts of a run: prompts, reports, sandbox specs, the script agent's output, progress."""

from __future__ import annotations

import io
import json
from pathlib import Path

from corral.agents.base import LaunchRequest, ProviderEndpoint
from corral.agents.launch import launch_request
from corral.agents.registry import ADAPTERS
from corral.agents.routes import ProviderChoice
from corral.broker.config import BrokerConfig
from corral.run.agent_port import ScriptAgent, resolve_agent
from corral.run.environments import (
    RunLayout,
    agent_broker_config,
    agent_request,
    agent_spec,
    check_spec,
    product_spec,
    provider_base_url,
)
from corral.run.mission import ProviderRef, parse_mission
from corral.run.progress import PlainProgress, render_status
from corral.run.prompt import build_prompt
from corral.run.report import render_report
from corral.run.store import CheckResult, RunRecord, SessionRecord

MISSION = parse_mission(
    """+++
max_sessions = 3
[network]
allow = ["pypi.org"]
[product]
command = "python3 server.py"
port = 8000
ready_path = "/health"
[[checks]]
name = "health"
http = "GET /health"
[[checks]]
name = "unit"
run = "python3 $CORRAL_CHECKS/t.py"
+++
# Demo
Build it.
""",
    "/m/demo/MISSION.md",
)
LAYOUT = RunLayout(Path("/r/demo-1"))


def _session(n: int, **kw: object) -> SessionRecord:
    base: dict[str, object] = dict(
        n=n,
        state="done",
        phase="verify",
        started="t",
        ended="t",
        end_reason="agent finished",
        agent_exit=0,
        commit_sha="abc",
        tokens=10,
        wall_s=1.0,
        agent_peak_memory=0,
        run_peak_memory=1 << 20,
        processes_killed=0,
        product_ready=True,
        checks_passed=1,
        checks_total=2,
        summary="wrote server.py",
        broker_pid=None,
        detail={},
    )
    base.update(kw)
    return SessionRecord(**base)  # type: ignore[arg-type]


def test_first_prompt_names_the_session_and_the_checks() -> None:
    p = build_prompt(MISSION, 1, [], [])
    assert p.startswith("Session 1 of 3.\n")
    assert "Build it." in p and "- health: HTTP GET /health -> 200" in p
    assert "127.0.0.1:8000" in p and "Previous sessions" not in p


def test_later_prompt_has_previous_sessions_and_failed_checks() -> None:
    failed = CheckResult("unit", False, "exit 1 (exited)", 1, 0.1, "AssertionError: boom")
    p = build_prompt(
        MISSION, 2, [_session(1)], [CheckResult("health", True, "passed", 0, 0.1), failed]
    )
    assert p.startswith("Session 2 of 3.")
    assert "session 1: done, agent finished; 1/2 checks passed" in p
    assert "- unit: exit 1 (exited)" in p and "AssertionError: boom" in p
    assert "- health: passed" not in p


def test_report_lists_sessions_checks_memory_and_observations() -> None:
    run = RunRecord(
        id="demo-1",
        mission="demo",
        state="passed",
        agent="script",
        provider="synthetic:x",
        max_sessions=3,
        created="t",
        updated="t",
        coordinator_pid=None,
        stop_requested=False,
        end_reason="every check passed in session 2",
        memory_cap=1 << 30,
        peak_memory=50 << 20,
        base_commit="a",
        last_commit="b",
    )
    sessions = [_session(1), _session(2, checks_passed=2)]
    checks = {
        1: [
            CheckResult("health", True, "passed", 0, 0.1),
            CheckResult("unit", False, "exit 1", 1, 0.1),
        ],
        2: [
            CheckResult("health", True, "passed", 0, 0.1),
            CheckResult("unit", True, "passed", 0, 0.1),
        ],
    }
    text = render_report(MISSION, run, sessions, checks, allowed=7, denied=2)
    assert "state: **passed**" in text
    assert "checks passing after the last session: 2/2" in text
    assert "7 allowed, 2 denied" in text
    assert "kernel peak 50.0 MiB of the 1024.0 MiB cap" in text
    assert "| unit | FAIL | exit 1 |" in text and "## Checks after session 2" in text


def test_agent_broker_config_routes_the_synthetic_provider() -> None:
    cfg = agent_broker_config(MISSION, ProviderRef("synthetic", "s.yaml"), "http://127.0.0.1:4000")
    route = cfg.routes["provider"]
    assert route.upstream == "http://127.0.0.1:4000" and route.allow_private
    assert [r.host for r in cfg.rules] == ["pypi.org"]
    BrokerConfig.from_json(cfg.to_json())


def test_agent_broker_config_injects_the_real_key_by_reference() -> None:
    cfg = agent_broker_config(MISSION, ProviderRef("anthropic"), None)
    route = cfg.routes["provider"]
    assert route.inject_header == {"x-api-key": "env:ANTHROPIC_API_KEY"}
    assert not route.allow_private


def test_agent_request_is_corral_agent_runs_request() -> None:
    # The coordinator must launch each CLI as `corral agent run` does: with the
    # synthetic provider Codex asks for `corral-synthetic` and gets its one-entry
    # catalog (its bundled models offer no function tools the scenario can call).
    for name in ("claude-code", "codex", "gemini"):
        agent = resolve_agent(name)
        req = agent_request(
            agent,
            MISSION,
            ProviderRef("synthetic", "/r/demo-1/scenario.yaml"),
            prompt="Session 1 of 3.",
            executable="/t/cli",
            workspace="/r/demo-1/workspace",
        )
        same = launch_request(
            ADAPTERS[name],
            "Session 1 of 3.",
            provider=ProviderChoice("synthetic", "s.yaml"),
            executable="/t/cli",
            workspace="/r/demo-1/workspace",
            base_url=provider_base_url(),
            request_timeout_s=req.request_timeout_s,
        )
        assert req == same
        assert req.provider.model == ADAPTERS[name].synthetic_model
        assert agent.launch(req) == ADAPTERS[name].launch(same)
    codex = resolve_agent("codex")
    launch = codex.launch(
        agent_request(
            codex,
            MISSION,
            ProviderRef("synthetic", "s"),
            prompt="p",
            executable="/t/c",
            workspace="/w",
        )
    )
    assert launch.argv[launch.argv.index("-m") + 1] == "corral-synthetic"
    assert any(f.path.endswith("/.codex/corral-models.json") for f in launch.files)
    real = agent_request(
        codex, MISSION, ProviderRef("openai"), prompt="p", executable="/t/c", workspace="/w"
    )
    assert real.provider.model is None and "-m" not in codex.launch(real).argv
    named = parse_mission(
        MISSION.text.replace("max_sessions = 3", 'max_sessions = 3\nmodel = "m1"'),
        "/m/x/MISSION.md",
    )
    req = agent_request(
        codex, named, ProviderRef("synthetic", "s"), prompt="p", executable="/t/c", workspace="/w"
    )
    assert req.provider.model == "m1"


def test_agent_broker_config_uses_corral_agent_runs_real_routes() -> None:
    route = agent_broker_config(MISSION, ProviderRef("openai"), None).routes["provider"]
    assert route.inject_header == {"authorization": "env:CORRAL_OPENAI_AUTHORIZATION"}
    assert route.path_prefixes == ("/v1/",)


def test_agent_spec_workspace_rw_egress_only_through_the_broker() -> None:
    agent = ScriptAgent()
    launch = agent.launch(
        LaunchRequest(
            prompt="hi",
            executable="/r/demo-1/tools/script_agent.py",
            workspace=str(LAYOUT.workspace),
            provider=ProviderEndpoint(provider_base_url()),
        )
    )
    cfg = agent_broker_config(MISSION, ProviderRef("synthetic", "s"), "http://127.0.0.1:1")
    spec = agent_spec(
        LAYOUT,
        mission=MISSION,
        n=1,
        launch=launch,
        broker_config=cfg,
        ro_paths=("/r/demo-1/tools",),
    )
    assert spec.workspace == "/r/demo-1/workspace" and spec.env_kind == "agent"
    assert spec.network.needs_broker
    # Only the workspace is writable: the agent's output reaches the host
    # through pipes, and no file the host reads later is under a mount of it.
    assert {(b.path, b.writable) for b in spec.binds} == {("/r/demo-1/tools", False)}
    assert not (LAYOUT.agent_stdout(1).is_relative_to(Path(spec.workspace)))
    route = cfg.routes["provider"]
    assert route.meter_usage and route.token_budget is None
    budgeted = agent_broker_config(MISSION, ProviderRef("synthetic", "s"), "http://127.0.0.1:1", 7)
    assert budgeted.routes["provider"].token_budget == 7
    env = dict(spec.env)
    assert env["HTTP_PROXY"] == "http://127.0.0.1:3128"
    assert not any(k.endswith("API_KEY") and v != "corral-brokered" for k, v in env.items())
    assert spec.argv[:2] == ("/bin/sh", "-c")


def test_product_spec_snapshot_read_only_no_egress() -> None:
    spec = product_spec(LAYOUT, MISSION, 2)
    assert not spec.network.needs_broker and spec.env_kind == "product"
    assert [(b.path, b.writable) for b in spec.binds] == [("/r/demo-1/snapshots/session-2", False)]
    assert spec.workspace == "/r/demo-1/sessions/session-2/product"
    assert "cd '/r/demo-1/snapshots/session-2' && python3 server.py" in spec.argv[-1]


def test_check_specs_no_egress_checks_read_only() -> None:
    http = check_spec(
        LAYOUT,
        MISSION,
        n=1,
        i=0,
        check=MISSION.settings.checks[0],
        http_checker=Path("/r/demo-1/tools/http_check.py"),
    )
    assert not http.network.needs_broker and http.env_kind == "verifier"
    assert all(not b.writable for b in http.binds)
    runner = json.loads(http.argv[-1])
    doc = json.loads(runner["main"][-1])
    assert doc["base"] == "http://127.0.0.1:8000" and doc["steps"][0]["path"] == "/health"
    assert runner["reason"] == "/r/demo-1/sessions/session-1/check-0/reason.txt"
    run = check_spec(
        LAYOUT,
        MISSION,
        n=1,
        i=1,
        check=MISSION.settings.checks[1],
        http_checker=Path("/r/demo-1/tools/http_check.py"),
    )
    assert dict(run.env)["PRODUCT_URL"] == "http://127.0.0.1:8000"
    assert dict(run.env)["CORRAL_CHECKS"] == "/r/demo-1/checks"
    assert run.limits.timeout_s == 65.0


def test_script_agent_output_parsing() -> None:
    agent = ScriptAgent()
    ok = (
        '{"type": "assistant"}\n{"type": "result", "is_error": false, "result": "done", '
        '"usage": {"input_tokens": 5, "output_tokens": 7}, "num_turns": 3}\n'
    )
    r = agent.parse_output(ok, 0)
    assert r.ok and r.text == "done" and r.usage.total == 12 and r.turns == 3
    bad = agent.parse_output('{"type": "result", "is_error": true, "result": "provider error"}', 1)
    assert not bad.ok and bad.error == "provider error"
    assert agent.parse_output("garbage", 1).status == "failed"


def test_unknown_agent_is_refused() -> None:
    import pytest

    from corral.errors import AgentError

    with pytest.raises(AgentError):
        resolve_agent("clippy")


def test_plain_progress_prints_phase_changes_only() -> None:
    out = io.StringIO()
    p = PlainProgress(out)
    p.update(run="r", session=1, max_sessions=3, phase="agent", activity="x")
    p.update(allowed=3)
    p.update(phase="verify")
    p.line("session 1: done")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1] == "corral: session 1: done"
    assert "session 1/3" in lines[0]


def test_render_status() -> None:
    s = render_status(
        {
            "run": "r",
            "session": 2,
            "max_sessions": 5,
            "phase": "verify",
            "activity": "check 1/2",
            "allowed": 4,
            "denied": 1,
            "checks_passed": 1,
            "checks_total": 2,
        },
        65.0,
    )
    assert "session 2/5" in s and "1:05" in s and "4 allowed / 1 denied" in s
    assert "checks 1/2" in s


def test_verifier_python_never_imports_from_the_snapshot() -> None:
    """An agent-written module in the snapshot must not shadow what a check imports (M12)."""
    run = check_spec(
        LAYOUT,
        MISSION,
        n=1,
        i=1,
        check=MISSION.settings.checks[1],
        http_checker=Path("/r/demo-1/tools/http_check.py"),
    )
    env = dict(run.env)
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["PYTHONPATH"] == "/r/demo-1/checks"
    assert env["PYTHONNOUSERSITE"] == "1"
