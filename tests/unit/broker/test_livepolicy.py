"""Live policy's pure core: rule parsing, stable ids, proposals from denials."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.broker.config import RuleConfig
from corral.broker.livepolicy import parse_rule, parse_target, proposals, rule_id
from corral.errors import UsageError


@dataclass(frozen=True)
class Row:
    id: int
    time: str
    kind: str
    target: str
    decision: str
    rule: str | None
    session: str | None = "s1"
    detail: dict[str, Any] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("text", "host", "ports"),
    [
        ("pypi.org", "pypi.org", (80, 443)),
        ("PyPI.org.:443", "pypi.org", (443,)),
        ("*.npmjs.org", "*.npmjs.org", (80, 443)),
        (
            '{"host": "api.github.com", "methods": ["GET"], "ports": [443]}',
            "api.github.com",
            (443,),
        ),
    ],
)
def test_rule_forms(text: str, host: str, ports: tuple[int, ...]) -> None:
    rule = parse_rule(text)
    assert (rule.host, rule.ports, rule.effect) == (host, ports, "allow")
    assert rule.id == f"live:{rule_id(rule)}"
    assert not rule.allow_private


@pytest.mark.parametrize(
    "text",
    ["127.0.0.1:8080", "localhost", "[::1]:5432", "10.0.0.0/8", "169.254.169.254", "fe80::1"],
)
def test_private_rules_need_the_flag(text: str) -> None:
    with pytest.raises(UsageError, match="--allow-private"):
        parse_rule(text)
    assert parse_rule(text, allow_private=True).allow_private


@pytest.mark.parametrize(
    "text",
    ["*", "", "a b", "x:0", "x:65536", '{"host": "x", "effect": "deny"}', "[1", '["x"]', "é.com"],
)
def test_bad_rules_are_one_line_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_rule(text)
    assert "\n" not in str(info.value)


def test_rule_id_ignores_the_rule_id_and_sees_everything_else() -> None:
    a = RuleConfig(host="pypi.org", ports=(443,))
    assert rule_id(a) == rule_id(a.model_copy(update={"id": "other"}))
    assert rule_id(a) != rule_id(RuleConfig(host="pypi.org", ports=(80,)))
    assert rule_id(a) != rule_id(RuleConfig(host="pypi.org", ports=(443,), methods=("GET",)))


def test_targets_parse_strictly() -> None:
    assert parse_target("net_connect", "pypi.org:443") == ("pypi.org", 443)
    assert parse_target("net_connect", "[::1]:8080") == ("::1", 8080)
    assert parse_target("http_request", "GET http://a.test:80/x?y") == ("a.test", 80)
    assert parse_target("http_request", "GET https://a.test:443/") == ("a.test", 443)
    for bad in ("pypi.org", "a.test:0", "a\x1b[2J.test:443", "GET ftp://a:1/", "*.x:443", ""):
        assert parse_target("net_connect", bad) is None
        assert parse_target("http_request", bad) is None
    assert parse_target("mcp_call", "a.test:443") is None


def test_a_proposal_groups_one_destination() -> None:
    rows = [
        Row(1, "t1", "net_connect", "pypi.org:443", "deny", "default-deny"),
        Row(2, "t3", "http_request", "GET http://pypi.org:443/x", "deny", "default-deny", "s2"),
        Row(3, "t2", "net_connect", "pypi.org:443", "allow", "allow:x"),
        Row(4, "t4", "net_connect", "evil.test:443", "deny", "exfiltration"),
        Row(5, "t5", "net_connect", "10.1.2.3:22", "deny", "private-address"),
        Row(6, "t6", "net_connect", "db.internal:5432", "deny", "private-address"),
    ]
    got = {(p.rule.host, p.rule.ports): p for p in proposals(rows)}
    assert set(got) == {("pypi.org", (443,)), ("10.1.2.3", (22,)), ("db.internal", (5432,))}
    pypi = got["pypi.org", (443,)]
    assert (pypi.count, pypi.first_seen, pypi.last_seen) == (2, "t1", "t3")
    assert pypi.sessions == ("s1", "s2") and not pypi.private
    assert got["10.1.2.3", (22,)].private and got["db.internal", (5432,)].private
    # Approving it by hand or by id gives the same rule, so the proposal is done.
    assert pypi.rule == parse_rule("pypi.org:443")
    done = Row(7, "t7", "policy", pypi.rule.id, "observe", None, detail={"rule_hash": pypi.id})
    assert [p.id for p in proposals([*rows, done])] == [
        p.id for p in proposals(rows) if p.id != pypi.id
    ]


_HOSTS = st.sampled_from(["a.test", "b.test", "10.0.0.1", "::1", "x.example", "a\x1b.test"])
_ROWS = st.lists(
    st.tuples(
        st.sampled_from(["net_connect", "http_request", "mcp_call", "policy"]),
        _HOSTS,
        st.sampled_from([443, 80, 8080]),
        st.sampled_from(["deny", "allow", "observe"]),
        st.sampled_from(["default-deny", "private-address", "exfiltration", None]),
        st.sampled_from(["s1", "s2", None]),
    ),
    max_size=40,
)


def _rows(spec: list[tuple[str, str, int, str, str | None, str | None]]) -> list[Row]:
    out = []
    for i, (kind, host, port, decision, rule, session) in enumerate(spec):
        shown = f"[{host}]" if ":" in host else host
        target = f"GET http://{shown}:{port}/p" if kind == "http_request" else f"{shown}:{port}"
        out.append(Row(i + 1, f"2026-12-01T10:{i:02d}", kind, target, decision, rule, session))
    return out


@settings(max_examples=200, deadline=None)
@given(_ROWS, st.randoms(use_true_random=False))
def test_grouping_invariants(spec: Any, rnd: random.Random) -> None:
    rows = _rows(spec)
    got = proposals(rows)
    counted = [
        r
        for r in rows
        if r.decision == "deny"
        and r.kind in ("net_connect", "http_request")
        and r.rule in ("default-deny", "private-address")
        and parse_target(r.kind, r.target) is not None
    ]
    # Every proposable denial is in exactly one proposal; nothing else is.
    assert sum(p.count for p in got) == len(counted)
    assert len({p.id for p in got}) == len(got)
    assert len({(p.rule.host, p.rule.ports) for p in got}) == len(got)
    for p in got:
        assert p.first_seen <= p.last_seen
        assert p.id == rule_id(p.rule) and p.rule.id == f"live:{p.id}"
        assert p.rule.effect == "allow" and len(p.rule.ports) == 1
        assert p.private == p.rule.allow_private
        if p.rule.host in ("10.0.0.1", "::1"):
            assert p.private
    # Grouping does not depend on the order rows are given in.
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    assert {p.to_json_dict()["id"]: p.count for p in proposals(shuffled)} == {
        p.id: p.count for p in got
    }
    # A policy row naming a proposal removes that one and only that one.
    if got:
        applied = Row(999, "z", "policy", "x", "observe", None, detail={"rule_hash": got[0].id})
        assert [p.id for p in proposals([*rows, applied])] == [p.id for p in got[1:]]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["net_connect", "http_request"]), st.text(max_size=200))
def test_hostile_targets_never_raise(kind: str, target: str) -> None:
    dest = parse_target(kind, target)
    if dest is not None:
        host, port = dest
        assert host.isascii() and host.isprintable() and 1 <= port <= 65535
        assert RuleConfig(host=host, ports=(port,)).host == host
