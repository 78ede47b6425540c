"""What the user's page may send the viewer, validated (pure).

Every client message is one JSON object with a `kind`; anything else, or a
value out of its range, is refused (`InputRejected`) and never reaches
Chromium. The product's origin is the only place `go` may lead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from corral.errors import CorralError

__all__ = [
    "MAX_H",
    "MAX_W",
    "InputEvent",
    "InputRejected",
    "Key",
    "Mouse",
    "Nav",
    "Resize",
    "Text",
    "Wheel",
    "clean_text",
    "parse_input",
]

MAX_W, MAX_H = 2560, 1600
_MAX_MSG = 4096
_BUTTONS = ("none", "left", "middle", "right")
_MOUSE = ("mousePressed", "mouseReleased", "mouseMoved")


class InputRejected(CorralError, ValueError):
    """A client message that is not a valid input event."""


@dataclass(frozen=True, slots=True)
class Mouse:
    type: Literal["mousePressed", "mouseReleased", "mouseMoved"]
    x: int
    y: int
    button: Literal["none", "left", "middle", "right"]
    click_count: int
    kind: Literal["mouse"] = "mouse"


@dataclass(frozen=True, slots=True)
class Wheel:
    x: int
    y: int
    dx: int
    dy: int
    kind: Literal["wheel"] = "wheel"


@dataclass(frozen=True, slots=True)
class Key:
    type: Literal["keyDown", "keyUp"]
    key: str
    code: str
    kind: Literal["key"] = "key"


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class Resize:
    width: int
    height: int
    kind: Literal["resize"] = "resize"


@dataclass(frozen=True, slots=True)
class Nav:
    action: Literal["back", "forward", "reload", "go"]
    path: str = "/"
    kind: Literal["nav"] = "nav"


InputEvent = Mouse | Wheel | Key | Text | Resize | Nav


def _int(obj: dict[str, object], name: str, lo: int, hi: int) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise InputRejected(f"{name} must be a number in [{lo}, {hi}]")
    return int(v)


def _str(obj: dict[str, object], name: str, max_len: int) -> str:
    v = obj.get(name, "")
    if not isinstance(v, str) or len(v) > max_len:
        raise InputRejected(f"{name} must be text of at most {max_len} characters")
    return v


def clean_text(text: str, max_len: int) -> str:
    """`text` without control characters (tab and newline kept), cut to `max_len`."""
    out = "".join(c if c in "\t\n" or (c >= " " and c != "\x7f") else "\ufffd" for c in text)
    return out[:max_len]


def parse_input(raw: str | bytes, width: int = MAX_W, height: int = MAX_H) -> InputEvent:
    """One client message -> an input event, or InputRejected."""
    if len(raw) > _MAX_MSG:
        raise InputRejected("message too long")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise InputRejected("not JSON") from exc
    if not isinstance(obj, dict):
        raise InputRejected("not an object")
    kind = obj.get("kind")
    match kind:
        case "mouse":
            t = obj.get("type")
            b = obj.get("button", "none")
            if t not in _MOUSE or b not in _BUTTONS:
                raise InputRejected("bad mouse event")
            return Mouse(
                t,
                _int(obj, "x", 0, width),
                _int(obj, "y", 0, height),
                b,
                _int(obj, "clickCount", 0, 3) if "clickCount" in obj else 0,
            )
        case "wheel":
            return Wheel(
                _int(obj, "x", 0, width),
                _int(obj, "y", 0, height),
                _int(obj, "dx", -5000, 5000),
                _int(obj, "dy", -5000, 5000),
            )
        case "key":
            t = obj.get("type")
            if t not in ("keyDown", "keyUp"):
                raise InputRejected("bad key event")
            key, code = _str(obj, "key", 32), _str(obj, "code", 32)
            if clean_text(key, 32) != key or clean_text(code, 32) != code:
                raise InputRejected("control characters in a key name")
            return Key(t, key, code)
        case "text":
            text = _str(obj, "text", 1000)
            if not text or clean_text(text, 1000) != text:
                raise InputRejected("text must be non-empty printable text")
            return Text(text)
        case "resize":
            return Resize(_int(obj, "width", 200, MAX_W), _int(obj, "height", 150, MAX_H))
        case "nav":
            action = obj.get("action")
            if action not in ("back", "forward", "reload", "go"):
                raise InputRejected("bad navigation")
            path = _str(obj, "path", 2000) if action == "go" else "/"
            if not path.startswith("/") or path.startswith("//") or clean_text(path, 2000) != path:
                raise InputRejected("the address must be a path on the product (/...)")
            if any(c in path for c in " \\\t\n"):
                raise InputRejected("the address must be a path on the product (/...)")
            return Nav(action, path)
        case _:
            raise InputRejected("unknown kind")
