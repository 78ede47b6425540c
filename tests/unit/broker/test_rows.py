"""Journal row shape (pure): what is stored and what `corral log --json` prints."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from corral.broker.actions import (
    FileOp,
    HttpRequest,
    Identity,
    McpCall,
    NetConnect,
    Observation,
    ProcessEvent,
    ProviderCall,
    action_target,
)
from corral.broker.journal import JournalRow, observation_row

KEYS = ["time", "run", "session", "env", "kind", "target", "decision", "rule", "reason", "detail"]


def test_observation_row_columns() -> None:
    obs = Observation(
        time=datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        run="r",
        session="s",
        env="agent",
        kind="net_connect",
        target="pypi.org:443",
        decision="deny",
        rule="default-deny",
        reason="no rule",
        detail={"resolved": ["1.2.3.4"]},
        cause=7,
    )
    assert observation_row(obs) == (
        "2026-01-02T03:04:05.000006+00:00",
        "r",
        "s",
        "agent",
        "net_connect",
        "pypi.org:443",
        "deny",
        "default-deny",
        "no rule",
        0,
        0,
        '{"resolved":["1.2.3.4"]}',
        7,
    )


def test_detail_must_be_json() -> None:
    obs = Observation(
        kind="net_connect", target="x:1", decision="deny", reason="r", detail={"x": {1, 2}}
    )
    with pytest.raises(TypeError):
        observation_row(obs)


def test_json_shape_is_exactly_design_6a() -> None:
    row = JournalRow(
        id=3,
        time="2026-01-02T03:04:05.000006+00:00",
        run=None,
        session=None,
        env="exec",
        kind="http_request",
        target="GET http://a.test:80/",
        decision="allow",
        rule="allow:a.test",
        reason="admitted",
        bytes_up=1,
        bytes_down=2,
        detail={"method": "GET"},
        cause=None,
        outcome={"status": 200, "time": "t"},
    )
    out = row.to_json_dict()
    assert list(out) == KEYS
    assert out["detail"] == {
        "method": "GET",
        "id": 3,
        "bytes_up": 1,
        "bytes_down": 2,
        "outcome": {"status": 200, "time": "t"},
    }
    json.dumps(out)


def test_targets_of_every_kind() -> None:
    assert action_target(NetConnect(host="[::1]", port=443)) == "[::1]:443"
    assert (
        action_target(
            HttpRequest(host="A.test", port=80, method="GET", path="/x", query="q=secret")
        )
        == "GET http://a.test:80/x"
    )
    assert action_target(ProviderCall(route="anthropic", method="POST", path="/v1/messages")) == (
        "anthropic POST /v1/messages"
    )
    assert action_target(McpCall(server="fs", tool="read")) == "fs/read"
    assert action_target(FileOp(op="read", path="/etc/passwd")) == "read /etc/passwd"
    assert action_target(ProcessEvent(event="oom_kill", pid=9, name="cc1")) == "oom_kill pid=9 cc1"


def test_observation_of_copies_identity() -> None:
    obs = Observation.of(
        NetConnect(host="a.test", port=443),
        Identity(run="r", session="s", env="verifier"),
        decision="allow",
        rule="x",
        reason="y",
    )
    assert (obs.run, obs.session, obs.env, obs.kind, obs.target) == (
        "r",
        "s",
        "verifier",
        "net_connect",
        "a.test:443",
    )
    assert obs.time.tzinfo is not None
