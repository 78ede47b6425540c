"""One agent session, driven end to end: the orchestrator `corral run` uses.

    outcome = run_session(plan, journal=journal, hooks=hooks)
    outcome.reason        # "agent finished", "wall time 60s reached", "refused: ...", ...
    outcome.result        # the adapter's AgentResult, its tokens the broker's count

For one session, in this order:

1. the MCP gateway (`corral.broker.mcp_gateway`) starts when the plan has MCP
   servers: each server in a `corral exec` sandbox of its own, started
   through `corral.run.mcp_launch` (it joins the run's cgroup and gets
   SIGTERM when corral dies), every tool call decided by the policy and
   journaled; the broker gets an `mcp` route to it and the agent's CLI is
   configured with one endpoint per server behind that route;
2. the broker (`EgressBroker`) starts on the agent sandbox's own loopback
   with the session's routes: the provider (metered, with the session's
   token budget) and `mcp`;
3. the agent sandbox starts under the run's cgroup, its stdout and stderr
   through pipes corral reads (`corral.run.capture`);
4. the session is watched until the agent exits, its wall time, a stop or
   the broker's death (fail closed: the session ends);
5. everything is killed and counted and the outcome journaled; the agent's
   result is parsed by its adapter from corral's copy of its stdout, and its
   tokens are what the broker metered, never the agent's own report.

The sandbox is used through the backend interface's methods only
(`poll`/`wait`/`interrupt`/`close`, see `corral.sandbox.backend`); the one
place that constructs it is `_start_sandbox`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from corral.agents.base import AgentResult, Launch, LaunchRequest, Usage
from corral.agents.launch import mcp_endpoints
from corral.agents.routes import MCP_ROUTE
from corral.broker.actions import Identity, Observation, ProcessEvent
from corral.broker.config import BrokerConfig, RouteConfig
from corral.broker.metering import journal_usage
from corral.errors import AgentError, CorralError, HelperError
from corral.run.capture import Capture

if TYPE_CHECKING:
    from corral.broker.attach import EgressBroker
    from corral.broker.journal import Journal
    from corral.broker.mcp_gateway import McpGateway
    from corral.broker.mcp_policy import McpPolicy
    from corral.run.mcp_helper import McpHelper
    from corral.sandbox.backend import Backend, Sandbox
    from corral.sandbox.spec import ExecResult, Limits, SandboxSpec
    from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = [
    "SessionAgent",
    "SessionHooks",
    "SessionOutcome",
    "SessionPlan",
    "journal_outcome",
    "read_tail",
    "run_session",
]

_POLL_S = 0.1
# What corral keeps of the agent's output: the start, and the end (its result line).
_OUT_HEAD, _OUT_TAIL = 4 << 20, 1 << 20
_ERR_HEAD, _ERR_TAIL = 1 << 20, 256 << 10


class SessionAgent(Protocol):
    """The pure half of an agent adapter."""

    def launch(self, request: LaunchRequest) -> Launch: ...

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult: ...


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """Everything one session needs, decided before it starts.

    `request` has no MCP endpoints (the session adds them); `make_spec` turns
    the launch and the broker's final config (routes included) into the
    agent sandbox's spec.
    """

    agent: SessionAgent
    request: LaunchRequest
    broker: BrokerConfig
    make_spec: Callable[[Launch, BrokerConfig], SandboxSpec]
    identity: Identity
    journal_path: Path
    stdout: Path
    stderr: Path
    mcp_dir: Path
    wall_s: float
    mcp: McpPolicy | None = None
    parent_cgroup: str = "corral"
    run_cgroup: str | None = None
    """The key (`RUN_ID[:EPOCH]`) of the run cgroup the MCP servers join (`corral.run.runcg`)."""
    backend: Backend | None = None
    """The agent sandbox's backend (None: the namespace backend)."""
    resident_broker: bool = False
    """Egress from a resident broker (`broker/resident.py`), not a fresh process."""
    resident_socket: Path | None = None
    """That resident's control socket (None: the per-user one)."""


