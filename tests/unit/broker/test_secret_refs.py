"""Route and credential secrets are read by one helper with one set of refusals."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig, CredentialConfig, RouteConfig
from corral.broker.server import load_credentials, load_route_secrets
from corral.errors import ConfigError


def _route(ref: str) -> BrokerConfig:
    return BrokerConfig(
        routes={"llm": RouteConfig(upstream="https://api.test/", inject_header={"X-Key": ref})}
    )


def _cred(ref: str) -> BrokerConfig:
    cred = CredentialConfig(
        name="gh",
        env="GH",
        value=ref,
        hosts=("api.test",),
        placeholder="corral-placeholder-" + "0" * 32,
    )
    return BrokerConfig(credentials=(cred,))


Loader = Callable[[BrokerConfig, Mapping[str, str]], object]


@pytest.mark.parametrize(
    ("load", "make", "who"),
    [(load_route_secrets, _route, "route llm"), (load_credentials, _cred, "credential gh")],
    ids=["route", "credential"],
)
def test_unusable_values_are_refused(
    load: Loader, make: Callable[[str], BrokerConfig], who: str, tmp_path: Path
) -> None:
    # A NUL in the injected header value would end it early at some upstreams.
    secret = tmp_path / "s"
    secret.write_bytes(b"v\0X-Evil: 1\n")
    with pytest.raises(ConfigError, match=f"^{who}: .*not a header value"):
        load(make(f"file:{secret}"), {})
    with pytest.raises(ConfigError, match=f"^{who}: \\$NOPE is not set"):
        load(make("env:NOPE"), {})
    with pytest.raises(ConfigError, match=f"^{who}: cannot read"):
        load(make(f"file:{tmp_path / 'missing'}"), {})


def test_good_values_are_read() -> None:
    secrets = load_route_secrets(_route("env:K"), {"K": "sekrit"})
    assert (b"x-key", b"sekrit") in secrets["llm"].inject
    assert load_credentials(_cred("env:K"), {"K": "tok"}) is not None
