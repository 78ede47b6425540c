"""`corral agent run`: one agent session on a workspace, driven by `corral.run.session`.

    run = run_agent("claude-code", "Create hello.txt", workspace="ws",
                    provider="synthetic:scenarios/write-file.yaml")
    run.result.status      # "succeeded" | "failed" | "timeout" | "refused"
    run.journal            # every provider call and MCP call, allowed or denied

The session is the one `corral run` drives (`corral.run.session.run_session`):
the synthetic provider (for `synthetic:FILE`) on host loopback, the MCP
gateway with the policy's servers (each in its own sandbox), a broker on the
agent sandbox's loopback with the provider route (metered; the key injected
from corral's environment) and the `mcp` route, the agent CLI as an
unprivileged uid in a sandbox built as `corral exec --env agent` builds it
(the same path checks), its output through corral's pipes, its result parsed
by the adapter, its tokens the broker's count.

`sandbox=False` runs the same launch directly on the host with a scratch
HOME and a minimal environment (for benchmarks and debugging): there is no
broker, so only the synthetic provider is allowed, and only MCP calls are
journaled.

Everything of a session lands in its state directory, never inside the
workspace: by default `$XDG_STATE_HOME/corral/agent/<session>/` (else
`~/.local/state/corral/agent/<session>/`). It holds journal.sqlite,
routes.json, agent.stdout.jsonl, agent.stderr, provider.jsonl (the synthetic
provider's transcript), mcp/ (MCP server directories and logs), result.json.
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
from typing import IO, TYPE_CHECKING, Any

from corral.agents.base import DEFAULT_HOME, AgentAdapter, AgentResult, Launch, McpEndpoint
from corral.agents.install import default_tools_dir, executable_path, prefix
from corral.agents.launch import EXIT_REFUSED, SANDBOX_BROKER, finalize, launch_request
from corral.agents.routes import (
    ProviderChoice,
    UpstreamOverride,
    check_compatible,
    parse_provider,
    provider_route,
    route_secret_env,
)
from corral.broker.mcp_policy import McpPolicy
from corral.errors import AgentError, UsageError

if TYPE_CHECKING:
    from corral.run.runcg import RunCgroup
    from corral.sandbox.spec import SandboxSpec

__all__ = ["AgentRun", "agent_exec_spec", "default_state_dir", "run_agent"]

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


def default_state_dir(session: str, environ: Mapping[str, str]) -> Path:
    """Where a session's state goes without `--state-dir`: the user's state
    directory, never the current directory (the default workspace)."""
    base = environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if base.startswith("/") else Path.home() / ".local" / "state"
    return (root / "corral" / "agent" / session).resolve()


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
    upstream: UpstreamOverride | None = None,
) -> AgentRun:
    """Run `prompt` with one agent CLI, unattended; the parsed result.

    `upstream` is a host-side test hook (a Python argument, no flag, nothing
    the sandbox can reach): the provider route's host resolves to its address
    and its TLS is verified against its CA bundle, so an e2e test can put a
    local HTTPS server behind `https://api.anthropic.com`.

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
    state = Path(state_dir).resolve() if state_dir else default_state_dir(session, env_in)
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
    t_start = time.monotonic()
    if sandbox:
        # The broker (a child of this process) reads the route's `env:NAME` key here.
        os.environ.update(secret_env)
        run = _sandboxed(
            adapter,
            prompt,
            choice=choice,
            ws=ws,
            state=state,
            tools=tools,
            exe=exe,
            mcp=mcp,
            timeout_s=timeout_s,
            memory=memory,
            model=model,
            run_id=run_id,
            session=session,
            extra_args=extra_args,
            request_timeout_s=request_timeout_s,
            upstream=upstream,
        )
    else:
        run = _on_host(
            adapter,
            prompt,
            choice=choice,
            ws=ws,
            state=state,
            exe=exe,
            mcp=mcp,
            timeout_s=timeout_s,
            model=model,
            run_id=run_id,
            session=session,
            extra_args=extra_args,
            request_timeout_s=request_timeout_s,
        )
    run = replace(run, timings={**run.timings, "total_s": round(time.monotonic() - t_start, 4)})
    (state / "result.json").write_text(
        json.dumps(run.to_json_dict(), indent=2) + "\n", encoding="utf-8"
    )
    return run


