"""`check_request`: the dashboard's admission decision, without a server."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from corral.dashboard.security import COOKIE, Auth, check_request

AUTH = Auth(token="T" * 43, csrf="C" * 43)
PORT = 8765
ORIGIN = f"http://127.0.0.1:{PORT}"


def _req(method: str = "GET", path: str = "/", **headers: str) -> object:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        ("127.0.0.1", PORT) if name == "sockname" else default
    )
    hdrs = {"Host": f"127.0.0.1:{PORT}", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return make_mocked_request(method, path, headers=hdrs, transport=transport)


CK = f"{COOKIE}={AUTH.token}"


@pytest.mark.parametrize(
    ("method", "path", "headers", "csrf", "refused"),
    [
        ("GET", "/", {}, None, "no valid token"),
        ("GET", "/", {"Cookie": f"{COOKIE}={'T' * 42}x"}, None, "no valid token"),
        ("GET", f"/?token={AUTH.token}", {}, None, None),
        ("GET", "/", {"Cookie": CK}, None, None),
        ("GET", "/", {"Cookie": CK, "Host": f"rebind.example:{PORT}"}, None, "wrong Host"),
        ("GET", "/", {"Cookie": CK, "Host": "127.0.0.1:1"}, None, "wrong Host"),
        ("GET", "/", {"Cookie": CK, "Host": f"localhost:{PORT}"}, None, None),
        ("GET", "/", {"Cookie": CK, "Upgrade": "websocket"}, None, "cross-origin request"),
        (
            "GET",
            "/",
            {"Cookie": CK, "Upgrade": "WebSocket", "Origin": "http://evil"},
            None,
            "cross-origin request",
        ),
        ("GET", "/", {"Cookie": CK, "Upgrade": "websocket", "Origin": ORIGIN}, None, None),
        ("POST", "/run/r/stop", {"Cookie": CK}, AUTH.csrf, "cross-origin request"),
        (
            "POST",
            "/run/r/stop",
            {"Cookie": CK, "Origin": "null"},
            AUTH.csrf,
            "cross-origin request",
        ),
        (
            "POST",
            "/run/r/stop",
            {"Cookie": CK, "Origin": ORIGIN},
            None,
            "missing or wrong CSRF token",
        ),
        (
            "POST",
            "/run/r/stop",
            {"Cookie": CK, "Origin": ORIGIN},
            AUTH.token,
            "missing or wrong CSRF token",
        ),
        ("POST", "/run/r/stop", {"Cookie": CK, "Origin": ORIGIN}, AUTH.csrf, None),
        ("POST", "/run/r/stop", {"Origin": ORIGIN}, AUTH.csrf, "no valid token"),
    ],
)
def test_check_request(
    method: str, path: str, headers: dict[str, str], csrf: str | None, refused: str | None
) -> None:
    assert check_request(_req(method, path, **headers), AUTH, csrf=csrf) == refused  # type: ignore[arg-type]
