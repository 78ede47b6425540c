"""TLS interception of an admitted CONNECT tunnel whose requests must be decided.

The policy marks a tunnel `intercept` when a rule for its destination looks
at methods or paths, or a credential is bound to its host. The broker then
answers 200, checks the ClientHello's server name against the CONNECT host
(the tunnel check, `sni-mismatch`), completes TLS itself with a leaf minted
by the run's CA (ALPN offers only `http/1.1`), and serves the requests inside
as `HttpRequest(scheme="https")`: each one is decided, journaled (caused by
the tunnel's row) and forwarded over a new TLS connection to the checked
address, verified against the host's trust store. A request whose Host header
differs from the CONNECT target is answered 421 (`host-mismatch`); protocol
upgrades (WebSocket, h2c) are refused with 501 (`upgrade-refused`);
placeholders are swapped or, towards a host they are not bound to, refused
(`exfiltration`), see `credentials.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from typing import Any

import h11
from pydantic import ValidationError

from corral.broker.actions import Action, HttpRequest, NetConnect
from corral.broker.credentials import Credentials
from corral.broker.hosts import format_hostport
from corral.broker.policy import Decision, decide
from corral.broker.proxy import (
    _RECV,
    BrokerState,
    _bodyless,
    _BodyLimit,
    _ClientConnection,
    _declared_length,
    _Stream,
    request_headers,
)
from corral.broker.wire import MalformedRequest, parse_authority, split_origin_target
from corral.errors import BrokerError

__all__ = [
    "EXFILTRATION_RULE",
    "HOST_MISMATCH_RULE",
    "TlsServerStream",
    "intercept",
    "leak_rule",
    "refuse_plain_leak",
]

EXFILTRATION_RULE = "exfiltration"
HOST_MISMATCH_RULE = "host-mismatch"
UPGRADE_RULE = "upgrade-refused"


class TlsServerStream(_Stream):
    """The server side of TLS over the client's raw socket (memory BIOs).

    Memory BIOs rather than `start_tls`: the ClientHello was already read off
    the socket for the SNI check and is fed in first.
    """

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, first: bytes) -> None:
        super().__init__(sock)
        self._raw = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=True)
        self._eof = False
        self.counts = [0, 0]
        if first:
            self._in.write(first)
            self.counts[0] += len(first)

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.counts[1] += len(data)
            await self._loop.sock_sendall(self._raw, data)

    async def _fill(self) -> None:
        data = await self._loop.sock_recv(self._raw, _RECV)
        if not data:
            self._eof = True
            self._in.write_eof()
            return
        self.counts[0] += len(data)
        self._in.write(data)

    async def handshake(self) -> None:
        while True:
            try:
                self._obj.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                if self._eof:
                    raise ConnectionResetError("client closed during the TLS handshake") from None
                await self._fill()
                continue
            await self._flush()
            return

    async def recv(self, n: int = _RECV) -> bytes:
        while True:
            try:
                return self._obj.read(n)
            except ssl.SSLWantReadError:
                await self._flush()
                if self._eof:
                    return b""
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = self._obj.write(view)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            view = view[written:]
        await self._flush()

    def shutdown_write(self) -> None:
        with contextlib.suppress(ssl.SSLError, OSError):
            self._obj.unwrap()
        with contextlib.suppress(OSError, BlockingIOError):
            data = self._out.read()
            if data:
                self._raw.send(data)
            self._raw.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """The tunnel's connection owns the socket and closes it."""


