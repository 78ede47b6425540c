"""The dashboard's aiohttp application: runs list, run page, live events, actions.

`create_app(runs_dir, token, extensions=...)` builds the application; each
extension (the viewer) is called with it before it is frozen, so its routes
sit behind the same `security_middleware` and headers as the dashboard's own.
A page is rendered by Jinja2 with autoescaping always on: every value from a
run (names, diffs, check output, journal targets, summaries) is text. The
browser's script (static/dash.js) writes live values with `textContent` only.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from corral.dashboard import data
from corral.dashboard.security import (
    AUTH_KEY,
    Auth,
    security_middleware,
    stamp_headers,
)
from corral.errors import CorralError, UsageError
from corral.run.environments import RunLayout

__all__ = ["AUTOESCAPE", "RUNS_DIR_KEY", "VIEWABLE_KEY", "VIEWER_ROUTE", "create_app"]

#: Never turned off; a module constant so a control test can show what escaping prevents.
AUTOESCAPE: Final = True

#: The name of the route an extension registers to show a run in the viewer;
#: the run page links to it (with `run=ID`) when it exists.
VIEWER_ROUTE: Final = "viewer"

RUNS_DIR_KEY: Final = web.AppKey("corral_dashboard_runs_dir", Path)
#: Set by a viewer extension that shows only some runs: the run pages link those only.
VIEWABLE_KEY: Final = web.AppKey("corral_dashboard_viewable", frozenset[str])
_JINJA_KEY: Final = web.AppKey[Any]("corral_dashboard_jinja")
_STREAMS_KEY: Final = web.AppKey[set[asyncio.Task[Any]]]("corral_dashboard_streams")
_PLOTS_KEY: Final = web.AppKey[dict[str, tuple[tuple[int, int], bytes]]]("corral_dashboard_plots")

_HERE: Final = Path(__file__).parent
MAX_STREAMS: Final = 16
POLL_S: Final = 0.5
MAX_EVENT_ROWS: Final = 50


def _jinja() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=AUTOESCAPE,
        undefined=jinja2.StrictUndefined,
    )


def _render(request: web.Request, name: str, status: int = 200, **ctx: Any) -> web.Response:
    env = request.app[_JINJA_KEY]
    html = env.get_template(name).render(csrf=request.app[AUTH_KEY].csrf, **ctx)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


async def _layout(request: web.Request) -> RunLayout:
    # In a thread: finding a run may mount its disk image (and wait on its lock).
    layout = await asyncio.to_thread(
        data.run_layout, request.app[RUNS_DIR_KEY], request.match_info["run"]
    )
    if layout is None:
        raise web.HTTPNotFound(text="404: no such run\n")
    return layout


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n else "–"


async def _runs(request: web.Request) -> web.Response:
    runs = await asyncio.to_thread(data.list_run_summaries, request.app[RUNS_DIR_KEY])
    return _render(request, "runs.html", runs=runs, mib=_mib)


def _run_context(layout: RunLayout, decision: str, diff_n: int | None) -> dict[str, Any]:
    summary = data.run_summary(layout)
    sessions = data.session_views(layout)
    chosen = diff_n if diff_n is not None else (sessions[-1].n if sessions else 0)
    return {
        "run": summary,
        "sessions": sessions,
        "prompts": {s.n: data.session_prompt(layout, s.n) for s in sessions[-20:]},
        "checks": {s.n: data.session_checks(layout, s.n) for s in sessions[-20:]},
        "diff_n": chosen,
        "diff": data.session_diff(layout, sessions, chosen) if chosen else "",
        "journal": data.journal_rows(layout, decision=decision),
        "journal_max": data.journal_max_id(layout),
        "decision": decision,
        "plot": data.has_samples(layout),
        "proposals": data.live_proposals(layout),
    }


async def _run(request: web.Request) -> web.Response:
    layout = await _layout(request)
    decision = request.query.get("decision", "all")
    if decision not in ("all", "allow", "deny"):
        raise web.HTTPBadRequest(text="400: decision is all, allow or deny\n")
    raw_n = request.query.get("diff")
    diff_n = int(raw_n) if raw_n is not None and raw_n.isdigit() and len(raw_n) < 6 else None
    try:
        ctx = await asyncio.to_thread(_run_context, layout, decision, diff_n)
    except CorralError as exc:
        raise web.HTTPNotFound(text="404: run not readable\n") from exc
    viewer = request.app.router.named_resources().get(VIEWER_ROUTE)
    viewable = request.app.get(VIEWABLE_KEY)
    if viewable is not None and layout.run_id not in viewable:
        viewer = None
    viewer_url = str(viewer.url_for().with_query(run=layout.run_id)) if viewer else ""
    return _render(request, "run.html", mib=_mib, viewer_url=viewer_url, **ctx)


def _plot_svg(layout: RunLayout, cache: dict[str, tuple[tuple[int, int], bytes]]) -> bytes:
    from corral.run.plot import render_svg
    from corral.run.watchdog import read_samples

    src = layout.root / "footprint.jsonl"
    st = src.stat()
    key = (st.st_mtime_ns, st.st_size)
    hit = cache.get(layout.run_id)
    if hit is not None and hit[0] == key:
        return hit[1]
    samples = read_samples(src, limit=20_000)
    if len(samples) < 2:
        raise FileNotFoundError(src)
    with tempfile.TemporaryDirectory(prefix="corral-dash-") as tmp:
        dest = Path(tmp) / "footprint.svg"
        render_svg(samples, {}, dest)
        svg = dest.read_bytes()
    if len(cache) > 32:
        cache.clear()
    cache[layout.run_id] = (key, svg)
    return svg


async def _plot(request: web.Request) -> web.Response:
    layout = await _layout(request)
    try:
        svg = await asyncio.to_thread(_plot_svg, layout, request.app[_PLOTS_KEY])
    except OSError as exc:
        raise web.HTTPNotFound(text="404: no samples\n") from exc
    return web.Response(body=svg, content_type="image/svg+xml")


def _snapshot(layout: RunLayout, after: int) -> dict[str, Any]:
    summary = data.run_summary(layout)
    rows = data.journal_rows(layout, after_id=after, limit=MAX_EVENT_ROWS)
    rows.sort(key=lambda r: r.id)
    return {
        "state": summary.state,
        "sessions": summary.sessions,
        "checks": f"{summary.checks_passed}/{summary.checks_total}",
        "peak": _mib(summary.peak_memory),
        "sessions_detail": [
            {
                "n": s.n,
                "state": s.state,
                "phase": s.phase,
                "checks": f"{s.checks_passed}/{s.checks_total}",
            }
            for s in data.session_views(layout)
        ],
        "journal": [r.to_json() for r in rows],
    }


async def _events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the run's state and new journal rows, polled server-side."""
    layout = await _layout(request)
    streams = request.app[_STREAMS_KEY]
    if len(streams) >= MAX_STREAMS:
        raise web.HTTPTooManyRequests(text="429: too many live views\n")
    raw = request.query.get("after", "0")
    after = int(raw) if raw.isdigit() and len(raw) < 12 else 0
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    task = asyncio.current_task()
    assert task is not None
    streams.add(task)
    try:
        await resp.prepare(request)
        last = ""
        while True:
            try:
                snap = await asyncio.to_thread(_snapshot, layout, after)
            except CorralError:
                snap = None
            if snap is not None:
                if snap["journal"]:
                    after = max([after, *(int(r["id"]) for r in snap["journal"])])
                # ensure_ascii: the stream is one line of ASCII per event whatever a run wrote.
                text = json.dumps(snap, ensure_ascii=True, separators=(",", ":"))
                if text != last or snap["journal"]:
                    await resp.write(f"data: {text}\n\n".encode("ascii"))
                    last = text
            await asyncio.sleep(POLL_S)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        streams.discard(task)
    return resp


