"""`corral dashboard`: a loopback web page over the runs of a runs directory.

The public surface the viewer builds on: `create_app(runs_dir, token,
extensions=...)` and, for a request handled outside the app's middleware,
`check_request(request, auth)` with the app's `AUTH_KEY`. Imports of aiohttp
and Jinja2 happen only when these are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.dashboard.security import AUTH_KEY, Auth, check_request, own_origin
    from corral.dashboard.server import VIEWER_ROUTE, create_app

__all__ = ["AUTH_KEY", "VIEWER_ROUTE", "Auth", "check_request", "create_app", "own_origin"]


def __getattr__(name: str) -> Any:
    if name in ("AUTH_KEY", "Auth", "check_request", "own_origin"):
        from corral.dashboard import security

        return getattr(security, name)
    if name in ("VIEWER_ROUTE", "create_app"):
        from corral.dashboard import server

        return getattr(server, name)
    raise AttributeError(name)
