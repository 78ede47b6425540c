"""`corral agent` commands: run an agent CLI unattended in corral, install, list."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["EXIT_STATUS", "register"]

EXIT_STATUS = {"succeeded": 0, "failed": 1, "timeout": 124, "refused": 125}
"""`corral agent run`'s exit status per result status (2: bad usage)."""


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def _fail(message: str, code: int) -> typer.Exit:
    print(f"corral agent: {message}", file=sys.stderr)
    return typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `corral agent run|install|list` to the corral app."""
    agent_app = typer.Typer(
        name="agent",
        help="Agent CLIs (Claude Code, Codex, Gemini CLI) run unattended inside corral.",
        no_args_is_help=True,
    )

    @agent_app.command("run")
    def run(  # noqa: PLR0917 (typer maps parameters to options)
        agent: Annotated[str, typer.Argument(help="claude-code, codex or gemini.")],
        prompt: Annotated[list[str], typer.Argument(help="The task, after `--`.")],
        workspace: Annotated[
            Path, typer.Option("--workspace", "-w", help="The project directory (read-write).")
        ] = Path("."),
        provider: Annotated[
            str,
            typer.Option(
                "--provider",
                "-p",
                help="synthetic:SCENARIO.yaml, anthropic, openai, gemini, "
                "anthropic-compatible:URL or openai-compatible:URL.",
            ),
        ] = "anthropic",
        provider_key: Annotated[
            str | None,
            typer.Option(
                "--provider-key", help="A compatible provider's key: env:NAME or file:/PATH."
            ),
        ] = None,
        mcp: Annotated[
            Path | None,
            typer.Option("--mcp", help="MCP policy file (servers, tools, argument rules)."),
        ] = None,
        timeout: Annotated[
            float, typer.Option("--timeout", help="Wall-clock limit in seconds.")
        ] = 600.0,
        memory: Annotated[
            str, typer.Option("--memory", help="Memory limit of the agent's sandbox.")
        ] = "4G",
        model: Annotated[str | None, typer.Option("--model", help="Model name.")] = None,
        state_dir: Annotated[
            Path | None,
            typer.Option(
                "--state-dir",
                help="Session directory, outside the workspace "
                "(default $XDG_STATE_HOME/corral/agent/ID, else ~/.local/state/corral/agent/ID).",
            ),
        ] = None,
        no_sandbox: Annotated[
            bool,
            typer.Option(
                "--no-sandbox",
                help="Run directly on the host (synthetic provider only; benchmarks).",
            ),
        ] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the run as one JSON object.")
        ] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Print what the sandbox would run, then exit.")
        ] = False,
    ) -> None:
        """Run AGENT on PROMPT in WORKSPACE.

        Exit status: 0 succeeded, 1 failed, 124 timeout, 125 refused, 2 bad usage.
        """
        from corral.errors import AgentError, ConfigError, CorralError, UsageError

        text = " ".join(prompt).strip()
        if not text:
            raise _fail("the prompt is empty (give it after `--`)", 2)
        try:
            from corral.agents.routes import parse_provider

            choice = parse_provider(provider, provider_key)
            policy = None
            if mcp is not None:
                from corral.broker.mcp_policy import load_mcp_policy

                policy = load_mcp_policy(mcp)
            if dry_run:
                print(
                    _dry_run(
                        agent=agent,
                        prompt=text,
                        workspace=workspace,
                        provider=provider,
                        policy=policy,
                        model=model,
                    )
                )
                return
            import signal

            from corral.run.agent_run import run_agent
            from corral.sandbox import interrupts

            def _on_signal(_signum: int, _frame: object) -> None:
                # The session tears its sandbox down on the way out. Raised
                # inside Popen between its fork and exec, the exception would
                # leave the forked sandbox with no handle to kill it: while a
                # backend creates it, the interrupt waits (sandbox.interrupts).
                interrupts.deliver(_raise_interrupt)

            for s in (signal.SIGTERM, signal.SIGINT):
                signal.signal(s, _on_signal)
            result = run_agent(
                agent,
                text,
                workspace=workspace,
                provider=choice,
                mcp=policy,
                sandbox=not no_sandbox,
                timeout_s=timeout,
                memory=memory,
                model=model,
                state_dir=state_dir,
            )
        except (UsageError, ConfigError) as exc:
            raise _fail(str(exc), 2) from exc
        except (AgentError, CorralError) as exc:
            raise _fail(str(exc), 1) from exc
        if as_json:
            print(json.dumps(result.to_json_dict(), indent=2))
        else:
            r = result.result
            line = (
                f"{result.agent}: {r.status} in {result.timings.get('total_s', 0.0):.1f} s, "
                f"{r.usage.total} tokens, {len(r.tool_calls)} tool call(s)"
            )
            print(line)
            from corral.display import show

            # The agent wrote these: escaped and bounded before they reach a terminal.
            if r.text:
                print(f"  final message: {show(r.text, 300)}")
            if r.error:
                print(f"  error: {show(r.error, 1000)}")
            print(f"  journal: {result.journal}  (session {result.session})")
        raise typer.Exit(EXIT_STATUS[result.result.status])

    @agent_app.command("install")
    def install_cmd(
        agents: Annotated[
            list[str] | None,
            typer.Argument(help="Agents to install (default: claude-code and codex)."),
        ] = None,
    ) -> None:
        """Install the pinned CLIs from npm into corral's tools folder (idempotent)."""
        from corral.agents.install import default_tools_dir, install
        from corral.agents.registry import get_adapter
        from corral.errors import CorralError

        tools = default_tools_dir()
        for name in agents or ["claude-code", "codex"]:
            try:
                adapter = get_adapter(name)
                exe = install(adapter, tools)
            except CorralError as exc:
                raise _fail(str(exc), 1) from exc
            print(f"{name}: {adapter.package.spec} -> {exe}")

    @agent_app.command("list")
    def list_cmd() -> None:
        """The known agents, their pinned versions and whether they are installed."""
        from corral.agents.install import default_tools_dir, executable_path, installed_version
        from corral.agents.registry import ADAPTERS

        tools = default_tools_dir()
        for name, adapter in ADAPTERS.items():
            have = installed_version(adapter, tools)
            state = "installed" if have == adapter.package.version else "not installed"
            if have and have != adapter.package.version:
                state = f"version {have} installed, {adapter.package.version} pinned"
            print(f"{name:12} {adapter.package.spec:36} {state}")
            if have:
                print(f"{'':12} {executable_path(adapter, tools)}")

    app.add_typer(agent_app, name="agent")


def _dry_run(
    *,
    agent: str,
    prompt: str,
    workspace: Path,
    provider: str,
    policy: object,
    model: str | None,
) -> str:
    from corral.agents.base import DEFAULT_HOME
    from corral.agents.install import default_tools_dir, executable_path
    from corral.agents.launch import SANDBOX_BROKER, launch_request, mcp_endpoints
    from corral.agents.registry import get_adapter
    from corral.agents.routes import check_compatible, parse_provider
    from corral.broker.mcp_policy import McpPolicy

    adapter = get_adapter(agent)
    choice = parse_provider(provider)
    check_compatible(choice, adapter.name, adapter.wire)
    servers = policy.servers if isinstance(policy, McpPolicy) else {}
    request = launch_request(
        adapter,
        prompt,
        provider=choice,
        executable=str(executable_path(adapter, default_tools_dir())),
        workspace=str(workspace.resolve()),
        base_url=f"{SANDBOX_BROKER}/routes/{choice.route}",
        model=model,
        home=DEFAULT_HOME,
        mcp=mcp_endpoints(tuple(servers)),
    )
    return adapter.launch(request).display()
