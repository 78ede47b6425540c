"""The DevTools pipe client: NUL-framed JSON, bounded, one page session."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

from corral.viewer import cdp
from corral.viewer.cdp import CdpClient, CdpError


class FakeBrowser:
    """Chromium's side of the pipe: reads commands (its fd 3), writes to its fd 4."""

    def __init__(self) -> None:
        self.cmd_r, self.cmd_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        self.seen: list[dict[str, object]] = []

    def client_fds(self) -> tuple[int, int]:
        return self.out_r, self.cmd_w

    def send(self, data: bytes) -> None:
        threading.Thread(target=os.write, args=(self.out_w, data), daemon=True).start()

    def read_command(self) -> dict[str, object]:
        buf = b""
        while not buf.endswith(b"\0"):
            buf += os.read(self.cmd_r, 65536)
        msg = json.loads(buf[:-1])
        assert isinstance(msg, dict)
        self.seen.append(msg)
        return msg


async def _attached(fb: FakeBrowser) -> CdpClient:
    client = await CdpClient.open(*fb.client_fds())
    task = asyncio.create_task(client.attach_page(5.0))
    msg = await asyncio.to_thread(fb.read_command)
    assert msg["method"] == "Target.getTargets" and "sessionId" not in msg
    page = {"targetId": "T1", "type": "page"}
    fb.send(json.dumps({"id": msg["id"], "result": {"targetInfos": [page]}}).encode() + b"\0")
    msg = await asyncio.to_thread(fb.read_command)
    assert msg["method"] == "Target.attachToTarget"
    assert msg["params"] == {"targetId": "T1", "flatten": True}
    fb.send(json.dumps({"id": msg["id"], "result": {"sessionId": "S1"}}).encode() + b"\0")
    assert await task == "S1"
    return client


def test_calls_go_to_the_page_session_and_other_sessions_events_are_dropped() -> None:
    async def main() -> None:
        fb = FakeBrowser()
        client = await _attached(fb)
        got: list[dict[str, object]] = []
        client.on("Page.frameNavigated", got.append)
        call = asyncio.create_task(client.call("Page.enable"))
        msg = await asyncio.to_thread(fb.read_command)
        assert msg["sessionId"] == "S1"
        fb.send(
            b'{"method":"Page.frameNavigated","params":{"x":1},"sessionId":"OTHER"}\0'
            b'{"method":"Page.frameNavigated","params":{"x":2}}\0'
            b'{"method":"Page.frameNavigated","params":{"x":3},"sessionId":"S1"}\0'
            + json.dumps({"id": msg["id"], "result": {}}).encode()
            + b"\0"
        )
        assert await call == {}
        assert got == [{"x": 3}]
        await client.aclose()

    asyncio.run(main())


def test_an_unbounded_message_closes_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cdp, "MAX_MESSAGE", 4096)

    async def main() -> None:
        fb = FakeBrowser()
        client = await _attached(fb)
        fb.send(b'{"method":"x","params":{"pad":"' + b"a" * 20000)
        await asyncio.wait_for(client.closed.wait(), 5.0)
        with pytest.raises(CdpError):
            await client.call("Page.enable")
        await client.aclose()

    asyncio.run(main())
