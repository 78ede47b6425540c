"""Agent CLIs (Claude Code, Codex CLI, Gemini CLI) run unattended inside corral.

Modules (pure ones marked *):
    base*        AgentAdapter protocol, LaunchRequest, Launch, AgentResult
    claude_code* codex* gemini*   one adapter per CLI (argv, env, config, parsing)
    registry*    adapters by name            routes*      --provider and broker routes
    mcp_policy*  MCP servers, tool and argument rules, decisions
    tomlw*       TOML writer                 install      pinned npm installs in tools/
    mcp_gateway  the host-side MCP gateway   runner       run_agent(): one session
    demo_mcp     a stdlib MCP server for tests  cli       `corral agent ...`

See docs/agents.md. Nothing is imported here, so `corral` starts fast.
"""

__all__: list[str] = []
