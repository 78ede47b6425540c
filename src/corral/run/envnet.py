"""Egress and secrets of the product and verifier environments (pure).

`[network.product] allow` / `[network.verifier] allow` are that
environment's allowlist (the agent's stays `[network] allow`); a
`[secrets.NAME]` table is a broker route for the environments named in its
`for`: the sandbox is given `CORRAL_SECRET_<NAME>_URL`, the route on its
own loopback, and the broker adds the secret (`value = "env:X"` from
corral's environment or `"file:/path"`, first line) as the `header` of
every request it forwards to `upstream`. The value is read by the broker,
on the host, when a request needs it: it is never in the sandbox, the
snapshot, the workspace or the run directory. Every request of these
environments is journaled as the agent's are, under env `product` or
`verifier`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.broker.config import (
    BrokerConfig,
    HostServiceConfig,
    RouteConfig,
    check_allow_list,
    parse_secret_ref,
)
from corral.broker.proxy_env import sandbox_proxy_env
from corral.broker.tcp import sandbox_env_for
from corral.sandbox.spec import SANDBOX_PROXY_PORT, NetworkSpec

__all__ = ["EnvNetwork", "SecretSettings", "env_network", "missing_secrets", "secret_variable"]

_FROZEN = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
_SECRET_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
_IP = re.compile(r"^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:]+\])$")

ProductOrVerifier = Literal["product", "verifier"]


class EnvNetwork(BaseModel):
    """`[network.product]` / `[network.verifier]`: that environment's allowlist
    and the host services (`[[network.product.host_services]]`) it may reach."""

    model_config = _FROZEN

    allow: tuple[str, ...] = ()
    host_services: tuple[HostServiceConfig, ...] = ()

    @field_validator("allow")
    @classmethod
    def _allow(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_allow_list(value)


class SecretSettings(BaseModel):
    """`[secrets.NAME]`: a secret the broker adds to requests to `upstream`."""

    model_config = _FROZEN

    value: str
    upstream: str
    header: str = "authorization"
    for_: tuple[ProductOrVerifier, ...] = Field(alias="for", min_length=1)

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        parse_secret_ref(value)
        return value

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        RouteConfig(upstream=value)
        return value

    @field_validator("header")
    @classmethod
    def _header(cls, value: str) -> str:
        if _HEADER.match(value) is None:
            raise ValueError(f"{value!r} is not a header name")
        return value

    def route(self) -> RouteConfig:
        host = urlsplit(self.upstream).hostname or ""
        # An IP literal is an explicit destination and so may be private
        # (a loopback test server); a name never may (BrokerConfig's rule).
        explicit = _IP.match(host) is not None or _IP.match(f"[{host}]") is not None
        return RouteConfig(
            upstream=self.upstream,
            inject_header={self.header: self.value},
            allow_private=explicit,
        )


def check_secret_names(secrets: dict[str, SecretSettings]) -> dict[str, SecretSettings]:
    for name in secrets:
        if _SECRET_NAME.match(name) is None:
            raise ValueError(f"secret name {name!r} is lowercase letters, digits and '_'")
    return secrets


def secret_variable(name: str) -> str:
    """The variable holding secret `name`'s route URL in the sandbox."""
    return f"CORRAL_SECRET_{name.upper()}_URL"


def env_network(
    allow: tuple[str, ...],
    secrets: dict[str, SecretSettings],
    env: ProductOrVerifier,
    host_services: tuple[HostServiceConfig, ...] = (),
) -> tuple[NetworkSpec, dict[str, str]]:
    """The environment's NetworkSpec and the variables that go with it.

    No allowlist, no host service and no secret for `env`: no egress at all, no broker.
    """
    mine = {name: s for name, s in secrets.items() if env in s.for_}
    if not allow and not mine and not host_services:
        return NetworkSpec(), {}
    base = BrokerConfig.from_allow_flags(allow)
    config = base.model_copy(
        update={
            "routes": {n: s.route() for n, s in mine.items()},
            "host_services": host_services,
        }
    )
    variables = {**sandbox_proxy_env(), **sandbox_env_for(config, SANDBOX_PROXY_PORT)}
    broker_url = variables["CORRAL_BROKER_URL"]
    for name in mine:
        variables[secret_variable(name)] = f"{broker_url}/routes/{name}"
    return NetworkSpec(allow=allow, broker_config=config.to_json()), variables


def missing_secrets(secrets: dict[str, SecretSettings], environ: Mapping[str, str]) -> list[str]:
    """One line per secret whose source is not there (checked before a run exists)."""
    out: list[str] = []
    for name, secret in secrets.items():
        source, where = parse_secret_ref(secret.value)
        if source == "env" and not environ.get(where):
            out.append(f"secret {name}: ${where} is not set in corral's environment")
        elif source == "file" and not os.access(where, os.R_OK):
            out.append(f"secret {name}: {where} cannot be read")
    return out