@dataclass(frozen=True, slots=True)
class SessionHooks:
    """How the caller watches a session (all optional)."""

    should_stop: Callable[[], bool] = lambda: False
    tick: Callable[[], None] = lambda: None
    on_broker: Callable[[int], None] = lambda _pid: None
    unix_observer: Callable[[SandboxSpec], Callable[[UnixConnectEvent], None] | None] = (
        lambda _spec: None
    )
    paused_s: Callable[[float, float], float] = lambda _since, _now: 0.0
    """Seconds of [since, now] (time.monotonic) the run was paused: not wall time."""


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    """How a session ended."""

    reason: str
    exec: ExecResult | None
    result: AgentResult | None
    broker_pid: int | None
    agent_reported_tokens: int = 0
    refused: str | None = None
    """What refused to start ("mcp" or "sandbox"); the agent did not run."""


def _event(
    journal: Journal,
    identity: Identity,
    event: str,
    reason: str,
    *,
    decision: str = "observe",
    detail: dict[str, Any] | None = None,
) -> None:
    journal.append(
        Observation.of(
            ProcessEvent(event=event),
            identity,
            decision="deny" if decision == "deny" else "observe",
            rule=None,
            reason=reason,
            detail=detail or {},
        )
    )


def journal_outcome(
    journal: Journal, identity: Identity, result: ExecResult, limits: Limits
) -> None:
    """The end of one sandbox as observations: limits hit, processes killed, the exit."""
    from corral.broker.journal import outcome_observations

    for obs in outcome_observations(result, identity, limits):
        journal.append(obs)


def with_mcp_route(broker: BrokerConfig, gateway_url: str) -> BrokerConfig:
    """`broker` plus the `mcp` route to the gateway on host loopback (pure)."""
    route = RouteConfig(upstream=gateway_url, allow_private=True)
    return broker.model_copy(update={"routes": {**broker.routes, MCP_ROUTE: route}})


def mcp_launcher(run_id: str | None) -> tuple[str, ...]:
    """The command prefix that starts an MCP server's `corral exec` (pure)."""
    return (
        sys.executable,
        "-m",
        "corral.run.mcp_launch",
        str(os.getpid()),
        run_id or "-",
        "--",
        sys.executable,
        "-m",
        "corral",
    )


def run_session(plan: SessionPlan, *, journal: Journal, hooks: SessionHooks) -> SessionOutcome:
    """Drive one session to its end (see the module docstring). Never raises a
    CorralError for what the session does: a refusal is an outcome."""
    with contextlib.ExitStack() as stack:
        request = plan.request
        broker = plan.broker
        gone: Callable[[], CorralError | None] = _no_helper
        if plan.mcp is not None and plan.mcp.servers:
            try:
                gateway = _start_gateway(plan, journal, stack, hooks.paused_s)
            except (AgentError, HelperError) as exc:
                _event(journal, plan.identity, "refused", f"MCP: {exc}", decision="deny")
                return SessionOutcome(f"refused: {exc}", None, None, None, refused="mcp")
            broker = with_mcp_route(broker, gateway.url)
            request = dataclasses.replace(request, mcp=mcp_endpoints(tuple(plan.mcp.servers)))
            from corral.run.mcp_helper import McpHelper

            if isinstance(gateway, McpHelper):
                gone = gateway.dead
        launch = plan.agent.launch(request)
        spec = plan.make_spec(launch, broker)
        return _agent(plan, journal, hooks=hooks, spec=spec, broker=broker, stack=stack, gone=gone)


def _no_helper() -> CorralError | None:
    return None


def _start_gateway(
    plan: SessionPlan,
    journal: Journal,
    stack: contextlib.ExitStack,
    paused_s: Callable[[float, float], float],
) -> McpGateway | McpHelper:
    from corral.broker.mcp_gateway import McpGateway

    assert plan.mcp is not None
    plan.mcp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if plan.run_cgroup is not None:
        return _start_gateway_helper(plan, stack, paused_s)
    gateway = McpGateway(
        plan.mcp,
        journal,
        plan.identity,
        scratch=plan.mcp_dir,
        sandbox=True,
        corral=mcp_launcher(plan.run_cgroup),
        journal_path=str(plan.journal_path),
    )
    stack.callback(gateway.close)
    # Bounded apart from the wall time: a server that never answers refuses the session.
    gateway.start(timeout=60.0)
    return gateway


