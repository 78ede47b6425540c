"""The synthetic provider's HTTP server: a thin aiohttp shell over the pure engine.

Routes (any prefix before `/v1` or `/v1beta` is ignored, so the server works
behind a broker route such as `/routes/anthropic/v1/messages`):

    POST /v1/messages[?beta=true]                 Anthropic Messages (stream or JSON)
    POST /v1/messages/count_tokens                Anthropic token count
    POST /v1/responses                            OpenAI Responses (stream or JSON)
    POST /v1/chat/completions                     OpenAI Chat Completions
    POST /v1beta/models/{m}:generateContent       Gemini
    POST /v1beta/models/{m}:streamGenerateContent Gemini (`?alt=sse` for SSE, else a JSON array)
    GET  /v1/models, /v1/models/{id}, /v1beta/models
    HEAD any path; GET .../api/hello              200 (Claude Code's connectivity checks)

Each request is read into a neutral `Request`, `engine.decide()` picks the
reply, observers get the `ExchangeRecord` (before anything is sent), then the
reply is rendered by `wire` with the decided fault applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from corral import boundedjson
from corral.boundedjson import DEFAULT_BOUNDS, BodyTooLarge, JsonBounds
from corral.errors import ProviderError
from corral.provider.conversation import Request, parse_request
from corral.provider.engine import Decision, Failure, decide, scripted_position
from corral.provider.scenario import Fault, Scenario, WireFamily, load_scenario
from corral.provider.transcript import (
    ExchangeObserver,
    ExchangeRecord,
    JsonlTranscript,
    MemoryTranscript,
)
from corral.provider.wire import (
    error_body,
    estimate_tokens,
    gemini_chunks,
    malform,
    render_json,
    render_stream,
    reply_usage,
)

__all__ = [
    "ProviderConfig",
    "ProviderServer",
    "ProviderThread",
    "Route",
    "resolve_scenario",
    "route_for",
    "serve_provider",
]

log = logging.getLogger("corral.provider")

_API = re.compile(r"^(?P<prefix>.*?)(?P<api>/v1(?:beta)?(?:/.*)?)$")
_GEMINI = re.compile(
    r"^/v1(?:beta)?/models/(?P<model>[^/:]+):"
    r"(?P<method>generateContent|streamGenerateContent|countTokens)$"
)


@dataclass(frozen=True)
class Route:
    endpoint: str
    family: WireFamily | None = None
    model: str = ""
    stream: bool = False
    sse: bool = True


def route_for(method: str, path: str, query: Mapping[str, str]) -> Route | None:
    """Which endpoint `method path` is, ignoring any prefix before `/v1` (pure)."""
    if method == "HEAD":
        return Route("head")
    if path.rstrip("/").endswith("/api/hello"):
        return Route("hello") if method == "GET" else None
    m = _API.match(path)
    api = m.group("api").rstrip("/") if m else ""
    if method == "GET":
        if api in ("/v1/models", "/v1beta/models"):
            return Route("models")
        if api.startswith(("/v1/models/", "/v1beta/models/")):
            return Route("model", model=api.rsplit("/", 1)[1])
        if path in ("", "/"):
            return Route("root")
        return None
    if method != "POST":
        return None
    if api == "/v1/messages":
        return Route("messages", "anthropic")
    if api == "/v1/messages/count_tokens":
        return Route("count_tokens", "anthropic")
    if api == "/v1/responses":
        return Route("responses", "responses")
    if api == "/v1/chat/completions":
        return Route("chat.completions", "chat")
    g = _GEMINI.match(api)
    if g and g.group("method") == "countTokens":
        return Route("count_tokens", "gemini", g.group("model"))
    if g:
        streaming = g.group("method") == "streamGenerateContent"
        return Route(
            g.group("method"), "gemini", g.group("model"), streaming, query.get("alt") == "sse"
        )
    return None


@dataclass(frozen=True)
class ProviderConfig:
    """What `ProviderServer` serves and where. `port=0` picks a free port."""

    scenario: Scenario
    host: str = "127.0.0.1"
    port: int = 0
    transcript: Path | None = None
    observers: tuple[ExchangeObserver, ...] = ()
    bounds: JsonBounds = DEFAULT_BOUNDS
    """What one request body may cost; a larger one is refused with 413 before parsing."""
    max_parsing: int = 2
    """Request bodies read and parsed at once; more wait (bounds memory to a multiple)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _fault_dict(fault: Fault | None) -> dict[str, Any] | None:
    return None if fault is None else fault.model_dump(exclude_defaults=True)