def _act(layout: RunLayout, action: str) -> str:
    match action:
        case "stop":
            from corral.run.control import stop_run

            return f"run is {stop_run(layout)}"
        case "pause":
            from corral.run.pause import pause_run

            return "paused" if pause_run(layout) else "already paused"
        case "resume":
            from corral.run.pause import thaw_run

            return "resumed" if thaw_run(layout) else "was not paused"
        case _:
            raise UsageError(f"unknown action {action!r}")


async def _action(request: web.Request) -> web.Response:
    layout = await _layout(request)
    action = request.match_info["action"]
    if action not in ("stop", "pause", "resume"):
        raise web.HTTPNotFound(text="404: no such action\n")
    try:
        message = await asyncio.to_thread(_act, layout, action)
    except CorralError as exc:
        message = f"{action} refused: {exc}"
    return web.json_response({"message": message})


def _approve_in_run(layout: RunLayout, proposal: str, allow_private: bool) -> str:
    from corral.run.live_cli import approve_proposal, live_run

    lines = approve_proposal(live_run(layout), proposal, allow_private=allow_private)
    return "; ".join(lines)


async def _approve(request: web.Request) -> web.Response:
    """Approve a live-policy proposal: the control path `corral approve` takes.

    The gate has checked Origin and the form's CSRF field; a private or
    loopback proposal also needs the form's `allow_private` box (the
    `--allow-private` of `corral approve`).
    """
    layout = await _layout(request)
    proposal = request.match_info["proposal"]
    if not (0 < len(proposal) <= 64 and all(c in "0123456789abcdef" for c in proposal)):
        raise web.HTTPNotFound(text="404: no such proposal\n")
    form = await request.post()
    allow_private = form.get("allow_private") == "on"
    try:
        message = await asyncio.to_thread(_approve_in_run, layout, proposal, allow_private)
    except CorralError as exc:
        message = f"approve refused: {exc}"
    return web.json_response({"message": message[:2000]})


def create_app(
    runs_dir: Path,
    token: str,
    *,
    extensions: Sequence[Callable[[web.Application], None]] = (),
) -> web.Application:
    """The dashboard over `runs_dir`, admitting only holders of `token`.

    Each extension adds its routes to the application (named `VIEWER_ROUTE`
    for the viewer's page); they get the same gate and headers.
    """
    if len(token) < 16:
        raise UsageError("the dashboard token is too short")
    app = web.Application(middlewares=[security_middleware], client_max_size=4096)
    app[AUTH_KEY] = Auth.new(token)
    app[RUNS_DIR_KEY] = runs_dir.absolute()
    app[_JINJA_KEY] = _jinja()
    app[_STREAMS_KEY] = set()
    app[_PLOTS_KEY] = {}
    app.on_response_prepare.append(stamp_headers)
    app.router.add_get("/", _runs, name="runs")
    app.router.add_get("/run/{run}", _run, name="run")
    app.router.add_get("/run/{run}/footprint.svg", _plot, name="plot")
    app.router.add_get("/run/{run}/events", _events, name="events")
    app.router.add_post("/run/{run}/{action}", _action, name="action")
    app.router.add_post("/run/{run}/approve/{proposal}", _approve, name="approve")
    app.router.add_static("/static/", _HERE / "static", name="static", follow_symlinks=False)
    for extend in extensions:
        extend(app)

    async def _close_streams(app: web.Application) -> None:
        # An event stream never ends by itself; shutdown would wait on it.
        tasks: set[asyncio.Task[Any]] = app[_STREAMS_KEY]
        for task in tuple(tasks):
            task.cancel()

    app.on_shutdown.append(_close_streams)
    return app