def _sandboxed(
    adapter: AgentAdapter,
    prompt: str,
    *,
    choice: ProviderChoice,
    ws: Path,
    state: Path,
    tools: Path,
    exe: Path,
    mcp: McpPolicy | None,
    timeout_s: float,
    memory: str | None,
    model: str | None,
    run_id: str | None,
    session: str,
    extra_args: Sequence[str],
    request_timeout_s: float,
    upstream: UpstreamOverride | None = None,
) -> AgentRun:
    """The session, driven by `corral.run.session` as `corral run` drives its sessions."""
    from corral.broker.actions import Identity
    from corral.broker.config import BrokerConfig, RouteConfig
    from corral.broker.journal import Journal, read_rows
    from corral.run.session import SessionHooks, SessionPlan, run_session

    journal_path = state / "journal.sqlite"
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        journal = stack.enter_context(Journal(journal_path))
        synthetic_url = _synthetic(choice, state, stack, timings)
        route = RouteConfig.model_validate(
            {**provider_route(choice, synthetic_url), "meter_usage": True}
        )
        request = launch_request(
            adapter,
            prompt,
            provider=choice,
            executable=str(exe),
            workspace=str(ws),
            base_url=f"{SANDBOX_BROKER}/routes/{choice.route}",
            model=model,
            home=DEFAULT_HOME,
            sandboxed=True,
            request_timeout_s=request_timeout_s,
            extra_args=extra_args,
        )
        cli_prefix = str(prefix(adapter, tools).resolve())

        def make_spec(launch: Launch, broker: BrokerConfig) -> SandboxSpec:
            (state / "launch.sh").write_text(launch.display(), encoding="utf-8")
            (state / "routes.json").write_text(broker.to_json(), encoding="utf-8")
            return agent_exec_spec(
                launch.wrapped_argv(),
                workspace=str(ws),
                ro=(cli_prefix,),
                broker_json=broker.to_json(),
                journal=str(journal_path),
                memory=memory,
                run_id=run_id,
                session=session,
            )

        broker = BrokerConfig(routes={choice.route: route})
        if upstream is not None:
            broker = upstream.apply(broker, choice.route)
        run_cg = _session_cgroup(memory, stack) if mcp is not None and mcp.servers else None
        plan = SessionPlan(
            agent=adapter,
            request=request,
            broker=broker,
            make_spec=make_spec,
            identity=Identity(run=run_id, session=session, env="agent"),
            journal_path=journal_path,
            stdout=state / "agent.stdout.jsonl",
            stderr=state / "agent.stderr",
            mcp_dir=state / "mcp",
            wall_s=timeout_s,
            mcp=mcp,
            # With one, the MCP gateway is a helper in it (`corral run`'s), charged there.
            parent_cgroup=run_cg.relpath if run_cg is not None else "corral",
            run_cgroup=run_cg.key if run_cg is not None else None,
            # No run cgroup to place a broker in: a warm, shared one pays.
            resident_broker=os.environ.get("CORRAL_BROKER", "resident") != "cold",
        )
        t0 = time.monotonic()
        outcome = run_session(plan, journal=journal, hooks=SessionHooks())
        timings["session_s"] = time.monotonic() - t0
        if outcome.refused == "mcp":
            raise AgentError(outcome.reason.removeprefix("refused: "))
        journal.flush()
    stderr = _read(state / "agent.stderr")
    summary: dict[str, Any] | None = None
    exit_code = EXIT_REFUSED
    if outcome.exec is not None:
        decided = [r.decision for r in read_rows(journal_path) if r.kind != "process_event"]
        allowed, denied = decided.count("allow"), decided.count("deny")
        summary = outcome.exec.summary({"allowed": allowed, "denied": denied})
        exit_code = outcome.exec.exit
        if outcome.reason.startswith("wall time"):
            summary["reason"] = "timeout"
    elif outcome.reason.startswith("refused"):
        summary = {"exit": EXIT_REFUSED, "reason": "refused", "message": outcome.reason}
    result = outcome.result or adapter.parse_output("", exit_code)
    result = finalize(result, exit_code, summary, stderr, timeout_s)
    return AgentRun(
        agent=adapter.name,
        session=session,
        run=run_id,
        provider=str(choice),
        sandboxed=True,
        result=result,
        exit_code=exit_code,
        state_dir=state,
        journal=journal_path,
        timings={k: round(v, 4) for k, v in timings.items()},
        sandbox=summary,
        agent_reported_tokens=outcome.agent_reported_tokens,
    )


#: What a session's cgroup allows beyond the agent's sandbox: the MCP
#: gateway helper and the MCP servers' sandboxes.
_SESSION_HEADROOM = 1 << 30


def _session_cgroup(memory: str | None, stack: contextlib.ExitStack) -> RunCgroup:
    """A run cgroup for this session (removed with `stack`): the MCP gateway
    parses what the agent posts there, charged to it, not to this process."""
    from corral.errors import CgroupError
    from corral.run.runcg import ephemeral_run_cgroup
    from corral.sandbox.units import parse_size

    cg = ephemeral_run_cgroup("agent")
    if cg is None:
        raise AgentError("layer run cgroup: no cgroup hierarchy for the session's MCP gateway")
    cap = (parse_size(memory) if memory is not None else 4 << 30) + _SESSION_HEADROOM
    # Before create(): whatever part of it gets made is removed.
    stack.callback(_sweep, cg)
    try:
        cg.create(cap)
    except CgroupError as exc:
        raise AgentError(f"layer run cgroup: {exc}") from exc
    return cg


def _sweep(cg: RunCgroup) -> None:
    from corral.errors import CorralError

    with contextlib.suppress(CorralError, OSError):
        cg.sweep()


