"""Running one agent session: the shell around the pure adapters.

    run = run_agent("claude-code", "Create hello.txt", workspace="ws",
                    provider="synthetic:scenarios/write-file.yaml")
    run.result.status      # "succeeded" | "failed" | "timeout" | "refused"
    run.journal            # every provider call and MCP call, allowed or denied

Inside corral (the default), for one session:

1. the synthetic provider (for `synthetic:FILE`) starts on host loopback;
2. the MCP gateway starts the policy's MCP servers, each under `corral exec`;
3. `corral exec --env agent --config ROUTES --journal J --ro <cli prefix>
   --timeout T --json -- /bin/sh -c WRAPPER corral-agent CLI ...` runs the
   CLI as an unprivileged uid in a fresh sandbox. The routes document (in the
   session directory, outside the workspace) gives the broker two routes: the
   provider (`synthetic`, or `anthropic` / `openai` / `gemini` with the key
   injected from corral's environment) and `mcp` (the gateway). Inside, the
   broker is `127.0.0.1:3128`, the only way out;
4. the CLI's stdout is parsed by its adapter, and corral exec's `--json`
   summary decides `timeout` / `refused`.

`sandbox=False` runs the same launch directly on the host with a scratch
HOME and a minimal environment (for benchmarks and debugging): there is no
broker, so only the synthetic provider is allowed, and only MCP calls are
journaled.

Everything of a session lands in its state directory (default
`./.corral/agent/<session>/`, never inside the workspace): journal.sqlite,
routes.toml, agent.stdout.jsonl, agent.stderr, provider.jsonl (the synthetic
provider's transcript), mcp/ (MCP server workspaces and logs), result.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from corral.agents import tomlw
from corral.agents.base import (
    DEFAULT_HOME,
    AgentAdapter,
    AgentResult,
    McpEndpoint,
    Usage,
)
from corral.agents.install import default_tools_dir, executable_path, prefix
from corral.agents.launch import (
    SANDBOX_BROKER,
    exec_argv,
    finalize,
    launch_request,
    parse_exec_summary,
)
from corral.agents.mcp_policy import McpPolicy
from corral.agents.routes import (
    MCP_ROUTE,
    ProviderChoice,
    broker_document,
    check_compatible,
    parse_provider,
    provider_route,
    route_secret_env,
)
from corral.errors import AgentError, UsageError

__all__ = [
    "SANDBOX_BROKER",
    "AgentRun",
    "exec_argv",
    "finalize",
    "launch_request",
    "parse_exec_summary",
    "run_agent",
]

_HOST_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class AgentRun:
    """One finished agent session."""

    agent: str
    session: str
    run: str | None
    provider: str
    sandboxed: bool
    result: AgentResult
    exit_code: int
    state_dir: Path
    journal: Path
    timings: Mapping[str, float] = field(default_factory=dict)
    sandbox: Mapping[str, Any] | None = None
    agent_reported_tokens: int = 0
    """What the CLI said it used; `result.usage` is the broker's count (sandboxed)."""

    @property
    def stdout_path(self) -> Path:
        return self.state_dir / "agent.stdout.jsonl"

    @property
    def stderr_path(self) -> Path:
        return self.state_dir / "agent.stderr"

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "session": self.session,
            "run": self.run,
            "provider": self.provider,
            "sandboxed": self.sandboxed,
            "exit": self.exit_code,
            "result": self.result.to_json_dict(),
            "state_dir": str(self.state_dir),
            "journal": str(self.journal),
            "timings": dict(self.timings),
            "sandbox": dict(self.sandbox) if self.sandbox is not None else None,
            "agent_reported_tokens": self.agent_reported_tokens,
        }


