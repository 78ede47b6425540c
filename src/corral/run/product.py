"""The product's environment, ports, persistent data directory and restarts.

`[product]` may set `env` (a table added to the product's environment),
`ports` (more ports besides `port`, each forwarded to every check), `data =
true` (a directory that persists across restarts and sessions) and
`data_for_agent = "ro"` (that directory read-only in the agent sandbox too).
A check with `restart_product = true` gets a freshly started product (same
snapshot, same data directory) before it runs.

The data directory is `<run>/data` on the host: beside the workspace, never in
it, so it is never committed nor in a snapshot, and no agent sandbox sees it
unless the mission says so. With `run_disk` it lies on the run's image and is
bounded by it. Everything in it was written by a sandbox: the host never reads
it; it only clears setuid/setgid modes there after each product stop, as it
does for the workspace (M13).

The pure parts (validation, names, environments) are used by `mission.py`
and `environments.py`; `probe_all` and `strip_data_setid` are the thin shells
the coordinator calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.run.environments import RunLayout
    from corral.run.mission import ProductSettings

__all__ = [
    "DATA_ENV",
    "START_ENV",
    "check_env",
    "data_dir",
    "first_port",
    "product_env",
]

DATA_ENV = "CORRAL_DATA"
START_ENV = "CORRAL_PRODUCT_START"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Names corral itself sets for the product; a mission cannot redefine them.
_RESERVED = ("PORT", "PORTS")
_MAX_VALUE = 8192


def first_port(value: object) -> object:
    """`ports = [A, B]` without `port` means `port = A` (a `before` validator)."""
    if isinstance(value, dict) and "port" not in value:
        ports = value.get("ports")
        if isinstance(ports, list | tuple) and ports:
            return {**value, "port": ports[0]}
    return value


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """The `[product] env` table, or ValueError naming the first bad entry."""
    for name, val in env.items():
        if _ENV_NAME.match(name) is None:
            raise ValueError(f"env: {name!r} is not a variable name")
        if name in _RESERVED or name.startswith("CORRAL_"):
            raise ValueError(f"env: {name} is set by corral")
        if "\0" in val or len(val) > _MAX_VALUE:
            raise ValueError(f"env: {name}'s value has a NUL byte or exceeds {_MAX_VALUE} chars")
    return dict(env)


def data_dir(layout: RunLayout) -> Path:
    """The product's persistent data directory (host side, outside the workspace)."""
    return layout.root / "data"


def product_env(
    product: ProductSettings, layout: RunLayout, snapshot: Path, start: int
) -> dict[str, str]:
    """What corral adds to the product's base environment (the mission's `env` first)."""
    env = dict(product.env)
    env.update(
        {
            "PORT": str(product.port),
            "PORTS": " ".join(str(p) for p in product.all_ports),
            "CORRAL_SNAPSHOT": str(snapshot),
            START_ENV: str(start),
        }
    )
    if product.data:
        env[DATA_ENV] = str(data_dir(layout))
    return env
