"""The MCP gateway: the agent's only way to the MCP servers its policy names.

    policy -> McpGateway(policy, journal, identity, scratch=DIR).start()
    gateway.url_for("demo")  ->  http://127.0.0.1:PORT/demo/mcp
    ...
    gateway.close()

Each server named in the policy runs on the host side in its own corral
sandbox (`corral exec -- COMMAND`, stdio piped), never inside the agent's.
The gateway is an MCP server itself (the official `mcp` SDK, streamable HTTP,
stateless, JSON responses) with one endpoint per upstream server; the agent's
MCP config points at it through a broker route, so from inside the agent's
sandbox it is `http://127.0.0.1:3128/routes/mcp/<server>/mcp`.

Every `tools/call` is decided by `corral.broker.mcp_policy.decide_tool_call`
and journaled (an `McpCall` observation, committed *before* the call is
forwarded; its outcome appended after). A denied call never reaches the
server: the agent gets a tool result with `isError: true` whose text starts
with "corral denied" and names the rule, which is what MCP asks for errors the
model should see (a JSON-RPC error would be dropped by some clients). A call
the journal cannot record is refused the same way. Tool listings are passed
through unchanged.

Everything runs on one asyncio loop in a background thread (uvicorn serving
the gateway, the SDK's stdio clients driving the sandboxed servers); `start()`
returns once every server answered `initialize` and `tools/list`, and raises
AgentError otherwise, so an agent never starts with a missing MCP server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from corral.broker.actions import Identity, McpCall, Observation, ProcessEvent
from corral.broker.body_limit import BodyLimit
from corral.broker.journal import Journal
from corral.broker.mcp_policy import McpPolicy, McpServerConfig, decide_tool_call
from corral.broker.policy import Decision, DecisionContext, Policy
from corral.errors import AgentError
from corral.pauseclock import Clock, Deadline

if TYPE_CHECKING:
    from mcp import Client
    from mcp_types import CallToolResult, ListToolsResult

__all__ = ["McpGateway", "denial_text", "server_argv"]

_ARGS_JOURNALED = 2000
#: A JSON-RPC request past this is refused with 413 before the app reads it whole.
MCP_BODY_LIMIT = 4 << 20


def server_argv(
    cfg: McpServerConfig,
    *,
    workspace: str,
    sandbox: bool,
    journal: str | None = None,
    corral: Sequence[str] = (sys.executable, "-m", "corral"),
    run: str | None = None,
    session: str | None = None,
) -> list[str]:
    """The command that runs one MCP server, under `corral exec` unless not `sandbox` (pure).

    `run`/`session` label its sandbox's journal rows with the agent session's.
    """
    if not sandbox:
        return list(cfg.command)
    argv = [*corral, "exec", "--workspace", workspace, "--memory", cfg.memory]
    for path in cfg.ro:
        argv += ["--ro", path]
    for dest in cfg.allow_egress:
        argv += ["--allow", dest]
    # corral exec gives the sandbox an allowlisted environment, not its own.
    for name, value in sorted(cfg.env.items()):
        argv += ["--setenv", f"{name}={value}"]
    if journal is not None:
        argv += ["--journal", journal]
    if run is not None:
        argv += ["--run", run]
    if session is not None:
        argv += ["--session", session]
    return [*argv, "--", *cfg.command]


def denial_text(server: str, tool: str, decision: Decision) -> str:
    """What the agent reads when a call is refused (pure)."""
    return (
        f"corral denied the MCP call {server}/{tool}: {decision.reason} "
        f"(rule {decision.rule or 'none'}). The call was not forwarded."
    )


@dataclass
class _Upstream:
    name: str
    cfg: McpServerConfig
    client: Client
    tools: ListToolsResult


class McpGateway:
    """Host-side MCP gateway for one agent session. `start()` once, `close()` always."""

    def __init__(
        self,
        policy: McpPolicy,
        journal: Journal,
        identity: Identity,
        *,
        scratch: Path,
        sandbox: bool = True,
        corral: Sequence[str] = (sys.executable, "-m", "corral"),
        journal_path: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.policy = policy
        self.journal = journal
        self.identity = identity
        self.scratch = scratch
        self.sandbox = sandbox
        self.corral = tuple(corral)
        self.journal_path = journal_path
        self.host = host
        self.port = 0
        self._compiled: Policy = policy.broker_policy()
        self._ctx = DecisionContext(env=identity.env, run=identity.run, session=identity.session)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uvicorn: Any = None
        self._stop: asyncio.Event | None = None
        self._logs: list[IO[str]] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, server: str) -> str:
        """The streamable-HTTP endpoint of `server` on the host."""
        return f"{self.url}/{server}/mcp"

    def path_for(self, server: str) -> str:
        """The endpoint's path, to append to a broker route's URL."""
        return f"/{server}/mcp"

    def start(self, timeout: float = 60.0, clock: Clock = time.monotonic) -> str:
        """Start every server and the HTTP endpoint; the base URL. AgentError on failure.

        `timeout` is measured on `clock` (a run's, which stops while it is paused).
        """
        self.begin()
        self.wait_ready(timeout, clock)
        return self.url

    def begin(self) -> str:
        """Bind the endpoint and start the servers in the background; the base URL at once.

        The socket listens from here on: a client that connects before the
        gateway is ready waits in the kernel's backlog instead of being
        refused, so the agent can start while the MCP servers do
        (`wait_ready` then says whether they all did).
        """
        if self._thread is not None:
            raise AgentError("the MCP gateway was already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._run, args=(sock,), name="corral-mcp-gateway", daemon=True
        )
        self._thread.start()
        return self.url

    def wait_ready(self, timeout: float = 60.0, clock: Clock = time.monotonic) -> None:
        """Return once every server answered; AgentError (gateway closed) otherwise."""
        deadline = Deadline(timeout, clock)
        while not self._ready.wait(deadline.wait_s()):
            if deadline.expired():
                self.close()
                raise AgentError(f"the MCP gateway did not start within {timeout:g} s")
        if self._error is not None:
            self.close()
            raise AgentError(f"the MCP gateway failed to start: {self._error}") from self._error

    def close(self, timeout: float = 15.0) -> None:
        """Stop serving and end every MCP server (their sandboxes are torn down)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        for fh in self._logs:
            with contextlib.suppress(OSError):
                fh.close()
        self._logs = []

    # -- the loop thread --------------------------------------------------
    def _run(self, sock: socket.socket) -> None:
        try:
            asyncio.run(self._main(sock))
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
        finally:
            sock.close()
            self._ready.set()

    async def _main(self, sock: socket.socket) -> None:
        import uvicorn

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with AsyncExitStack() as stack:
            upstreams: dict[str, _Upstream] = {}
            for name, cfg in self.policy.servers.items():
                upstreams[name] = await self._connect(stack, name, cfg)
            app = self._app(upstreams)
            config = uvicorn.Config(
                app,
                log_config=None,
                log_level="warning",
                access_log=False,
                lifespan="on",
                ws="none",
                http="h11",
            )
            server = uvicorn.Server(config)
            self._uvicorn = server
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.005)
            if serving.done():
                serving.result()
                raise AgentError("the gateway's HTTP server stopped at start")
            self._ready.set()
            await self._stop.wait()
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving, 5.0)

    async def _connect(self, stack: AsyncExitStack, name: str, cfg: McpServerConfig) -> _Upstream:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        workspace = Path(cfg.workspace) if cfg.workspace else self.scratch / name
        workspace.mkdir(parents=True, exist_ok=True)
        argv = server_argv(
            cfg,
            workspace=str(workspace),
            sandbox=self.sandbox,
            journal=self.journal_path,
            corral=self.corral,
            run=self.identity.run,
            session=self.identity.session,
        )
        errlog = open(self.scratch / f"{name}.stderr", "a", encoding="utf-8")  # noqa: SIM115
        self._logs.append(errlog)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if self.sandbox:
            # corral itself is started here: it must import this corral.
            if "PYTHONPATH" in os.environ:
                env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        else:
            env.update(cfg.env)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(workspace))
        self.journal.append(
            Observation.of(
                ProcessEvent(event="mcp_server_start", name=name),
                self.identity,
                decision="observe",
                rule=None,
                reason=f"MCP server {name} started"
                + (" in its own sandbox" if self.sandbox else " on the host"),
                detail={"argv": list(cfg.command), "sandboxed": self.sandbox},
            )
        )
        try:
            client = await stack.enter_async_context(
                Client(stdio_client(params, errlog=errlog), mode="legacy", read_timeout_seconds=30)
            )
            tools = await client.list_tools()
        except Exception as exc:
            raise AgentError(f"MCP server {name} did not start: {exc}") from exc
        return _Upstream(name, cfg, client, tools)

    def _app(self, upstreams: dict[str, _Upstream]) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Mount

        servers = {name: self._mcp_server(up) for name, up in upstreams.items()}
        apps = {
            name: srv.streamable_http_app(
                streamable_http_path="/mcp", json_response=True, stateless_http=True
            )
            for name, srv in servers.items()
        }

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            async with AsyncExitStack() as stack:
                for srv in servers.values():
                    await stack.enter_async_context(srv.session_manager.run())
                yield

        app = Starlette(
            routes=[Mount(f"/{name}", app=app) for name, app in apps.items()],
            lifespan=lifespan,
        )
        return BodyLimit(app, MCP_BODY_LIMIT, self._body_refused)

    def _body_refused(self, path: str, why: str) -> None:
        server = path.strip("/").split("/", 1)[0] or "-"
        self.journal.append(
            Observation.of(
                McpCall(server=server, tool="-"),
                self.identity,
                decision="deny",
                rule="body-limit",
                reason=why,
            )
        )

    def _mcp_server(self, up: _Upstream) -> Any:
        import mcp_types as types
        from mcp.server.lowlevel import Server

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=list(up.tools.tools))

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self._call(up, params.name, dict(params.arguments or {}))

        return Server(f"corral-gateway-{up.name}", on_list_tools=list_tools, on_call_tool=call_tool)

    async def _call(self, up: _Upstream, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        import mcp_types as types

        def refused(text: str) -> types.CallToolResult:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )

        decision = decide_tool_call(
            self.policy, self._compiled, up.name, tool, arguments, ctx=self._ctx
        )
        args_text = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
        obs = Observation.of(
            McpCall(server=up.name, tool=tool),
            self.identity,
            decision="allow" if decision.allowed else "deny",
            rule=decision.rule,
            reason=decision.reason,
            detail={"arguments": args_text[:_ARGS_JOURNALED]},
        )
        try:
            # A synchronous commit on the loop: tens of microseconds in WAL mode,
            # and the call must not be forwarded before it returns.
            obs_id = self.journal.append(obs)
        except Exception as exc:
            return refused(
                f"corral denied the MCP call {up.name}/{tool}: the journal failed ({exc})"
            )
        if not decision.allowed:
            return refused(denial_text(up.name, tool, decision))
        started = time.monotonic()
        try:
            result = await up.client.call_tool(
                tool, arguments, read_timeout_seconds=up.cfg.call_timeout_s
            )
        except Exception as exc:
            self.journal.record_outcome(
                obs_id,
                len(args_text),
                0,
                {"error": f"{type(exc).__name__}: {exc}", "duration_ms": _ms(started)},
            )
            return refused(f"MCP server {up.name} failed on {tool}: {type(exc).__name__}: {exc}")
        body = result.model_dump_json(by_alias=True, exclude_none=True)
        self.journal.record_outcome(
            obs_id,
            len(args_text),
            len(body),
            {"is_error": bool(result.is_error), "duration_ms": _ms(started)},
        )
        return result


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
