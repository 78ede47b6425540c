"""The environment that points a sandbox's clients at its broker (pure).

Kept apart from `process.py` (which starts processes) and `attach.py` (which
starts the broker on a sandbox's loopback) so that pure planners such as
`run/environments.py` can build a sandbox's environment without importing I/O.
"""

from __future__ import annotations

from corral.sandbox.spec import SANDBOX_PROXY_PORT

__all__ = ["PROXY_VARIABLES", "SANDBOX_PROXY_PORT", "proxy_env", "sandbox_proxy_env"]

PROXY_VARIABLES: tuple[str, ...] = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "npm_config_proxy",
    "npm_config_https_proxy",
    "YARN_HTTP_PROXY",
    "YARN_HTTPS_PROXY",
)


def proxy_env(port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """Environment variables that send a sandbox's HTTP(S) clients to the broker.

    Upper- and lower-case forms (curl reads only `http_proxy` for http://),
    `ALL_PROXY` for clients that use it, npm's and yarn's own settings, and
    `NODE_USE_ENV_PROXY=1` for Node's built-in fetch (Node >= 24 honours it).
    `NO_PROXY` names only the sandbox's *own* loopback, which is not the
    host's: traffic there never leaves the sandbox, and the broker's routes
    (`http://127.0.0.1:PORT/routes/...`) are reached directly.
    """
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    env = dict.fromkeys(PROXY_VARIABLES, url)
    no_proxy = "localhost,127.0.0.1,::1"
    env.update(
        {
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
            "npm_config_noproxy": no_proxy,
            "NODE_USE_ENV_PROXY": "1",
        }
    )
    return env


def sandbox_proxy_env() -> dict[str, str]:
    """Variables that point the sandbox's clients at the broker on its own loopback."""
    env = proxy_env(SANDBOX_PROXY_PORT)
    env["CORRAL_BROKER_URL"] = f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"
    return env
