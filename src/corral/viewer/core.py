"""The viewer: screencast frames out, validated input in, product text as text.

One `Viewer` drives one page target of the viewer sandbox's Chromium over
CDP. Frames are JPEG bytes checked by `frames.jpeg_from_b64`; console
messages, exceptions and failed requests are kept in a bounded ring from the
start (so a page that connects later sees what happened before) as cleaned,
length-bounded text that the page shows with `textContent` only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from corral.viewer.cdp import CdpClient, CdpError
from corral.viewer.frames import FrameRejected, jpeg_from_b64
from corral.viewer.inputs import InputEvent, Key, Mouse, Nav, Resize, Text, Wheel, clean_text

__all__ = ["Viewer", "ViewerEvent", "open_page_target"]

_RING = 500
_TEXT = 500
_FRAME_QUEUE = 2


@dataclass(frozen=True, slots=True)
class ViewerEvent:
    """A text event for the page: kind console/exception/failed/navigated."""

    kind: str
    level: str
    text: str
    at: float

    def to_json(self) -> str:
        return json.dumps(
            {"kind": self.kind, "level": self.level, "text": self.text, "at": self.at}
        )


async def open_page_target(read_fd: int, write_fd: int, timeout_s: float = 30.0) -> CdpClient:
    """Own Chromium's DevTools pipe (`read_fd`: its fd 4, `write_fd`: its fd 3), attach."""
    client = await CdpClient.open(read_fd, write_fd)
    try:
        await client.attach_page(timeout_s)
    except BaseException:
        await client.aclose()
        raise
    return client


