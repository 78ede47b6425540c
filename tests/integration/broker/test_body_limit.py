"""Request bodies past the broker's limit are refused with 413 and journaled.

The upstream server records what reaches it: an over-limit body never does
(declared length) or never ends (chunked), and the journal says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig, LimitsConfig, RouteConfig

from .conftest import BrokerFactory, ServerFactory
from .testlib import Hit, RunningBroker, curl, header

pytestmark = pytest.mark.requires_curl

LIMIT = 64 * 1024


def _broker(servers: ServerFactory, brokers: BrokerFactory) -> tuple[str, list[Hit], RunningBroker]:
    upstream = servers()
    config = BrokerConfig.model_validate(
        {
            "resolver_overrides": {"api.provider.test": "127.0.0.1"},
            "system_dns": False,
            "routes": {
                "prov": RouteConfig(
                    upstream=f"http://api.provider.test:{upstream.port}", allow_private=True
                )
            },
            "limits": LimitsConfig(max_body_bytes=LIMIT),
        }
    )
    broker = brokers(config)
    return f"http://127.0.0.1:{broker.port}/routes/prov/v1/messages", upstream.hits, broker


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_over_limit_body_is_refused_413_and_journaled(
    servers: ServerFactory, brokers: BrokerFactory, tmp_path: Path, chunked: bool
) -> None:
    url, hits, broker = _broker(servers, brokers)
    body = tmp_path / "bomb.json"
    body.write_bytes(b"[" + b"{}," * LIMIT + b"{}]")
    extra = ["-H", "Transfer-Encoding: chunked"] if chunked else []
    out = curl("-i", "-X", "POST", *extra, "--data-binary", f"@{body}", url)
    assert "413" in out.stdout.splitlines()[0], out.stdout[:300] + out.stderr
    assert header(out.stdout, "X-Corral-Denied") == "body-limit"
    rows = broker.wait_rows(
        lambda rs: any(r.rule == "body-limit" or (r.outcome or {}).get("rule") for r in rs)
    )
    [row] = [r for r in rows if r.kind == "provider_call"]
    if chunked:
        # Admitted on its head, cut off where the count passed the limit.
        assert row.outcome is not None
        assert row.outcome["rule"] == "body-limit"
        assert LIMIT < row.bytes_up <= 2 * LIMIT
        assert all(len(h.body) <= 2 * LIMIT for h in hits)
    else:
        assert (row.decision, row.rule) == ("deny", "body-limit")
        assert hits == []


def test_body_within_limit_passes(servers: ServerFactory, brokers: BrokerFactory) -> None:
    url, hits, _ = _broker(servers, brokers)
    out = curl("-i", "-X", "POST", "--data-binary", "[" + "1," * 1000 + "1]", url)
    assert "200" in out.stdout.splitlines()[0], out.stdout[:300]
    assert len(hits) == 1