def agent_exec_spec(
    argv: Sequence[str],
    *,
    workspace: str,
    ro: Sequence[str],
    broker_json: str,
    journal: str,
    memory: str | None,
    run_id: str | None,
    session: str,
) -> SandboxSpec:
    """The spec `corral exec --env agent` builds (its path checks included), with
    the session's broker. UsageError for a path corral exec would refuse."""
    from corral.broker.proxy_env import sandbox_proxy_env
    from corral.exec.cli import build_spec, parse_args
    from corral.sandbox.spec import NetworkSpec

    opts = ["--env", "agent", "--workspace", workspace, "--journal", journal]
    for path in ro:
        opts += ["--ro", path]
    if memory is not None:
        opts += ["--memory", memory]
    if run_id is not None:
        opts += ["--run", run_id]
    opts += ["--session", session]
    try:
        ns, cmd = parse_args([*opts, "--", *argv])
    except SystemExit as exc:
        raise UsageError(f"cannot build the agent sandbox: {exc}") from None
    spec = build_spec(ns, cmd, dict(os.environ))
    env = {**dict(spec.env), **sandbox_proxy_env()}
    return replace(
        spec,
        env=tuple(sorted(env.items())),
        network=NetworkSpec(broker_config=broker_json),
    )


def _synthetic(
    choice: ProviderChoice, state: Path, stack: contextlib.ExitStack, timings: dict[str, float]
) -> str | None:
    """Start the synthetic provider on host loopback (for `synthetic:FILE`); its URL."""
    if choice.kind != "synthetic":
        return None
    from corral.provider import ProviderThread, load_scenario

    assert choice.scenario is not None
    t0 = time.monotonic()
    thread = ProviderThread(load_scenario(choice.scenario), transcript=state / "provider.jsonl")
    url = thread.start()
    stack.callback(thread.stop)
    timings["provider_start_s"] = time.monotonic() - t0
    return url


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _on_host(
    adapter: AgentAdapter,
    prompt: str,
    *,
    choice: ProviderChoice,
    ws: Path,
    state: Path,
    exe: Path,
    mcp: McpPolicy | None,
    timeout_s: float,
    model: str | None,
    run_id: str | None,
    session: str,
    extra_args: Sequence[str],
    request_timeout_s: float,
) -> AgentRun:
    """`--no-sandbox`: the same launch straight on the host (benchmarks, debugging).

    No broker: only the synthetic provider, and only MCP calls are journaled.
    """
    from corral.broker.actions import Identity
    from corral.broker.journal import Journal
    from corral.broker.mcp_gateway import McpGateway

    journal_path = state / "journal.sqlite"
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        journal = stack.enter_context(Journal(journal_path))
        synthetic_url = _synthetic(choice, state, stack, timings)
        assert synthetic_url is not None
        mcp_eps: tuple[McpEndpoint, ...] = ()
        if mcp is not None and mcp.servers:
            (state / "mcp").mkdir(exist_ok=True)
            gateway = McpGateway(
                mcp,
                journal,
                Identity(run=run_id, session=session, env="agent"),
                scratch=state / "mcp",
                sandbox=False,
                journal_path=str(journal_path),
            )
            stack.callback(gateway.close)
            gateway.start(timeout_s)
            mcp_eps = tuple(McpEndpoint(n, gateway.url_for(n)) for n in mcp.servers)
        home = state / "home"
        home.mkdir(exist_ok=True)
        # A TMPDIR of its own: Codex refuses a CODEX_HOME below TMPDIR.
        (state / "tmp").mkdir(exist_ok=True)
        request = launch_request(
            adapter,
            prompt,
            provider=choice,
            executable=str(exe),
            workspace=str(ws),
            base_url=synthetic_url,
            model=model,
            home=str(home),
            mcp=mcp_eps,
            sandboxed=False,
            request_timeout_s=request_timeout_s,
            extra_args=extra_args,
        )
        launch = adapter.launch(request)
        (state / "launch.sh").write_text(launch.display(), encoding="utf-8")
        env = {
            "PATH": _HOST_PATH,
            "HOME": str(home),
            "TMPDIR": str(state / "tmp"),
            "LANG": "C.UTF-8",
        }
        t0 = time.monotonic()
        with (
            open(state / "agent.stdout.jsonl", "wb") as out,
            open(state / "agent.stderr", "wb") as err,
        ):
            proc = _spawn(launch.wrapped_argv(), env, out, err)
            exit_code, timed_out = _wait(proc, timeout_s)
        timings["agent_s"] = time.monotonic() - t0
    stdout = _read(state / "agent.stdout.jsonl")
    result = adapter.parse_output(stdout, exit_code)
    summary = {"exit": 124, "reason": "timeout"} if timed_out else None
    result = finalize(result, exit_code, summary, _read(state / "agent.stderr"), timeout_s)
    return AgentRun(
        agent=adapter.name,
        session=session,
        run=run_id,
        provider=str(choice),
        sandboxed=False,
        result=result,
        exit_code=exit_code,
        state_dir=state,
        journal=journal_path,
        timings={k: round(v, 4) for k, v in timings.items()},
        sandbox=None,
        agent_reported_tokens=result.usage.total,
    )


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