def _start_gateway_helper(
    plan: SessionPlan, stack: contextlib.ExitStack, paused_s: Callable[[float, float], float]
) -> McpHelper:
    from corral.pauseclock import PausableClock
    from corral.run.environments import RunLayout
    from corral.run.mcp_helper import McpHelper
    from corral.run.runcg import RunCgroup

    assert plan.mcp is not None and plan.run_cgroup is not None
    cg = RunCgroup.detect(plan.run_cgroup)
    # It parses what the agent posts: in the run cgroup, charged to the run.
    gateway = McpHelper.start(
        plan.mcp,
        plan.identity,
        scratch=plan.mcp_dir,
        journal_path=plan.journal_path,
        run_id=plan.run_cgroup,
        cgroup_procs=cg.helper_procs("mcp") if cg is not None and cg.exists() else (),
        log=plan.mcp_dir / "gateway.log",
        # Its start is timed on the run's clock: a pause meanwhile freezes it.
        clock=PausableClock(paused_s),
        pauses=RunLayout(plan.journal_path.parent).pauses,
    )
    stack.callback(gateway.close)
    return gateway


def _start_sandbox(
    spec: SandboxSpec,
    *,
    backend: Backend | None,
    parent_cgroup: str,
    egress: EgressBroker,
    stdio: tuple[int, int, int],
    unix_observer: Callable[[UnixConnectEvent], None] | None,
) -> Sandbox:
    # The one construction of the agent sandbox.
    if backend is None:
        from corral.sandbox.backend_config import NamespaceConfig

        backend = NamespaceConfig().load()
    return backend.start(
        spec,
        parent_cgroup=parent_cgroup,
        network=egress.attach,
        stdio=stdio,
        unix_observer=unix_observer,
    )


def _intercepted(plan: SessionPlan, spec: SandboxSpec, stack: contextlib.ExitStack) -> SandboxSpec:
    """`spec` with the session's CA and placeholders when its rules need interception.

    The CA key lives below the run's host-private `tls/` (removed with the
    session); the rest is `corral exec`'s composition (`tls_setup`).
    """
    from corral.broker.tls_setup import apply_to_spec

    return apply_to_spec(spec, stack, plan.journal_path.parent / "tls")


def _control_socket(plan: SessionPlan) -> Path:
    # The run directory is host-private; no sandbox binds it (docs/broker.md "Live policy").
    from corral.broker.control import run_control_dir, socket_name

    ident = plan.identity
    return run_control_dir(plan.journal_path.parent) / socket_name(ident.session, ident.env)


