"""What the page may send and what the browser may pass as a frame (pure)."""

from __future__ import annotations

import base64
import json

import pytest

from corral.viewer.frames import MAX_FRAME, FrameRejected, jpeg_from_b64
from corral.viewer.inputs import InputRejected, Mouse, Nav, Text, parse_input


def _msg(**kw: object) -> str:
    return json.dumps(kw)


def test_valid_events_parse() -> None:
    msg = _msg(kind="mouse", type="mousePressed", x=10, y=20, button="left", clickCount=1)
    m = parse_input(msg)
    assert m == Mouse("mousePressed", 10, 20, "left", 1)
    assert parse_input(_msg(kind="text", text="héllo")) == Text("héllo")
    assert parse_input(_msg(kind="nav", action="go", path="/todos?x=1")) == Nav("go", "/todos?x=1")


@pytest.mark.parametrize(
    "msg",
    [
        "not json",
        "[]",
        _msg(kind="eval", expression="1"),
        _msg(kind="mouse", type="mousePressed", x=-1, y=0, button="left"),
        _msg(kind="mouse", type="mousePressed", x=99999, y=0, button="left"),
        _msg(kind="mouse", type="mouseWheel", x=1, y=1, button="left"),
        _msg(kind="mouse", type="mousePressed", x=True, y=0, button="left"),
        _msg(kind="text", text="a\x1b[2Jb"),
        _msg(kind="text", text="x" * 1001),
        _msg(kind="key", type="keyDown", key="a\r", code="KeyA"),
        _msg(kind="resize", width=10, height=10),
        # Navigation leaves the product's origin only through these; all refused.
        _msg(kind="nav", action="go", path="http://169.254.169.254/"),
        _msg(kind="nav", action="go", path="//evil.example/"),
        _msg(kind="nav", action="go", path="/\\evil.example"),
        _msg(kind="nav", action="go", path="javascript:alert(1)"),
        _msg(kind="nav", action="go", path="/a b"),
        "x" * 5000,
    ],
)
def test_invalid_events_are_refused(msg: str) -> None:
    with pytest.raises(InputRejected):
        parse_input(msg, 1280, 800)


def _jpeg(body: bytes = b"\x00" * 200) -> str:
    return base64.b64encode(b"\xff\xd8\xff\xe0" + body + b"\xff\xd9").decode()


def test_a_jpeg_frame_passes() -> None:
    assert jpeg_from_b64(_jpeg()).startswith(b"\xff\xd8\xff")


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "!!!not base64",
        base64.b64encode(b"<html><script>alert(1)</script></html>" * 10).decode(),
        base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 200).decode(),
        base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 200).decode(),  # no end marker
        _jpeg(b"\x00" * (MAX_FRAME + 10)),
    ],
)
def test_anything_else_is_not_a_frame(payload: object) -> None:
    with pytest.raises(FrameRejected):
        jpeg_from_b64(payload)
