"""Credential placeholders: swap on the way to a bound host, scrub on the way back (pure).

The sandbox holds `corral-placeholder-<32 hex>` in a variable; the real value
stays in the broker. On a request to one of a credential's `hosts` the
placeholder is replaced by the value in every header - also inside
`Authorization: Basic` (base64 `user:password`, as git sends it) - and in
the body when the credential has `in_body`. A placeholder in any part of a
request to a host it is not bound to is an exfiltration attempt: the caller
refuses the request. Responses from a bound host get the real value replaced
by the placeholder (`Scrubber`, streaming), so it never reaches the sandbox.

What is swapped: the placeholder's exact bytes, and its exact bytes inside a
Basic credential. What is refused (`encoded_leak`, towards a host the
credential is not bound to): the placeholder also re-encoded - its hex
(either case), its base64 or base64url at any alignment, and any of these
percent-encoded. Compression, encryption or a split across requests are not
recognised: nothing a proxy can see would catch them.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PLACEHOLDER_PREFIX",
    "Credential",
    "Credentials",
    "Scrub",
    "Scrubber",
    "Swapped",
    "new_placeholder",
]

PLACEHOLDER_PREFIX = b"corral-placeholder-"
_ANY_PLACEHOLDER = re.compile(rb"corral-placeholder-[0-9a-f]{32}")

Header = tuple[bytes, bytes]


def new_placeholder(random: bytes) -> str:
    """The placeholder for 16 random bytes."""
    if len(random) != 16:
        raise ValueError("a placeholder takes 16 random bytes")
    return (PLACEHOLDER_PREFIX + random.hex().encode()).decode()


@dataclass(frozen=True, slots=True)
class Credential:
    """One credential as the broker holds it (`value` never leaves the broker)."""

    name: str
    placeholder: bytes
    value: bytes
    hosts: frozenset[str]
    in_body: bool = False


@dataclass(frozen=True, slots=True)
class Swapped:
    """The outcome of a swap: new data, which credentials went in, and any leak."""

    data: list[Header]
    used: tuple[str, ...]
    leaked: str | None
    reverse: tuple[tuple[bytes, bytes], ...] = ()
    """(what was sent, what the client had sent) for encodings built here (Basic)."""


class Credentials:
    """The run's credentials, looked up by placeholder."""

    def __init__(self, items: Sequence[Credential]) -> None:
        self.items = tuple(items)
        self._by_placeholder: Mapping[bytes, Credential] = {c.placeholder: c for c in items}
        self.hosts = frozenset(h for c in items for h in c.hosts)
        self._forms = tuple((c, *_encodings(c.placeholder)) for c in items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def bound(self, host: str) -> bool:
        return host in self.hosts

    def _sub(
        self, data: bytes, host: str, used: list[str], body: bool = False
    ) -> tuple[bytes, str | None]:
        leaked: str | None = None

        def repl(m: re.Match[bytes]) -> bytes:
            nonlocal leaked
            cred = self._by_placeholder.get(m.group(0))
            if cred is None:
                return m.group(0)
            if host not in cred.hosts:
                leaked = leaked or cred.name
                return m.group(0)
            if body and not cred.in_body:
                # Only credentials that ask for it are swapped in bodies.
                return m.group(0)
            used.append(cred.name)
            return cred.value

        if PLACEHOLDER_PREFIX not in data:
            return data, None
        return _ANY_PLACEHOLDER.sub(repl, data), leaked

    def encoded_leak(self, data: bytes, host: str) -> str | None:
        """The credential not bound to `host` whose placeholder `data` carries in any
        recognised form (see the module docstring); linear in `len(data)`."""
        unbound = [c for c in self._forms if host not in c[0].hosts]
        if not unbound or not data:
            return None
        views = [data]
        if b"%" in data:
            views.append(_percent_decoded(data))
        for view in views:
            lowered = view.lower()
            for cred, folded, cased in unbound:
                if any(f in lowered for f in folded) or any(f in view for f in cased):
                    return cred.name
        return None

    def leak_in(self, data: bytes, host: str) -> str | None:
        """The credential whose placeholder `data` carries to a host it is not bound to."""
        return self._sub(data, host, [])[1]

    def swap_headers(self, headers: Iterable[Header], host: str) -> Swapped:
        """Headers with placeholders swapped for `host`; `leaked` names a misdirected one."""
        out: list[Header] = []
        used: list[str] = []
        reverse: list[tuple[bytes, bytes]] = []
        leaked: str | None = None
        for name, value in headers:
            new, leak = self._sub(value, host, used)
            leaked = leaked or leak
            if name.lower() in (b"authorization", b"proxy-authorization"):
                before = new
                new, leak = self._swap_basic(new, host, used)
                leaked = leaked or leak
                if new != before:
                    reverse.append((new.partition(b" ")[2], before.strip().partition(b" ")[2]))
            out.append((name, new))
        return Swapped(out, tuple(dict.fromkeys(used)), leaked, tuple(reverse))

    def _swap_basic(self, value: bytes, host: str, used: list[str]) -> tuple[bytes, str | None]:
        scheme, _, token = value.strip().partition(b" ")
        if scheme.lower() != b"basic" or not token:
            return value, None
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return value, None
        new, leaked = self._sub(decoded, host, used)
        if new == decoded:
            return value, leaked
        return scheme + b" " + base64.b64encode(new), leaked

    def swap_body(self, body: bytes, host: str) -> tuple[bytes, str | None]:
        """`body` with placeholders of `in_body` credentials swapped; any leak's name."""
        new, leaked = self._sub(body, host, [], body=True)
        return (body, leaked) if leaked is not None else (new, None)

    def scrub(self, extra: Sequence[tuple[bytes, bytes]] = ()) -> Scrub:
        """What to replace in a response: real values, their base64, and `extra` pairs."""
        pairs = [*extra]
        for c in self.items:
            pairs += [(c.value, c.placeholder), (base64.b64encode(c.value), c.placeholder)]
        return Scrub(tuple(pairs))


_STRAY_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def _percent_decoded(data: bytes) -> bytes:
    """`data` with %XX decoded at C speed, as urllib decodes it (a view to scan).

    `urllib.parse.unquote_to_bytes` loops in Python per escape: ~3 s for
    16 MiB of escapes, stalling the broker's event loop. With every
    backslash doubled, `%` turned into `\\x` is the only escape left for
    `codecs.escape_decode`, which decodes in C. A `%` not followed by two hex
    digits stays literal, as urllib (and so the server) reads it: decoded as
    a bad escape it would swallow the next character, and `%` + a placeholder
    with one character escaped would then match in neither view.
    """
    escaped = _STRAY_PERCENT.sub(b"%25", data).replace(b"\\", b"\\\\").replace(b"%", b"\\x")
    return codecs.escape_decode(escaped, "replace")[0]


def _encodings(placeholder: bytes) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """(case-folded forms, case-sensitive forms) of `placeholder` to look for.

    base64 of a string depends on where it starts modulo 3: for each start,
    the characters that encode only placeholder bytes are the same in any
    surrounding text, so each alignment contributes that stable middle.
    """
    folded = (placeholder.lower(), placeholder.hex().encode())
    cased: list[bytes] = []
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + placeholder)
        # Characters touching a padding byte or the unaligned tail differ.
        start = (pad * 4 + 2) // 3
        end = (pad + len(placeholder)) // 3 * 4
        core = encoded[start:end]
        cased += [core, core.translate(bytes.maketrans(b"+/", b"-_"))]
    return folded, tuple(dict.fromkeys(cased))