class _Intercepted(_ClientConnection):
    """Serves the requests inside one intercepted tunnel."""

    def __init__(
        self,
        state: BrokerState,
        *,
        sock: socket.socket,
        tls: TlsServerStream,
        tunnel: NetConnect,
        decision: Decision,
        tunnel_obs: int,
    ) -> None:
        super().__init__(state, sock)
        self.client = tls
        self.tunnel = tunnel
        self.addresses = decision.addresses
        self.tunnel_obs = tunnel_obs

    async def _decide(self, action: Action, port: int) -> tuple[Decision, dict[str, Any]]:
        # The tunnel's addresses were checked when it was admitted; its
        # requests go there, never to a second lookup.
        ctx = self.state.context.with_addresses(self.addresses)
        decision = decide(action, ctx, self.state.policy)
        if decision.verdict == "resolve":
            decision = Decision("deny", "policy-error", "policy asked to resolve twice")
        return decision, {}

    async def _refuse(
        self, action: Action, extra: dict[str, Any], status: int, rule: str, reason: str
    ) -> bool:
        if await self._journal_denial(action, rule, reason, extra, self.tunnel_obs):
            await self._deny(status, rule, reason)
        return False

    async def _read_body(self) -> bytes:
        if self.h11.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        parts: list[bytes] = []
        size = 0
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(self.limits.body_timeout_s):
                    self.h11.receive_data(await self.client.recv())
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limits.max_body_bytes:
                    raise _BodyLimit
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a body")

    async def _serve(self, request: h11.Request) -> bool:
        tunnel = self.tunnel
        host = tunnel.host
        method = request.method.decode("ascii", "replace")
        target = request.target
        where = format_hostport(host, tunnel.port)
        shown = f"{method} https://{where}{target.decode('ascii', 'replace')}"
        try:
            names = {n for n, _ in request.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                raise MalformedRequest("both Content-Length and Transfer-Encoding")
            if not target.startswith(b"/"):
                raise MalformedRequest("a request inside a tunnel has an origin-form target")
            path, query = split_origin_target(target.decode("ascii"))
            action = HttpRequest(
                host=host, port=tunnel.port, method=method, path=path, query=query, scheme="https"
            )
        except (MalformedRequest, ValidationError, UnicodeDecodeError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return await self._refuse_malformed("http_request", shown, reason)
        extra: dict[str, Any] = {
            "method": method,
            "tunnel": self.tunnel_obs,
            "headers": request_headers(request, frozenset()),
        }
        if query:
            extra["query"] = query[:1024]
        hosts = [v for n, v in request.headers if n == b"host"]
        refusal = _host_refusal(hosts, host, tunnel.port)
        if refusal is None and b"upgrade" in names:
            refusal = (
                501,
                UPGRADE_RULE,
                "protocol upgrades (WebSocket, h2c) are not relayed on intercepted connections",
            )
        creds = self.state.credentials
        swapped = creds.swap_headers(request.headers, host)
        leak = swapped.leaked or creds.leak_in(target, host) or _encoded_leak(creds, request, host)
        if refusal is None and leak is not None:
            refusal = (
                403,
                EXFILTRATION_RULE,
                f"the placeholder of credential {leak} was sent to {host}, "
                "which it is not bound to",
            )
        if refusal is not None:
            return await self._refuse(action, extra, *refusal)
        if swapped.used:
            extra["credentials"] = list(swapped.used)
        declared = _declared_length(request)
        if declared is not None and declared > self.limits.max_body_bytes:
            return await self._refuse_body(action, extra, declared)
        raw: bytes | None = None
        if creds and not _bodyless(request):
            # With credentials in the run every body is read (bounded by the
            # body limit) and scanned before the request is decided: a
            # placeholder streamed through could not be taken back.
            try:
                raw = await self._read_body()
            except _BodyLimit:
                why = f"request body is over the {self.limits.max_body_bytes}-byte limit"
                return await self._refuse(action, extra, 413, "body-limit", why)
            leak = creds.encoded_leak(raw, host)
            if leak is not None:
                reason = (
                    f"the placeholder of credential {leak} was sent in a request body to "
                    f"{host}, which it is not bound to"
                )
                return await self._refuse(action, extra, 403, EXFILTRATION_RULE, reason)
        admitted = await self._admit(action, tunnel.port, extra)
        if admitted is None:
            return False
        decision, obs_id = admitted
        headers = swapped.data
        if creds.bound(host):
            # The scrubber reads the response as relayed; it cannot read a
            # compressed one, so a bound host is asked for identity.
            headers = [(n, v) for n, v in headers if n != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        body: bytes | None = None
        if raw is not None:
            body, _ = creds.swap_body(raw, host)
            headers = [
                (n, v) for n, v in headers if n not in (b"content-length", b"transfer-encoding")
            ]
            headers.append((b"content-length", str(len(body)).encode()))
        outgoing = h11.Request(method=request.method, target=target, headers=headers)
        return await self._forward(
            outgoing,
            decision=decision,
            obs_id=obs_id,
            port=tunnel.port,
            host_header=hosts[0],
            upstream_target=target,
            tls_host=host,
            strip=frozenset(),
            inject=(),
            body=body,
            scrub=creds.scrub(swapped.reverse) if creds.bound(host) else None,
        )


def _encoded_leak(creds: Credentials, request: h11.Request, host: str) -> str | None:
    """A placeholder re-encoded (hex, base64, percent) in the target or a header."""
    if not creds:
        return None
    for data in (request.target, *(v for _, v in request.headers)):
        leak = creds.encoded_leak(data, host)
        if leak is not None:
            return leak
    return None


def _host_refusal(hosts: list[bytes], host: str, port: int) -> tuple[int, str, str] | None:
    if len(hosts) != 1:
        why = f"a request in a tunnel to {host} has {len(hosts)} Host headers"
        return 421, HOST_MISMATCH_RULE, why
    try:
        named = parse_authority(hosts[0], port)
    except MalformedRequest:
        named = None
    if named != (host, port):
        shown = hosts[0][:200].decode("ascii", "replace")
        return (
            421,
            HOST_MISMATCH_RULE,
            f"Host {shown!r} differs from the CONNECT target {format_hostport(host, port)}",
        )
    return None


def leak_rule(creds: Credentials, request: h11.Request) -> str | None:
    """The credential whose placeholder a plain-HTTP request carries (never swapped there).

    Credentials go only over TLS, so any placeholder in plain HTTP is refused,
    also towards a bound host.
    """
    if not creds:
        return None
    return (
        creds.swap_headers(request.headers, "").leaked
        or creds.leak_in(request.target, "")
        or _encoded_leak(creds, request, "")
    )


async def refuse_plain_leak(
    conn: _ClientConnection, request: h11.Request, action: HttpRequest, extra: dict[str, Any]
) -> bool:
    """Refuse (and journal) a plain-HTTP request carrying a placeholder; True if refused."""
    leak = leak_rule(conn.state.credentials, request)
    if leak is None:
        return False
    reason = f"the placeholder of credential {leak} was sent over plain HTTP to {action.host}"
    if await conn._journal_denial(action, EXFILTRATION_RULE, reason, extra):
        await conn._deny(403, EXFILTRATION_RULE, reason)
    return True


async def intercept(
    conn: _ClientConnection, action: NetConnect, decision: Decision, obs_id: int
) -> bool:
    """Serve an admitted, intercepted tunnel on `conn`; False (the connection ends)."""
    state = conn.state
    started = time.monotonic()
    detail: dict[str, Any] = {"intercepted": True}
    tls: TlsServerStream | None = None
    try:
        if state.ca is None:
            raise BrokerError("no interception CA")
        await conn._send(
            h11.Response(status_code=200, headers=[], reason=b"Connection established")
        )
        pending, closed = conn.h11.trailing_data
        first = await conn._check_sni(action, obs_id, pending, closed)
        if isinstance(first, str):
            detail["error"] = first
            return False
        tls = TlsServerStream(conn.sock, state.ca.server_context(action.host), first)
        async with asyncio.timeout(state.limits.header_timeout_s):
            await tls.handshake()
        await _Intercepted(
            state, sock=conn.sock, tls=tls, tunnel=action, decision=decision, tunnel_obs=obs_id
        ).run()
    except (OSError, TimeoutError, BrokerError) as exc:
        detail["error"] = f"TLS with the client failed: {exc!r}"[:500]
    finally:
        counts = tls.counts if tls is not None else [0, 0]
        conn._outcome(obs_id, counts, started, detail)
    return False