def _agent(
    plan: SessionPlan,
    journal: Journal,
    *,
    hooks: SessionHooks,
    spec: SandboxSpec,
    broker: BrokerConfig,
    stack: contextlib.ExitStack,
    gone: Callable[[], CorralError | None],
) -> SessionOutcome:
    """`gone`: why a helper the session needs (the MCP gateway's) died, else None."""
    from corral.broker.attach import EgressBroker

    ident = plan.identity
    try:
        spec = _intercepted(plan, spec, stack)
    except CorralError as exc:
        _event(journal, ident, "refused", f"TLS interception: {exc}", decision="deny")
        return SessionOutcome(f"refused: {exc}", None, None, None, refused="sandbox")
    assert spec.network.broker_config is not None
    egress = EgressBroker(
        spec.network.broker_config,
        plan.journal_path,
        run=ident.run,
        session=ident.session,
        env=ident.env,
        control=_control_socket(plan),
        resident=plan.resident_broker,
        resident_socket=plan.resident_socket,
    )
    out = Capture(plan.stdout, head=_OUT_HEAD, tail=_OUT_TAIL)
    stack.callback(out.finish)
    err = Capture(plan.stderr, head=_ERR_HEAD, tail=_ERR_TAIL)
    stack.callback(err.finish)
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    stack.callback(os.close, devnull)
    from corral.broker import kernel_denials

    kdenials = kernel_denials.open_watch(stack, journal)
    try:
        running = _start_sandbox(
            spec,
            backend=plan.backend,
            parent_cgroup=plan.parent_cgroup,
            egress=egress,
            stdio=(devnull, out.writer, err.writer),
            unix_observer=hooks.unix_observer(spec),
        )
    except CorralError as exc:
        egress.stop()
        _event(journal, ident, "refused", f"agent sandbox refused: {exc}", decision="deny")
        return SessionOutcome(f"refused: {exc}", None, None, None, refused="sandbox")
    finally:
        out.close_writer()
        err.close_writer()
    if kdenials is not None:
        kdenials.watch_running(running, ident)
    if egress.process is not None:
        broker_pid: int | None = egress.process.pid
    else:
        broker_pid = egress.attachment.pid if egress.attachment is not None else None
    if broker_pid is not None:
        hooks.on_broker(broker_pid)
    try:
        reason = _watch(
            running, egress, wall=plan.wall_s, journal=journal, ident=ident, hooks=hooks, gone=gone
        )
    except BaseException:
        # A signal turned into an exception (Ctrl-C, the CLI's SIGTERM handler):
        # nothing of the session may outlive it.
        with contextlib.suppress(Exception):
            running.interrupt(signal.SIGKILL)
        running.close()
        egress.stop()
        raise
    if reason is None and not egress.alive():
        # The agent may have exited *because* its only door closed.
        _event(
            journal,
            ident,
            "broker_died",
            "the broker exited during the session; the session ends (fail closed)",
            decision="deny",
        )
        reason = "broker died"
    try:
        if reason is None or (reason == "broker died" and running.poll() is not None):
            result = running.wait()
            reason = reason or "agent finished"
        else:
            result = running.interrupt(signal.SIGKILL)
    finally:
        if kdenials is not None:
            kdenials.unwatch_running(running)
        running.close()
        egress.stop()
    journal_outcome(journal, ident, result, spec.limits)
    out.finish()
    err.finish()
    # What the agent printed (through corral's pipe) says how it ended; the
    # tokens are the broker's count, never the agent's own report.
    stdout = read_tail(plan.stdout, 1 << 20)
    reported = plan.agent.parse_output(stdout, result.exit)
    used, refused = journal_usage(plan.journal_path, ident.run, ident.session or "")
    agent_result = dataclasses.replace(
        reported,
        usage=Usage(
            used.input_tokens, used.output_tokens, used.cache_read_tokens, used.cache_write_tokens
        ),
    )
    if refused and reason == "agent finished":
        reason = "token budget spent"
    elif not agent_result.ok and reason == "agent finished":
        reason = f"agent failed: {(agent_result.error or '')[:200]}"
    _event(
        journal,
        ident,
        "session_end",
        f"the session ended: {reason}",
        detail={
            "status": agent_result.status,
            "tokens": used.total,
            "agent_reported_tokens": reported.usage.total,
        },
    )
    return SessionOutcome(reason, result, agent_result, broker_pid, reported.usage.total)


def _watch(
    running: Sandbox,
    egress: EgressBroker,
    *,
    wall: float,
    journal: Journal,
    ident: Identity,
    hooks: SessionHooks,
    gone: Callable[[], CorralError | None] = _no_helper,
) -> str | None:
    started = time.monotonic()
    last_tick = 0.0
    while running.poll() is None:
        if hooks.should_stop():
            return "stopped by the user"
        now = time.monotonic()
        if now - started - hooks.paused_s(started, now) >= wall:
            _event(
                journal, ident, "timeout", f"session wall time {wall:g}s reached", decision="deny"
            )
            return f"wall time {wall:g}s reached"
        if not egress.alive():
            _event(
                journal,
                ident,
                "broker_died",
                "the broker exited during the session; the session ends (fail closed)",
                decision="deny",
            )
            return "broker died"
        if (dead := gone()) is not None:
            # The agent's MCP servers are gone with it: fail closed, say why.
            _event(journal, ident, "helper_died", str(dead)[:500], decision="deny")
            return f"MCP gateway died: {str(dead)[:200]}"
        if time.monotonic() - last_tick > 1.0:
            hooks.tick()
            last_tick = time.monotonic()
        time.sleep(_POLL_S)
    return None


def read_tail(path: Path, limit: int) -> str:
    """The end of a file a sandbox wrote; never follows a link the sandbox planted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
