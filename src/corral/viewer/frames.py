"""Checks on what the viewer's Chromium sends before corral forwards it (pure)."""

from __future__ import annotations

import base64
import binascii

from corral.errors import CorralError

__all__ = ["MAX_FRAME", "FrameRejected", "jpeg_from_b64"]

#: The largest JPEG frame forwarded to the user's page.
MAX_FRAME = 4 * 1024 * 1024


class FrameRejected(CorralError, ValueError):
    """Data from the viewer's browser that is not a JPEG image within bounds."""


def jpeg_from_b64(data: object) -> bytes:
    """Decode a screencast/screenshot payload; only a bounded JPEG passes.

    The payload comes from a browser the product's script ran in: it is
    checked for JPEG's start-of-image marker followed by a marker segment and
    its end-of-image marker, so no other type of product byte ever reaches the
    user's browser as a "frame".
    """
    if not isinstance(data, str) or len(data) > (MAX_FRAME * 4) // 3 + 4:
        raise FrameRejected("frame payload missing or too large")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FrameRejected("frame payload is not base64") from exc
    if len(raw) > MAX_FRAME or len(raw) < 128:
        raise FrameRejected("frame size out of bounds")
    if raw[:3] != b"\xff\xd8\xff" or raw[3] < 0xC0 or raw[-2:] != b"\xff\xd9":
        raise FrameRejected("frame is not a JPEG image")
    return raw