def _within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _new_session() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def run_agent(
    agent: str | AgentAdapter,
    prompt: str,
    *,
    workspace: str | Path,
    provider: str | ProviderChoice,
    mcp: McpPolicy | None = None,
    sandbox: bool = True,
    timeout_s: float = 600.0,
    memory: str | None = "4G",
    model: str | None = None,
    state_dir: str | Path | None = None,
    tools_dir: str | Path | None = None,
    run_id: str | None = None,
    session_id: str | None = None,
    extra_args: Sequence[str] = (),
    request_timeout_s: float = 120.0,
    environ: Mapping[str, str] | None = None,
) -> AgentRun:
    """Run `prompt` with one agent CLI, unattended; the parsed result.

    Raises UsageError for bad input (unknown agent or provider, a provider
    the CLI cannot speak, a state directory inside the workspace, a real
    provider without `sandbox`) and AgentError when the CLI is not
    installed or a part of the session (provider, MCP server) cannot start.
    A run that starts always returns: failures of the CLI, its provider or
    the sandbox are in `result.status` / `result.error`.
    """
    from corral.agents.registry import get_adapter

    adapter = get_adapter(agent) if isinstance(agent, str) else agent
    choice = parse_provider(provider) if isinstance(provider, str) else provider
    check_compatible(choice, adapter.name, adapter.wire)
    env_in = dict(os.environ if environ is None else environ)
    secret_env = route_secret_env(choice, env_in)
    if not sandbox and choice.kind != "synthetic":
        raise UsageError("a real provider is only used inside corral (the key stays on the host)")
    ws = Path(workspace).resolve()
    if not ws.is_dir():
        raise UsageError(f"workspace {workspace} is not a directory")
    session = session_id or _new_session()
    state = Path(state_dir).resolve() if state_dir else Path.cwd() / ".corral" / "agent" / session
    if _within(state, ws):
        raise UsageError(
            f"the state directory {state} is inside the workspace, which the agent can write; "
            "pass --state-dir elsewhere"
        )
    tools = Path(tools_dir).resolve() if tools_dir else default_tools_dir(env_in)
    exe = executable_path(adapter, tools)
    if not exe.exists():
        raise AgentError(
            f"{adapter.name} is not installed in {prefix(adapter, tools)}; "
            f"run scripts/install-agents.sh {adapter.name}"
        )
    state.mkdir(parents=True, exist_ok=True)
    journal_path = state / "journal.sqlite"
    timings: dict[str, float] = {}
    t_start = time.monotonic()

    from corral.broker.actions import Identity
    from corral.broker.journal import Journal

    with contextlib.ExitStack() as stack:
        journal = stack.enter_context(Journal(journal_path))
        synthetic_url: str | None = None
        if choice.kind == "synthetic":
            from corral.provider import ProviderThread, load_scenario

            assert choice.scenario is not None
            t0 = time.monotonic()
            thread = ProviderThread(
                load_scenario(choice.scenario), transcript=state / "provider.jsonl"
            )
            synthetic_url = thread.start()
            stack.callback(thread.stop)
            timings["provider_start_s"] = time.monotonic() - t0
        gateway = None
        if mcp is not None and mcp.servers:
            from corral.agents.mcp_gateway import McpGateway

            t0 = time.monotonic()
            gateway = McpGateway(
                mcp,
                journal,
                Identity(run=run_id, session=session, env="agent"),
                scratch=state / "mcp",
                sandbox=sandbox,
                journal_path=str(journal_path),
            )
            (state / "mcp").mkdir(exist_ok=True)
            stack.callback(gateway.close)
            # The servers start while the sandbox does (both take about a second);
            # the agent is stopped below if they fail.
            gateway.begin()

        if sandbox:
            base = f"{SANDBOX_BROKER}/routes/{choice.route}"
            mcp_eps = tuple(
                McpEndpoint(name, f"{SANDBOX_BROKER}/routes/{MCP_ROUTE}/{name}/mcp")
                for name in (mcp.servers if mcp else {})
            )
            home = DEFAULT_HOME
        else:
            assert synthetic_url is not None
            base = synthetic_url
            mcp_eps = (
                tuple(McpEndpoint(name, gateway.url_for(name)) for name in gateway.policy.servers)
                if gateway is not None
                else ()
            )
            home = str(state / "home")
            Path(home).mkdir(exist_ok=True)
            # A TMPDIR of its own: Codex refuses a CODEX_HOME below TMPDIR.
            (state / "tmp").mkdir(exist_ok=True)
        request = launch_request(
            adapter,
            prompt,
            provider=choice,
            executable=str(exe),
            workspace=str(ws),
            base_url=base,
            model=model,
            home=home,
            mcp=mcp_eps,
            sandboxed=sandbox,
            request_timeout_s=request_timeout_s,
            extra_args=extra_args,
        )
        launch = adapter.launch(request)
        stdout_path = state / "agent.stdout.jsonl"
        stderr_path = state / "agent.stderr"
        if sandbox:
            # Metered: the tokens of the session are the broker's count, not the CLI's.
            routes = {choice.route: {**provider_route(choice, synthetic_url), "meter_usage": True}}
            if gateway is not None:
                routes[MCP_ROUTE] = {"upstream": gateway.url, "allow_private": True}
            routes_file = state / "routes.toml"
            routes_file.write_text(tomlw.dumps(broker_document(routes)), encoding="utf-8")
            argv = exec_argv(
                launch.wrapped_argv(),
                workspace=str(ws),
                cli_prefix=str(prefix(adapter, tools)),
                routes_file=str(routes_file),
                journal=str(journal_path),
                timeout_s=timeout_s,
                memory=memory,
                run=run_id,
                session=session,
            )
            proc_env = {**env_in, **secret_env}
            backstop = timeout_s + 30.0
        else:
            argv = list(launch.wrapped_argv())
            proc_env = {
                "PATH": _HOST_PATH,
                "HOME": home,
                "TMPDIR": str(state / "tmp"),
                "LANG": "C.UTF-8",
            }
            backstop = timeout_s
        (state / "launch.sh").write_text(launch.display(), encoding="utf-8")
        t0 = time.monotonic()
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = _spawn(argv, proc_env, out, err)
            if gateway is not None:
                try:
                    gateway.wait_ready(backstop)
                except AgentError:
                    _stop(proc)
                    raise
                timings["mcp_gateway_ready_s"] = time.monotonic() - t0
            exit_code, timed_out = _wait(proc, backstop - (time.monotonic() - t0))
        timings["agent_s"] = time.monotonic() - t0

    stdout = stdout_path.read_text(encoding="utf-8", errors="replace")
    stderr = stderr_path.read_text(encoding="utf-8", errors="replace")
    result = adapter.parse_output(stdout, exit_code)
    summary = parse_exec_summary(stderr) if sandbox else None
    if timed_out and summary is None:
        summary = {"exit": 124, "reason": "timeout"}
    result = finalize(result, exit_code, summary, stderr, timeout_s)
    reported = result.usage.total
    if sandbox:
        from corral.broker.metering import journal_usage

        used, _ = journal_usage(journal_path, run_id, session)
        result = replace(
            result,
            usage=Usage(
                used.input_tokens,
                used.output_tokens,
                used.cache_read_tokens,
                used.cache_write_tokens,
            ),
        )
    timings["total_s"] = time.monotonic() - t_start
    run = AgentRun(
        agent=adapter.name,
        session=session,
        run=run_id,
        provider=str(choice),
        sandboxed=sandbox,
        result=result,
        exit_code=exit_code,
        state_dir=state,
        journal=journal_path,
        timings={k: round(v, 4) for k, v in timings.items()},
        sandbox=summary,
        agent_reported_tokens=reported,
    )
    (state / "result.json").write_text(
        json.dumps(run.to_json_dict(), indent=2) + "\n", encoding="utf-8"
    )
    return run


def _spawn(
    argv: Sequence[str], env: Mapping[str, str], out: IO[bytes], err: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start with stdin closed, in a process group of its own."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        raise AgentError(f"cannot start {argv[0]}: {exc}") from exc


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, bool]:
    """The exit status, and whether `timeout_s` ran out (the group is then stopped)."""
    try:
        return proc.wait(max(timeout_s, 0.0)), False
    except subprocess.TimeoutExpired:
        _stop(proc)
        return 124, True


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # corral exec turns SIGTERM into a sandbox teardown; the group kill is for
    # an unsandboxed CLI and its children.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
