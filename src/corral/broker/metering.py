"""Token accounting on provider routes, where the agent cannot reach it (pure).

The broker sees every provider response of a session, so the tokens a
session spent are counted here, from the responses themselves, never from
what the agent CLI prints (the agent writes its own output and can forge it):

- `ResponseMeter` reads one response incrementally, as the broker relays it:
  Anthropic Messages (`usage`, and in a stream `message_start` /
  `message_delta`), OpenAI Responses (`response.completed` et al.), Chat
  Completions (`usage`) and Gemini (`usageMetadata`). Streams are parsed line
  by line with a line cap, whole JSON bodies up to a size cap: a hostile or
  huge body costs bounded memory. Every usage object seen in one response
  counts with the largest value of each field (the providers' stream counters
  are cumulative).
- `SessionBudget` adds up what the route's responses used and refuses the
  next request once the budget is spent. A response that cannot be counted
  (an encoding the broker did not ask for, a body over the cap, a successful
  reply without usage) closes the budget: fail closed.

The response that crosses the budget is delivered - its tokens are already
spent upstream, and a stream's final usage only arrives after its content -
so with a budget the route serves one request at a time (`SessionBudget.lock`)
and a session overshoots by at most that one response.

`journal_usage` reads the counts back from the journal for the coordinator.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.usage import TokenUsage, token_count

__all__ = [
    "BUDGET_RULE",
    "JSON_BODY_LIMIT",
    "LINE_LIMIT",
    "Metered",
    "ResponseMeter",
    "SessionBudget",
    "TokenUsage",
    "journal_usage",
    "usage_of",
]

BUDGET_RULE = "token-budget"
LINE_LIMIT = 1 << 20
"""Longest stream line parsed; longer lines are skipped (and counted)."""
JSON_BODY_LIMIT = 8 << 20
"""Largest non-stream body parsed; a larger one cannot be counted."""


def _usage_fields(u: Mapping[str, Any]) -> TokenUsage | None:
    if "promptTokenCount" in u or "candidatesTokenCount" in u:  # Gemini
        return TokenUsage(
            token_count(u.get("promptTokenCount")),
            token_count(u.get("candidatesTokenCount")) + token_count(u.get("thoughtsTokenCount")),
            token_count(u.get("cachedContentTokenCount")),
        )
    if "prompt_tokens" in u or "completion_tokens" in u:  # Chat Completions
        details = u.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
        return TokenUsage(
            token_count(u.get("prompt_tokens")),
            token_count(u.get("completion_tokens")),
            token_count(cached),
        )
    if "input_tokens" in u or "output_tokens" in u:  # Anthropic, OpenAI Responses
        details = u.get("input_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
        return TokenUsage(
            token_count(u.get("input_tokens")),
            token_count(u.get("output_tokens")),
            token_count(u.get("cache_read_input_tokens")) + token_count(cached),
            token_count(u.get("cache_creation_input_tokens")),
        )
    return None


def usage_of(obj: object) -> TokenUsage | None:
    """The usage one JSON value of a provider response carries, if any."""
    if not isinstance(obj, Mapping):
        return None
    found: list[TokenUsage] = []
    for holder in (obj, obj.get("message"), obj.get("response")):
        if not isinstance(holder, Mapping):
            continue
        for key in ("usage", "usageMetadata"):
            u = holder.get(key)
            if isinstance(u, Mapping) and (parsed := _usage_fields(u)) is not None:
                found.append(parsed)
    if not found:
        return None
    out = found[0]
    for u in found[1:]:
        out = out.maximum(u)
    return out


@dataclass(frozen=True, slots=True)
class Metered:
    """What one response used; `error` says why it could not be counted."""

    usage: TokenUsage
    found: bool
    error: str | None = None
    skipped_lines: int = 0


def _exempt(method: str, path: str) -> bool:
    # Only a POST generates tokens; counting endpoints are not billed.
    return method != "POST" or path.rstrip("/").lower().endswith(("count_tokens", ":counttokens"))


@dataclass(slots=True)
class ResponseMeter:
    """Counts one response while it is relayed: `start`, `feed`..., `result`."""

    method: str
    path: str
    status: int | None = None
    _stream: bool = False
    _error: str | None = None
    _buf: bytearray = field(default_factory=bytearray)
    _skipping: bool = False
    _skipped: int = 0
    _usage: TokenUsage | None = None

    def start(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        self.status = status
        ctype = b""
        for name, value in headers:
            lname = name.lower()
            if lname == b"content-type":
                ctype = value.lower()
            elif lname == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                # The broker asked for identity; it cannot read anything else.
                self._error = f"response encoded as {value.decode('latin-1')[:40]!r}"
        self._stream = ctype.startswith(b"text/event-stream") or b"ndjson" in ctype

    def feed(self, data: bytes) -> None:
        if self._error is not None or not data:
            return
        if not self._stream:
            if len(self._buf) + len(data) > JSON_BODY_LIMIT:
                self._error = f"response body over {JSON_BODY_LIMIT} bytes"
                self._buf = bytearray()
                return
            self._buf += data
            return
        start = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            end = len(data) if nl < 0 else nl
            if self._skipping:
                if nl >= 0:
                    self._skipping = False
            elif len(self._buf) + end - start > LINE_LIMIT:
                self._buf = bytearray()
                self._skipped += 1
                self._skipping = nl < 0
            else:
                self._buf += data[start:end]
                if nl >= 0:
                    self._line(bytes(self._buf))
                    self._buf = bytearray()
            if nl < 0:
                break
            start = nl + 1

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{") or b"sage" not in line:
            return
        self._take(line)

    def _take(self, raw: bytes) -> None:
        try:
            obj = json.loads(raw)
        except ValueError:
            return
        values: Iterable[object] = obj if isinstance(obj, list) else (obj,)
        for value in values:
            u = usage_of(value)
            if u is not None:
                self._usage = u if self._usage is None else self._usage.maximum(u)

    def result(self) -> Metered:
        """The count, once the response ended (or was cut: what was seen counts)."""
        if self._stream:
            if self._buf and not self._skipping:
                self._line(bytes(self._buf))
        elif self._error is None and self._buf:
            self._take(bytes(self._buf))
        self._buf = bytearray()
        usage = self._usage or TokenUsage()
        found = self._usage is not None
        error = self._error
        ok_status = self.status is not None and 200 <= self.status < 300
        if error is None and not found and ok_status and not _exempt(self.method, self.path):
            error = "a successful provider response reported no usage"
        return Metered(usage, found, error, self._skipped)


@dataclass(slots=True)
class SessionBudget:
    """What a route's responses used in this broker's session, and its budget."""

    budget: int | None
    spent: TokenUsage = field(default_factory=TokenUsage)
    closed: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def serialised(self) -> bool:
        """Whether requests go one at a time (only when there is a budget to keep)."""
        return self.budget is not None

    def refusal(self) -> str | None:
        """Why the next request is refused, or None (pure)."""
        if self.budget is None:
            return None
        if self.closed is not None:
            return f"token budget closed: {self.closed}"
        if self.spent.total >= self.budget:
            return f"token budget spent ({self.spent.total}/{self.budget} tokens)"
        return None

    def add(self, metered: Metered) -> None:
        self.spent = self.spent + metered.usage
        if metered.error is not None and self.closed is None:
            self.closed = metered.error


def journal_usage(journal: Path, run: str | None, session: str) -> tuple[TokenUsage, int]:
    """The tokens a session's broker counted, and how many requests it refused for budget.

    Read from the journal's provider-call outcomes (written by the broker on
    the host side, out of the sandbox's reach). `run` None: of any run (a
    `corral exec` without `--run` names its own).
    """
    conn = sqlite3.connect(f"{journal.absolute().as_uri()}?mode=ro", uri=True)
    where = "b.kind = 'provider_call' AND b.session = ? AND (? IS NULL OR b.run = ?)"
    args = (session, run, run)
    try:
        rows = conn.execute(
            "SELECT o.detail FROM observations AS b JOIN outcomes AS o ON o.observation = b.id"
            f" WHERE {where}",
            args,
        ).fetchall()
        refused = conn.execute(
            f"SELECT COUNT(*) FROM observations AS b WHERE {where}"
            " AND b.decision = 'deny' AND b.rule = ?",
            (*args, BUDGET_RULE),
        ).fetchone()[0]
    finally:
        conn.close()
    total = TokenUsage()
    for (detail,) in rows:
        try:
            d = json.loads(detail)
        except ValueError:
            continue
        u = d.get("usage") if isinstance(d, dict) else None
        if isinstance(u, dict):
            total = total + TokenUsage.from_json_dict(u)
    return total, int(refused)
