"""Live policy, the pure part: rules typed by a person, proposals from denials.

* `parse_rule(text, allow_private=False)` reads `corral allow`'s argument:
  `HOST`, `HOST:PORT`, `[V6]:PORT`, `*.suffix[:PORT]`, or a rule object in
  JSON (`{"host": ..., "ports": [...], "methods": [...]}`, the fields of
  `RuleConfig`). A rule that would admit loopback, private or link-local
  destinations is refused unless `allow_private` is given.
* `rule_id(rule)` is a stable hash of what a rule admits (not of its `id`):
  the id of the proposal that produces it, and the id `corral approve` takes.
* `proposals(rows)` groups a journal's denials into proposed rules.

Every value here came from a journal the sandbox filled: targets are parsed
strictly (a row that does not parse proposes nothing) and shown only through
`corral.display`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from corral.broker.config import RuleConfig, split_hostport
from corral.broker.hosts import canonical_host
from corral.errors import UsageError

__all__ = [
    "PROPOSABLE_RULES",
    "Proposal",
    "is_private_host",
    "parse_rule",
    "parse_target",
    "proposals",
    "rule_id",
]

#: Denials a rule could lift: no rule matched, or only a private address did.
#: Every other denial (exfiltration, SNI mismatch, a deny rule, malformed
#: requests, budgets) is not a missing rule and proposes nothing.
PROPOSABLE_RULES = frozenset({"default-deny", "private-address"})

_PROPOSABLE_KINDS = frozenset({"net_connect", "http_request"})
_MAX_TARGET = 2048


def is_private_host(host: str) -> bool:
    """Whether a canonical rule host names loopback/private/link-local space (or localhost)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        net = ipaddress.ip_network(host, strict=False)
    except ValueError:
        return False
    return not net.is_global or net.is_multicast or net.is_unspecified


def _refuse_private(rule: RuleConfig, allow_private: bool) -> RuleConfig:
    private = is_private_host(rule.host)
    if (private or rule.allow_private) and not allow_private:
        raise UsageError(
            f"rule for {rule.host} would allow private or loopback addresses; "
            "pass --allow-private if that is meant (host services: see docs/broker.md)"
        )
    if private and not rule.allow_private:
        return rule.model_copy(update={"allow_private": True})
    return rule


def parse_rule(text: str, *, allow_private: bool = False) -> RuleConfig:
    """The allow rule `text` names; UsageError (one line) when it is not one."""
    raw = text.strip()
    try:
        if raw.startswith("{"):
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("a rule object is a JSON object")
            data.setdefault("effect", "allow")
            rule = RuleConfig.model_validate(data)
        else:
            host, ports = split_hostport(raw)
            rule = RuleConfig(host=host, ports=ports)
    except ValueError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"not a rule: {first}") from exc
    if rule.effect != "allow":
        raise UsageError("live rules only allow; deny rules belong in the run's configuration")
    if not rule.id.startswith("live:"):
        rule = rule.model_copy(update={"id": f"live:{rule_id(rule)}"})
    return _refuse_private(rule, allow_private)


def rule_id(rule: RuleConfig) -> str:
    """A stable short hash of what `rule` admits (its `id` is not part of it)."""
    body = rule.model_dump(mode="json", exclude={"id"})
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_target(kind: str, target: str) -> tuple[str, int] | None:
    """(host, port) of a journaled net_connect/http_request target, or None."""
    if len(target) > _MAX_TARGET:
        return None
    if kind == "http_request":
        _, sep, rest = target.partition(" ")
        scheme, sep2, rest = rest.partition("://")
        if not sep or not sep2 or scheme not in ("http", "https"):
            return None
        authority = rest.split("/", 1)[0]
    elif kind == "net_connect":
        authority = target
    else:
        return None
    try:
        if authority.startswith("["):
            inner, sep, rest = authority[1:].partition("]")
            if not sep or not rest.startswith(":"):
                return None
            host, port_text = inner, rest[1:]
        else:
            host, sep, port_text = authority.rpartition(":")
            if not sep:
                return None
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            return None
        canon = canonical_host(host)
    except ValueError:
        return None
    if canon != host.lower() or "*" in canon:
        return None
    return canon, int(port_text)


class _Row(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def time(self) -> str: ...
    @property
    def session(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def decision(self) -> str: ...
    @property
    def rule(self) -> str | None: ...
    @property
    def detail(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Proposal:
    """Denials of one destination, as the rule that would have admitted them."""

    id: str
    rule: RuleConfig
    count: int
    first_seen: str
    last_seen: str
    private: bool
    """Admitting it needs `--allow-private` (loopback, private or link-local)."""
    sessions: tuple[str, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule.model_dump(mode="json"),
            "count": self.count,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "private": self.private,
            "sessions": list(self.sessions),
        }


def _applied(rows: Iterable[_Row]) -> set[str]:
    out: set[str] = set()
    for row in rows:
        if row.kind == "policy" and row.decision == "observe":
            rid = row.detail.get("rule_hash")
            if isinstance(rid, str):
                out.add(rid)
    return out


def proposals(rows: Iterable[_Row]) -> list[Proposal]:
    """Proposed rules from journal rows (pure; the rows in journal order).

    One proposal per (host, port) denied with a proposable rule, with the
    count and first/last time of those denials; a proposal whose rule was
    already added (a `policy` row naming its hash) is left out. Ordered by
    count, most first, then by id.
    """
    listed = list(rows)
    done = _applied(listed)
    groups: dict[tuple[str, int], list[_Row]] = {}
    private_seen: set[tuple[str, int]] = set()
    for row in listed:
        if row.decision != "deny" or row.kind not in _PROPOSABLE_KINDS:
            continue
        if row.rule not in PROPOSABLE_RULES:
            continue
        dest = parse_target(row.kind, row.target)
        if dest is None:
            continue
        groups.setdefault(dest, []).append(row)
        if row.rule == "private-address":
            private_seen.add(dest)
    out: list[Proposal] = []
    for (host, port), members in groups.items():
        private = is_private_host(host) or (host, port) in private_seen
        rule = RuleConfig(host=host, ports=(port,), allow_private=private)
        rid = rule_id(rule)
        if rid in done:
            continue
        rule = rule.model_copy(update={"id": f"live:{rid}"})
        times = sorted(m.time for m in members)
        sess = sorted({m.session for m in members if m.session})
        out.append(
            Proposal(
                id=rid,
                rule=rule,
                count=len(members),
                first_seen=times[0],
                last_seen=times[-1],
                private=private,
                sessions=tuple(sess),
            )
        )
    out.sort(key=lambda p: (-p.count, p.id))
    return out