@dataclass(frozen=True, slots=True)
class Scrub:
    """(real, shown) byte pairs replaced in a response on its way to the sandbox."""

    pairs: tuple[tuple[bytes, bytes], ...]

    def headers(self, headers: Iterable[Header]) -> list[Header]:
        out: list[Header] = []
        for name, raw in headers:
            value = raw
            for real, shown in self.pairs:
                value = value.replace(real, shown)
            out.append((name, value))
        return out

    def stream(self) -> Scrubber:
        return Scrubber(self.pairs)


class Scrubber:
    """Replaces real values with placeholders in a stream split at arbitrary points.

    The last `longest - 1` bytes of each chunk are held back until the next
    one (or `finish`), so a value split across two chunks is still replaced.
    """

    def __init__(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        self._pairs = [(v, p) for v, p in pairs if v]
        self._keep = max((len(v) for v, _ in self._pairs), default=1) - 1
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._held + data
        for value, placeholder in self._pairs:
            buf = buf.replace(value, placeholder)
        if self._keep <= 0 or len(buf) <= self._keep:
            self._held = buf if self._keep > 0 else b""
            return b"" if self._keep > 0 else buf
        # A placeholder just written may end inside the held tail; it contains
        # no real value, so rescanning it later is harmless.
        self._held = buf[-self._keep :]
        return buf[: -self._keep]

    def finish(self) -> bytes:
        out, self._held = self._held, b""
        return out
