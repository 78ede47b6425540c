"""The synthetic LLM provider: a fake model API that plays a scripted scenario.

It speaks the wire formats the agent CLIs use (Anthropic Messages, OpenAI
Responses and Chat Completions, Gemini generateContent), streaming or not, so
a real Claude Code / Codex / Gemini CLI can run offline against it. A scenario
(YAML, docs/scenarios.md) scripts the replies: text, tool calls given as
intents mapped onto whatever tools the request offers, conditions on the
previous tool results, and injected faults.

Python API::

    from corral.provider import ProviderThread, load_scenario, serve_provider

    async with serve_provider("scenarios/write-file.yaml") as server:
        server.url          # http://127.0.0.1:PORT  (OpenAI clients: server.url + "/v1")
        server.records      # list[ExchangeRecord], one per request so far

    provider = ProviderThread(load_scenario("scenarios/write-file.yaml"), transcript="t.jsonl")
    url = provider.start()  # runs in a background thread; blocks until listening
    ...
    provider.stop()

Both accept `host`, `port` (0 = any free port), `transcript` (a JSONL file,
one `ExchangeRecord` per line) and `observers` (objects with
`on_exchange(record)`, called before each reply is sent; one that raises makes
the provider refuse the reply with HTTP 500).

The pure core (`scenario`, `conversation`, `intents`, `engine`, `wire`) does no
I/O; `server` is the aiohttp shell and `cli` the `corral provider` commands.
Names are imported lazily so that `corral` starts without loading aiohttp.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.provider.conversation import Request, parse_request
    from corral.provider.engine import Decision, Failure, PlannedCall, Reply, decide
    from corral.provider.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
    from corral.provider.server import (
        ProviderConfig,
        ProviderServer,
        ProviderThread,
        serve_provider,
    )
    from corral.provider.transcript import (
        ExchangeObserver,
        ExchangeRecord,
        JsonlTranscript,
        MemoryTranscript,
    )

__all__ = [
    "Decision",
    "ExchangeObserver",
    "ExchangeRecord",
    "Failure",
    "JsonlTranscript",
    "MemoryTranscript",
    "PlannedCall",
    "ProviderConfig",
    "ProviderServer",
    "ProviderThread",
    "Reply",
    "Request",
    "Scenario",
    "ScenarioError",
    "decide",
    "load_scenario",
    "parse_request",
    "parse_scenario",
    "serve_provider",
]

_HOME = {
    "Request": "conversation",
    "parse_request": "conversation",
    "Decision": "engine",
    "Failure": "engine",
    "PlannedCall": "engine",
    "Reply": "engine",
    "decide": "engine",
    "Scenario": "scenario",
    "ScenarioError": "scenario",
    "load_scenario": "scenario",
    "parse_scenario": "scenario",
    "ProviderConfig": "server",
    "ProviderServer": "server",
    "ProviderThread": "server",
    "serve_provider": "server",
    "ExchangeObserver": "transcript",
    "ExchangeRecord": "transcript",
    "JsonlTranscript": "transcript",
    "MemoryTranscript": "transcript",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