class Viewer:
    """Screencast + input of one page. `start()` then `aclose()`."""

    def __init__(
        self, client: CdpClient, origin: str, width: int = 1280, height: int = 800
    ) -> None:
        self._cdp = client
        self.origin = origin
        self.width, self.height = width, height
        self.frame: bytes | None = None
        self.frames_seen = 0
        self.frames_rejected = 0
        self.events: collections.deque[ViewerEvent] = collections.deque(maxlen=_RING)
        self._frame_subs: set[asyncio.Queue[bytes]] = set()
        self._event_subs: set[asyncio.Queue[ViewerEvent]] = set()
        self._requests: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._screencast = False

    # -- setup ------------------------------------------------------------
    async def start(self, path: str = "/") -> None:
        c = self._cdp
        c.on("Page.screencastFrame", self._on_frame)
        c.on("Runtime.consoleAPICalled", self._on_console)
        c.on("Runtime.exceptionThrown", self._on_exception)
        c.on("Network.requestWillBeSent", self._on_request)
        c.on("Network.loadingFailed", self._on_failed)
        c.on("Page.frameNavigated", self._on_navigated)
        for domain in ("Page", "Runtime", "Network"):
            await c.call(f"{domain}.enable")
        await self.resize(self.width, self.height)
        await self._start_screencast()
        await c.call("Page.navigate", {"url": self.origin + path})

    async def _start_screencast(self) -> None:
        await self._cdp.call(
            "Page.startScreencast",
            {"format": "jpeg", "quality": 70, "maxWidth": self.width, "maxHeight": self.height},
        )
        self._screencast = True

    # -- CDP events (on the loop; bounded, never raise) -------------------
    def _on_frame(self, params: dict[str, Any]) -> None:
        sid = params.get("sessionId")
        if isinstance(sid, int):
            asyncio.get_running_loop().create_task(self._ack(sid))
        try:
            jpeg = jpeg_from_b64(params.get("data"))
        except FrameRejected:
            self.frames_rejected += 1
            return
        self._publish_frame(jpeg)

    async def _ack(self, sid: int) -> None:
        with contextlib.suppress(CdpError):
            await self._cdp.call("Page.screencastFrameAck", {"sessionId": sid})

    def _publish_frame(self, jpeg: bytes) -> None:
        self.frame = jpeg
        self.frames_seen += 1
        for q in self._frame_subs:
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(jpeg)

    def _event(self, kind: str, level: str, text: str) -> None:
        ev = ViewerEvent(kind, clean_text(level, 16), clean_text(text, _TEXT), time.time())
        self.events.append(ev)
        for q in self._event_subs:
            if not q.full():
                q.put_nowait(ev)

    def _on_console(self, params: dict[str, Any]) -> None:
        args = params.get("args")
        parts = []
        for a in args[:20] if isinstance(args, list) else []:
            if isinstance(a, dict):
                v = a.get("value", a.get("description", a.get("type", "")))
                parts.append(v if isinstance(v, str) else json.dumps(v)[:_TEXT])
        level = params.get("type")
        self._event("console", level if isinstance(level, str) else "log", " ".join(parts))

    def _on_exception(self, params: dict[str, Any]) -> None:
        det = params.get("exceptionDetails")
        text = ""
        if isinstance(det, dict):
            exc = det.get("exception")
            text = str(exc.get("description", "")) if isinstance(exc, dict) else ""
            text = text or str(det.get("text", ""))
        self._event("exception", "error", text)

    def _on_request(self, params: dict[str, Any]) -> None:
        rid, req = params.get("requestId"), params.get("request")
        if isinstance(rid, str) and isinstance(req, dict):
            self._requests[rid[:64]] = clean_text(str(req.get("url", "")), _TEXT)
            while len(self._requests) > _RING:
                self._requests.popitem(last=False)

    def _on_failed(self, params: dict[str, Any]) -> None:
        rid = params.get("requestId")
        url = self._requests.get(rid, "?") if isinstance(rid, str) else "?"
        self._event("failed", "error", f"{url} {params.get('errorText', '')}")

    def _on_navigated(self, params: dict[str, Any]) -> None:
        frame = params.get("frame")
        if isinstance(frame, dict) and frame.get("parentId") is None:
            url = str(frame.get("url", ""))
            self._event("navigated", "info", url)
            if not (url == self.origin or url.startswith(self.origin + "/")):
                # The product's script may navigate anywhere; the view stays on its origin.
                asyncio.get_running_loop().create_task(self._go("/"))

    # -- subscribers ------------------------------------------------------
    def subscribe(self) -> tuple[asyncio.Queue[bytes], asyncio.Queue[ViewerEvent]]:
        fq: asyncio.Queue[bytes] = asyncio.Queue(maxsize=_FRAME_QUEUE)
        eq: asyncio.Queue[ViewerEvent] = asyncio.Queue(maxsize=_RING)
        self._frame_subs.add(fq)
        self._event_subs.add(eq)
        return fq, eq

    def unsubscribe(self, fq: asyncio.Queue[bytes], eq: asyncio.Queue[ViewerEvent]) -> None:
        self._frame_subs.discard(fq)
        self._event_subs.discard(eq)

    async def current_frame(self) -> bytes | None:
        """A fresh screenshot (the screencast emits only on change), else the last frame."""
        try:
            shot = await self._cdp.call("Page.captureScreenshot", {"format": "jpeg", "quality": 70})
            self.frame = jpeg_from_b64(shot.get("data"))
        except (CdpError, FrameRejected):
            pass
        return self.frame

    # -- input ------------------------------------------------------------
    async def dispatch(self, ev: InputEvent) -> None:
        c = self._cdp
        match ev:
            case Mouse():
                await c.call(
                    "Input.dispatchMouseEvent",
                    {
                        "type": ev.type,
                        "x": ev.x,
                        "y": ev.y,
                        "button": ev.button,
                        "clickCount": ev.click_count,
                    },
                )
            case Wheel():
                await c.call(
                    "Input.dispatchMouseEvent",
                    {"type": "mouseWheel", "x": ev.x, "y": ev.y, "deltaX": ev.dx, "deltaY": ev.dy},
                )
            case Key():
                params: dict[str, Any] = {"type": ev.type, "key": ev.key, "code": ev.code}
                if ev.type == "keyDown" and len(ev.key) == 1:
                    params["text"] = ev.key
                elif ev.key == "Enter" and ev.type == "keyDown":
                    params.update(text="\r", windowsVirtualKeyCode=13)
                elif ev.key in _VK:
                    params["windowsVirtualKeyCode"] = _VK[ev.key]
                await c.call("Input.dispatchKeyEvent", params)
            case Text():
                await c.call("Input.insertText", {"text": ev.text})
            case Resize():
                await self.resize(ev.width, ev.height)
            case Nav():
                await self._nav(ev)

    async def resize(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        await self._cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        if self._screencast:
            await self._cdp.call("Page.stopScreencast")
            await self._start_screencast()

    async def _go(self, path: str) -> None:
        with contextlib.suppress(CdpError):
            await self._cdp.call("Page.navigate", {"url": self.origin + path})

    async def _nav(self, ev: Nav) -> None:
        if ev.action == "go":
            await self._go(ev.path)
        elif ev.action == "reload":
            await self._cdp.call("Page.reload")
        else:
            hist = await self._cdp.call("Page.getNavigationHistory")
            idx, entries = hist.get("currentIndex"), hist.get("entries")
            if not isinstance(idx, int) or not isinstance(entries, list):
                return
            to = idx - 1 if ev.action == "back" else idx + 1
            if 0 <= to < len(entries) and isinstance(entries[to], dict):
                eid = entries[to].get("id")
                if isinstance(eid, int):
                    await self._cdp.call("Page.navigateToHistoryEntry", {"entryId": eid})

    async def aclose(self) -> None:
        await self._cdp.aclose()


_VK = {
    "Backspace": 8,
    "Tab": 9,
    "Escape": 27,
    "ArrowLeft": 37,
    "ArrowUp": 38,
    "ArrowRight": 39,
    "ArrowDown": 40,
    "Delete": 46,
}