class ProviderServer:
    """A running synthetic provider; `records` keeps every exchange in memory.

    Use `await start()` / `await aclose()` (or `serve_provider`). `url` is the
    base URL for Anthropic and Gemini clients; OpenAI clients take `url + "/v1"`.
    """

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.scenario = config.scenario
        self.memory = MemoryTranscript()
        self._observers: list[ExchangeObserver] = [self.memory, *config.observers]
        self._transcript: JsonlTranscript | None = None
        self._runner: web.AppRunner | None = None
        self._attempts: dict[tuple[str, ...], int] = {}
        self.tokens_served = 0
        """Tokens of every reply this provider rendered (input + output, as it reports them)."""
        self.host = config.host
        self.port = config.port
        self._parsing = asyncio.Semaphore(config.max_parsing)

    @property
    def records(self) -> list[ExchangeRecord]:
        return self.memory.records

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self.config.transcript is not None:
            self._transcript = JsonlTranscript(self.config.transcript)
            self._observers.append(self._transcript)
        # aiohttp's own cap is a backstop; _read_body answers over-limit bodies first.
        app = web.Application(client_max_size=self.config.bounds.max_bytes + 1)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # In-flight replies (a slow stream) get a moment to finish; stop() must not hang.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self.config.host, self.config.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self.aclose()
            raise ProviderError(
                f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror or exc}"
            ) from exc
        # With port 0 the kernel picked the port; the runner reports what was bound.
        self.port = int(runner.addresses[0][1])

    async def aclose(self) -> None:
        try:
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            self._runner = None
            if self._transcript is not None:
                self._transcript.close()
                self._observers.remove(self._transcript)
                self._transcript = None

    # -- request handling --------------------------------------------------------------

    def _record(self, record: ExchangeRecord) -> bool:
        """Hand `record` to every observer; False if one failed (the reply is then refused)."""
        ok = True
        for observer in self._observers:
            try:
                observer.on_exchange(record)
            except Exception:
                log.exception("provider exchange observer %r failed", observer)
                ok = False
        return ok

    def _base(self, request: web.Request, route: Route | None) -> ExchangeRecord:
        return ExchangeRecord(
            time=_now(),
            method=request.method,
            path=request.path_qs,
            endpoint=route.endpoint if route else "unknown",
            family=route.family if route else None,
            model=None,
            stream=False,
            status=200,
            kind="meta",
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        route = route_for(request.method, request.path, request.query)
        base = self._base(request, route)
        if route is None:
            record = replace(base, status=404, kind="bad_request", error="no such endpoint")
            self._record(record)
            return web.json_response(
                error_body(None, 404, f"no such endpoint: {request.method} {request.path}"),
                status=404,
            )
        if route.family is None:
            return self._meta(route, base)
        try:
            return await self._model_request(request, route, route.family, base)
        except Exception as exc:
            # A defect in the core must surface as a recorded error, never as a
            # half-made reply the agent would act on.
            log.exception("provider failed on %s %s", request.method, request.path)
            message = f"synthetic provider internal error: {exc!r}"
            self._record(replace(base, status=500, kind="error", error=message))
            body = error_body(route.family, 500, message, "provider_internal_error")
            return web.json_response(body, status=500)

    async def _model_request(
        self, request: web.Request, route: Route, family: WireFamily, base: ExchangeRecord
    ) -> web.StreamResponse:
        async with self._parsing:
            try:
                raw = await self._read_body(request)
                body = boundedjson.loads(raw, self.config.bounds)
                if not isinstance(body, dict):
                    raise ValueError("the body is not a JSON object")
            except BodyTooLarge as exc:
                message = f"request body refused: {exc}"
                self._record(replace(base, status=413, kind="bad_request", error=message))
                return web.json_response(error_body(family, 413, message), status=413)
            except ValueError as exc:
                message = f"request body is not a JSON object: {exc}"
                self._record(replace(base, status=400, kind="bad_request", error=message))
                return web.json_response(error_body(family, 400, message), status=400)
        return await self._model_reply(request, route, family, base, raw=raw, body=body)

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, read no further than the byte limit (BodyTooLarge past it)."""
        limit = self.config.bounds.max_bytes
        declared = request.content_length
        if declared is not None and declared > limit:
            raise BodyTooLarge(f"declared body of {declared} bytes is over the {limit}-byte limit")
        buf = bytearray()
        while chunk := await request.content.read(65536):
            buf += chunk
            if len(buf) > limit:
                raise BodyTooLarge(f"body is over the {limit}-byte limit")
        return bytes(buf)

    async def _model_reply(
        self,
        request: web.Request,
        route: Route,
        family: WireFamily,
        base: ExchangeRecord,
        *,
        raw: bytes,
        body: dict[str, Any],
    ) -> web.StreamResponse:
        parsed = parse_request(family, body, model=route.model, stream=route.stream)
        input_tokens = estimate_tokens(raw.decode("utf-8", "replace"))
        if route.endpoint == "count_tokens":
            self._record(
                replace(base, model=parsed.model, kind="meta", reply={"input_tokens": input_tokens})
            )
            if family == "gemini":
                return web.json_response({"totalTokens": input_tokens})
            return web.json_response({"input_tokens": input_tokens})
        attempt = self._attempt(parsed)
        decision = decide(self.scenario, parsed, attempt)
        record = self._decision_record(base, parsed, decision, attempt)
        if not self._record(record):
            message = "the provider could not record this exchange; reply refused"
            return web.json_response(error_body(family, 500, message), status=500)
        return await self._send(request, route, parsed, decision, input_tokens)

    def _attempt(self, parsed: Request) -> int:
        opening = hashlib.sha256(parsed.opening.encode()).hexdigest()[:16]
        key = (parsed.family, opening, str(len(parsed.turns)), str(scripted_position(parsed)))
        self._attempts[key] = self._attempts.get(key, 0) + 1
        return self._attempts[key]

    def _decision_record(
        self, base: ExchangeRecord, parsed: Request, decision: Decision, attempt: int
    ) -> ExchangeRecord:
        fault = decision.fault
        outcome = decision.outcome
        status, kind, error, reply = 200, "reply", None, {}
        if isinstance(outcome, Failure):
            status, kind, error = outcome.status, "error", f"{outcome.kind}: {outcome.message}"
        else:
            reply = outcome.summary()
            kind = "prelude" if decision.prelude else "side" if decision.side else "reply"
        if fault is not None and fault.status is not None:
            status, kind = fault.status, "fault"
        return replace(
            base,
            model=parsed.model,
            stream=parsed.stream,
            status=status,
            kind=kind,
            turn=decision.turn,
            script=decision.script,
            label=decision.label,
            attempt=attempt,
            tools=tuple(t.full_name for t in parsed.tools),
            reply=reply,
            error=error,
            fault=_fault_dict(fault),
        )

    def _meta(self, route: Route, base: ExchangeRecord) -> web.StreamResponse:
        self._record(base)
        if route.endpoint == "head":
            return web.Response(status=200)
        if route.endpoint in ("hello", "root"):
            return web.json_response({"ok": True, "provider": "corral-synthetic"})
        model = self.scenario.model
        entry = {
            "id": model,
            "object": "model",
            "type": "model",
            "display_name": model,
            "lifecycle": "active",
            "created": 0,
            "created_at": "2025-01-01T00:00:00Z",
            "owned_by": "corral",
            "name": f"models/{model}",
            "supportedGenerationMethods": ["generateContent", "streamGenerateContent"],
        }
        if route.endpoint == "model":
            return web.json_response({**entry, "id": route.model, "display_name": route.model})
        return web.json_response(
            {
                "object": "list",
                "data": [entry],
                "models": [entry],
                "has_more": False,
                "first_id": model,
                "last_id": model,
            }
        )

    async def _send(
        self,
        request: web.Request,
        route: Route,
        parsed: Request,
        decision: Decision,
        input_tokens: int,
    ) -> web.StreamResponse:
        family = parsed.family
        fault = decision.fault or Fault()
        if fault.first_byte_delay:
            await asyncio.sleep(fault.first_byte_delay)
        if fault.status is not None:
            body = (
                fault.body
                if fault.body is not None
                else error_body(family, fault.status, f"injected fault: HTTP {fault.status}")
            )
            if isinstance(body, str):
                return web.Response(status=fault.status, text=body, content_type="text/plain")
            return web.json_response(body, status=fault.status)
        outcome = decision.outcome
        if isinstance(outcome, Failure):
            return web.json_response(
                error_body(family, outcome.status, outcome.message, outcome.kind),
                status=outcome.status,
            )
        model = parsed.model or self.scenario.model
        rid = _response_id(family)
        created = int(time.time())
        self.tokens_served += reply_usage(outcome, input_tokens).total
        try:
            if route.stream and not route.sse:  # Gemini stream without alt=sse: one JSON array
                chunks = gemini_chunks(outcome, model, rid, reply_usage(outcome, input_tokens))
                return await self._send_body(request, json.dumps(chunks).encode(), fault)
            if parsed.stream:
                events = render_stream(
                    family,
                    outcome,
                    model=model,
                    response_id=rid,
                    input_tokens=input_tokens,
                    created=created,
                    include_usage=parsed.include_usage,
                )
                return await self._send_events(
                    request, [e.encode() for e in _faulted(events, fault)], fault
                )
            body = render_json(
                family,
                outcome,
                model=model,
                response_id=rid,
                input_tokens=input_tokens,
                created=created,
            )
            return await self._send_body(request, json.dumps(body).encode(), fault)
        except ConnectionError:
            # The client went away mid-reply; there is nobody left to answer.
            log.info("provider client disconnected during %s", route.endpoint)
            return web.Response(status=499)

    async def _send_events(
        self, request: web.Request, events: Sequence[bytes], fault: Fault
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            },
        )
        await resp.prepare(request)
        for i, data in enumerate(events):
            if fault.truncate_after is not None and i >= fault.truncate_after:
                _cut(request)
                return resp
            await resp.write(data)
            if fault.event_delay and i + 1 < len(events):
                await asyncio.sleep(fault.event_delay)
        await resp.write_eof()
        return resp

    async def _send_body(
        self, request: web.Request, body: bytes, fault: Fault
    ) -> web.StreamResponse:
        if fault.truncate_after is None:
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        _cut(request)
        return resp


def _cut(request: web.Request) -> None:
    # close() (not abort()) flushes what was written, then drops the connection, so
    # the client sees a body that ends early: an incomplete chunked read for SSE.
    if request.transport is not None:
        request.transport.close()


def _faulted(events: Sequence[Any], fault: Fault) -> Sequence[Any]:
    return malform(events, fault.malformed_at) if fault.malformed_at is not None else events


def _response_id(family: WireFamily) -> str:
    token = uuid.uuid4().hex[:24]
    match family:
        case "anthropic":
            return f"msg_corral_{token}"
        case "responses":
            return f"resp_corral_{token}"
        case "chat":
            return f"chatcmpl-corral{token}"
        case "gemini":
            return token


def resolve_scenario(scenario: Scenario | str | Path) -> Scenario:
    """A `Scenario` as is; a path is loaded (ScenarioError if invalid)."""
    return scenario if isinstance(scenario, Scenario) else load_scenario(scenario)


def _config(
    scenario: Scenario | str | Path,
    host: str,
    port: int,
    transcript: str | Path | None,
    observers: Sequence[ExchangeObserver],
) -> ProviderConfig:
    path = Path(transcript) if transcript is not None else None
    return ProviderConfig(resolve_scenario(scenario), host, port, path, tuple(observers))


@asynccontextmanager
async def serve_provider(
    scenario: Scenario | str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    transcript: str | Path | None = None,
    observers: Sequence[ExchangeObserver] = (),
) -> AsyncIterator[ProviderServer]:
    """Run a provider for the duration of the `async with` block; yields the started server."""
    server = ProviderServer(_config(scenario, host, port, transcript, observers))
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


class ProviderThread:
    """A provider on its own event loop in a background thread, for synchronous callers.

    `start()` returns the base URL once the server listens (ProviderError if
    it cannot); `stop()` shuts it down and joins the thread. Also a context
    manager. The thread is a daemon so that a test that forgets `stop()`
    cannot hang interpreter exit.
    """

    def __init__(
        self,
        scenario: Scenario | str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        transcript: str | Path | None = None,
        observers: Sequence[ExchangeObserver] = (),
    ) -> None:
        self.config = _config(scenario, host, port, transcript, observers)
        self._server: ProviderServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def server(self) -> ProviderServer:
        if self._server is None:
            raise ProviderError("the provider thread is not running")
        return self._server

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def records(self) -> list[ExchangeRecord]:
        return self.server.records

    @property
    def tokens_served(self) -> int:
        """What the provider's replies reported, counted where no sandbox reaches."""
        return self.server.tokens_served

    def start(self, timeout: float = 10.0) -> str:
        if self._thread is not None:
            raise ProviderError("the provider thread was already started")
        self._thread = threading.Thread(target=self._run, name="corral-provider", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise ProviderError(f"the provider did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            raise ProviderError(f"the provider failed to start: {self._error}") from self._error
        return self.url

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        server = ProviderServer(self.config)
        try:
            await server.start()
        except BaseException as exc:  # reported to start(), which raises it in the caller
            self._error = exc
            self._ready.set()
            return
        self._server = server
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            await server.aclose()

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop, event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and event is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(event.set)
        thread.join(timeout)
        if thread.is_alive():
            raise ProviderError(f"the provider thread did not stop within {timeout} s")

    def __enter__(self) -> ProviderThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
