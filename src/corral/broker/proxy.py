"""The egress proxy: HTTP/1.1 forward proxying, CONNECT tunnels and routes.

Each client connection is read with h11 (a sans-IO HTTP/1.1 state machine);
the bytes move over non-blocking sockets with the event loop's `sock_*`
calls. For every request:

1. the request becomes a typed action (`HttpRequest`, `NetConnect`,
   `ProviderCall`); one that cannot be read unambiguously is denied;
2. the pure policy decides, the broker resolves an admitted name itself and
   the policy checks the addresses;
3. the observation is committed to the journal - the request waits for that
   commit - and only then
4. the broker connects to a checked address (never a second lookup) and
   forwards; a denial is answered with 403 and `X-Corral-Denied`, after which
   the connection is closed.

CONNECT tunnels are opaque; when the client's first bytes are a TLS
ClientHello whose server name differs from the CONNECT host, the tunnel is
closed before those bytes leave and a second, denying observation is
journaled (`sni-mismatch`, caused by the tunnel's row). Redirects are passed
back to the client, never followed. A plain-HTTP upstream connection is kept
for the next request of the same client connection to the same checked
destination, never shared between clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import h11
from pydantic import ValidationError

from corral.broker import relay
from corral.broker.actions import (
    Action,
    HttpRequest,
    Identity,
    NetConnect,
    Observation,
    ProviderCall,
)
from corral.broker.config import LimitsConfig
from corral.broker.credentials import Credentials, Scrub
from corral.broker.hosts import format_hostport
from corral.broker.journal import GroupCommitJournal
from corral.broker.metering import BUDGET_RULE, ResponseMeter, SessionBudget
from corral.broker.policy import Decision, DecisionContext, Policy, decide
from corral.broker.resolver import Resolver
from corral.broker.wire import (
    MalformedRequest,
    client_hello_sni,
    denial_response,
    forward_request_headers,
    forward_response_headers,
    parse_absolute_target,
    parse_authority,
    split_origin_target,
    split_route,
)
from corral.errors import BrokerError

if TYPE_CHECKING:
    from corral.broker.mitm import CertAuthority

__all__ = ["BrokerState", "ProxyServer", "RouteSecrets"]

Header = tuple[bytes, bytes]
_RECV = 262144


#: Header values journaled per request are cut here; names are always kept.
_HEADER_VALUE_LIMIT = 512
_HEADER_COUNT_LIMIT = 64


def request_headers(request: h11.Request, stripped: frozenset[bytes]) -> list[list[str]]:
    """The client's request headers for the journal (data can leave in them).

    Headers a route strips (the sandbox's placeholder credentials) are shown as
    `<stripped>`; the broker's injected secrets are never part of this list.
    """
    out: list[list[str]] = []
    for i, (raw_name, raw_value) in enumerate(request.headers):
        if i >= _HEADER_COUNT_LIMIT:
            out.append(["...", f"{len(request.headers) - i} more headers"])
            break
        name = raw_name.decode("latin-1").lower()
        if raw_name.lower() in stripped:
            value = "<stripped>"
        else:
            value = raw_value.decode("latin-1")
            if len(value) > _HEADER_VALUE_LIMIT:
                value = value[:_HEADER_VALUE_LIMIT] + f"...(+{len(value) - _HEADER_VALUE_LIMIT})"
        out.append([name, value])
    return out


@dataclass(frozen=True, slots=True)
class RouteSecrets:
    """What a route adds and removes upstream; values never leave the broker."""

    inject: tuple[Header, ...]
    strip: frozenset[bytes]


@dataclass(slots=True)
class BrokerState:
    """Everything a connection handler needs; built once by the server.

    `policy` alone is replaced while serving (by the control channel,
    `broker/control.py`); each decision reads it once.
    """

    policy: Policy
    journal: GroupCommitJournal
    identity: Identity
    resolver: Resolver
    limits: LimitsConfig
    tls: ssl.SSLContext
    routes: Mapping[str, RouteSecrets]
    own_endpoints: frozenset[tuple[str, int]]
    budgets: Mapping[str, SessionBudget] = field(default_factory=dict)
    credentials: Credentials = field(default_factory=lambda: Credentials(()))
    ca: CertAuthority | None = None
    tcp_policy: Policy | None = None

    @property
    def context(self) -> DecisionContext:
        return DecisionContext(
            env=self.identity.env, run=self.identity.run, session=self.identity.session
        )


class _Stream:
    """A byte stream to a peer: a raw non-blocking socket or a TLS stream."""

    def __init__(
        self,
        sock: socket.socket | None,
        tls: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None,
    ) -> None:
        self._sock = sock
        self._tls = tls
        self._loop = asyncio.get_running_loop()

    async def recv(self, n: int = _RECV) -> bytes:
        if self._tls is not None:
            return await self._tls[0].read(n)
        assert self._sock is not None
        return await self._loop.sock_recv(self._sock, n)

    async def sendall(self, data: bytes) -> None:
        if self._tls is not None:
            self._tls[1].write(data)
            await self._tls[1].drain()
            return
        assert self._sock is not None
        await self._loop.sock_sendall(self._sock, data)

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            if self._tls is None and self._sock is not None:
                self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        if self._tls is not None:
            self._tls[1].close()
        elif self._sock is not None:
            self._sock.close()


async def _connect(
    addresses: Sequence[str], port: int, timeout: float
) -> tuple[socket.socket, str]:
    """Connect to the first reachable checked address; never resolves anything."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(timeout):
                await loop.sock_connect(sock, (address, port))
        except (OSError, TimeoutError) as exc:
            sock.close()
            errors.append(f"{format_hostport(address, port)}: {exc or 'timeout'}")
            continue
        return sock, address
    raise BrokerError("upstream unreachable: " + "; ".join(errors))


@dataclass(slots=True)
class _Pooled:
    key: tuple[tuple[str, ...], int, bytes, str | None]
    stream: _Stream
    address: str
    h11: h11.Connection


_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS"})


def _bodyless(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return False
    return True


class _Upstream(Exception):
    """The upstream failed; `started`: the client saw part of a response."""

    def __init__(self, message: str, started: bool, status: int | None) -> None:
        super().__init__(message)
        self.started = started
        self.status = status


class _BodyLimit(Exception):
    """The client's request body went past `max_body_bytes` while it was relayed."""


BODY_LIMIT_RULE: Final = "body-limit"


def _declared_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 has already checked it is digits
    return None


class _Closed(Exception):
    """The client went away or broke the protocol mid-exchange."""


class ProxyServer:
    """Accepts client connections on listening sockets and serves each one."""

    def __init__(self, state: BrokerState, on_fatal: Callable[[BaseException], None]) -> None:
        """`on_fatal` is called when a listener can no longer accept connections."""
        self.state = state
        self._on_fatal = on_fatal
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting: list[asyncio.Task[None]] = []

    def start(self, listeners: Sequence[socket.socket]) -> None:
        """Begin accepting on every listening socket (they must be non-blocking)."""
        for lsock in listeners:
            self._accepting.append(asyncio.create_task(self._accept_loop(lsock)))

    async def stop_accepting(self) -> None:
        """Stop the accept loops (the listening sockets stay open)."""
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        self._accepting.clear()

    async def aclose(self) -> None:
        """Stop accepting, cut every connection and wait for their handlers."""
        await self.stop_accepting()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def active_connections(self) -> int:
        return len(self._tasks)

    async def _accept_loop(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(lsock)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await asyncio.sleep(0.1)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue
                # A broker that silently stops accepting would leave the
                # sandbox hanging; let the process end so the launcher sees it.
                self._on_fatal(exc)
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if len(self._tasks) >= self.state.limits.max_connections:
                conn.close()
                continue
            task = asyncio.create_task(_ClientConnection(self.state, conn).run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


class _ClientConnection:
    def __init__(self, state: BrokerState, sock: socket.socket) -> None:
        self.state = state
        self.limits = state.limits
        self.sock = sock
        self.client = _Stream(sock)
        self.h11 = h11.Connection(
            h11.SERVER, max_incomplete_event_size=state.limits.max_header_bytes
        )
        self.loop = asyncio.get_running_loop()
        # The upstream connection of the previous request, kept while this
        # client connection lives and reused only for the same checked
        # destination (never shared between clients).
        self.upstream: _Pooled | None = None

    async def run(self) -> None:
        try:
            async with asyncio.timeout(self.limits.idle_timeout_s):
                first = await self.client.recv()
            if first[:1] == b"\x05":
                # SOCKS5 (an HTTP request line never starts with 0x05).
                from corral.broker.socks import serve_socks

                await serve_socks(self, first)
                return
            self.h11.receive_data(first)
            while True:
                try:
                    request = await self._read_request_head()
                except h11.RemoteProtocolError as exc:
                    await self._refuse_unreadable(str(exc), exc.error_status_hint)
                    return
                except TimeoutError:
                    pending = self.h11.trailing_data[0]
                    if pending:
                        await self._refuse_unreadable("request head timed out", 408)
                    return
                if request is None:
                    return
                if not await self._serve(request):
                    return
                if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                    return
                self.h11.start_next_cycle()
        except (OSError, _Closed, h11.ProtocolError):
            return
        finally:
            self._drop_upstream()
            self.client.close()

    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.stream.close()
            self.upstream = None

    # --- reading -------------------------------------------------------

    async def _read_request_head(self) -> h11.Request | None:
        idle_deadline = self.loop.time() + self.limits.idle_timeout_s
        head_deadline: float | None = None
        if self.h11.trailing_data[0]:
            head_deadline = self.loop.time() + self.limits.header_timeout_s
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout_at(head_deadline or idle_deadline):
                    data = await self.client.recv()
                if data and head_deadline is None:
                    head_deadline = self.loop.time() + self.limits.header_timeout_s
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                # h11 bounds only *incomplete* heads; one that arrived whole
                # in a single read is bounded here.
                size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                if size > self.limits.max_header_bytes:
                    raise h11.RemoteProtocolError("request head too large", 431)
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")

    async def _send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.client.sendall(data)

    # --- journal -------------------------------------------------------

    async def _record(
        self, action: Action, decision: Decision, detail: dict[str, Any], cause: int | None = None
    ) -> int:
        obs = Observation.of(
            action,
            self.state.identity,
            decision="allow" if decision.verdict == "allow" else "deny",
            rule=decision.rule,
            reason=decision.reason,
            detail=detail,
            cause=cause,
        )
        return await self.state.journal.append(obs)

    async def _decide(self, action: Action, port: int) -> tuple[Decision, dict[str, Any]]:
        ctx = self.state.context
        decision = decide(action, ctx, self.state.policy)
        detail: dict[str, Any] = {}
        if decision.verdict == "resolve" and decision.resolve_host is not None:
            try:
                addresses = await self.state.resolver.resolve(decision.resolve_host, port)
            except BrokerError as exc:
                return Decision("deny", decision.rule, str(exc)), detail
            detail["resolved"] = list(addresses)
            decision = decide(action, ctx.with_addresses(addresses), self.state.policy)
        if decision.verdict == "resolve":
            decision = Decision("deny", "policy-error", "policy asked to resolve twice")
        return decision, detail

    async def _admit(
        self, action: Action, port: int, extra: dict[str, Any]
    ) -> tuple[Decision, int] | None:
        """Decide and journal; on denial answer the client and return None."""
        decision, detail = await self._decide(action, port)
        detail.update(extra)
        try:
            obs_id = await self._record(action, decision, detail)
        except Exception as exc:
            await self._deny(503, "journal-unavailable", f"journal write failed: {exc}")
            return None
        if not decision.allowed:
            await self._deny(403, decision.rule or "default-deny", decision.reason)
            return None
        return decision, obs_id

    def _outcome(
        self, obs_id: int, counts: Sequence[int], started: float, detail: dict[str, Any]
    ) -> None:
        detail["duration_s"] = round(time.monotonic() - started, 6)
        self.state.journal.record_outcome(obs_id, counts[0], counts[1], detail)
        if "usage" in detail:
            # A session's spend is read back from the journal: on disk before
            # the broker serves another request (it may be killed any time).
            self.state.journal.flush()

    # --- answering -------------------------------------------------------

    async def _deny(
        self, status: int, rule: str, reason: str, drain: int = 1 << 20, drain_s: float = 1.0
    ) -> None:
        with contextlib.suppress(OSError):
            await self.client.sendall(denial_response(status, rule, reason))
        await self._linger(drain, drain_s)

    async def _linger(self, drain: int = 1 << 20, drain_s: float = 1.0) -> None:
        # Closing a socket with unread input makes the kernel send RST, which
        # can destroy the denial still in flight to the client. Half-close,
        # then drain what the client still sends, briefly (read and dropped:
        # time, not memory).
        self.client.shutdown_write()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(drain_s):
                drained = 0
                while drained < drain:
                    data = await self.client.recv(65536)
                    if not data:
                        break
                    drained += len(data)

    async def _refuse_unreadable(self, reason: str, status: int) -> None:
        raw = self.h11.trailing_data[0][:200]
        first_line = raw.split(b"\r\n", 1)[0].decode("ascii", "replace")
        obs = Observation(
            run=self.state.identity.run,
            session=self.state.identity.session,
            env=self.state.identity.env,
            kind="net_connect" if first_line.upper().startswith("CONNECT") else "http_request",
            target=first_line[:200] or "-",
            decision="deny",
            rule="malformed-request",
            reason=f"unreadable request: {reason}",
        )
        with contextlib.suppress(Exception):
            await self.state.journal.append(obs)
        await self._deny(status if status in (400, 408, 431) else 400, "malformed-request", reason)

    async def _refuse_malformed(self, kind: str, target: str, reason: str) -> bool:
        obs = Observation(
            run=self.state.identity.run,
            session=self.state.identity.session,
            env=self.state.identity.env,
            kind="net_connect" if kind == "net_connect" else "http_request",
            target=target[:200],
            decision="deny",
            rule="malformed-request",
            reason=reason,
        )
        try:
            await self.state.journal.append(obs)
        except Exception as exc:
            await self._deny(503, "journal-unavailable", f"journal write failed: {exc}")
            return False
        await self._deny(403, "malformed-request", reason)
        return False

    # --- dispatch ------------------------------------------------------

    async def _serve(self, request: h11.Request) -> bool:
        """Handle one request; True when the connection may carry another."""
        method = request.method.decode("ascii", "replace")
        target = request.target
        shown = f"{method} {target.decode('ascii', 'replace')}"
        try:
            names = {n for n, _ in request.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                # Two framings is how requests are smuggled past a proxy.
                raise MalformedRequest("both Content-Length and Transfer-Encoding")
            if method == "CONNECT":
                host, port = parse_authority(target, None)
                return await self._tunnel(NetConnect(host=host, port=port))
            if target.startswith(b"/"):
                path, query = split_origin_target(target.decode("ascii"))
                return await self._route(request, method, path, query, shown)
            if target[:7].lower() == b"http://":
                parsed = parse_absolute_target(target)
                if (parsed.host, parsed.port) in self.state.own_endpoints:
                    return await self._route(request, method, parsed.path, parsed.query, shown)
                action = HttpRequest(
                    host=parsed.host,
                    port=parsed.port,
                    method=method,
                    path=parsed.path,
                    query=parsed.query,
                )
                return await self._http(request, action)
            raise MalformedRequest(f"unsupported request target {shown[:100]!r}")
        except (MalformedRequest, ValidationError, UnicodeDecodeError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            kind = "net_connect" if method == "CONNECT" else "http_request"
            return await self._refuse_malformed(kind, shown, reason)

    async def _route(
        self, request: h11.Request, method: str, path: str, query: str, shown: str
    ) -> bool:
        split = split_route(path)
        if split is None:
            return await self._refuse_malformed(
                "http_request", shown, "not a proxy request and not a /routes/<name>/ path"
            )
        name, rest = split
        action = ProviderCall(route=name, method=method, path=rest, query=query)
        route = self.state.policy.routes.get(name)
        extra: dict[str, Any] = {"method": method, "path": rest}
        if query:
            extra["query"] = query[:1024]
        strip_names = (
            self.state.routes.get(name, RouteSecrets((), frozenset())).strip
            if route
            else frozenset()
        )
        extra["headers"] = request_headers(request, strip_names)
        if route is not None:
            extra["upstream"] = f"{route.scheme}://{format_hostport(route.host, route.port)}"
        declared = _declared_length(request)
        if declared is not None and declared > self.limits.max_body_bytes:
            return await self._refuse_body(action, extra, declared)
        budget = self.state.budgets.get(name) if route is not None else None
        if budget is not None and budget.serialised:
            async with budget.lock:
                why = budget.refusal()
                if why is not None:
                    return await self._refuse_budget(action, extra, why)
                return await self._route_admitted(request, action, name, extra, budget)
        return await self._route_admitted(request, action, name, extra, budget)

    async def _journal_denial(
        self,
        action: Action,
        rule: str,
        reason: str,
        extra: dict[str, Any],
        cause: int | None = None,
    ) -> bool:
        """Journal a denial before it is answered; True once the row is in. When
        the journal cannot take it the client is answered 503 (fail closed)."""
        try:
            await self._record(action, Decision("deny", rule, reason), extra, cause)
        except Exception as exc:
            await self._deny(503, "journal-unavailable", f"journal write failed: {exc}")
            return False
        return True

    async def _refuse_budget(self, action: ProviderCall, extra: dict[str, Any], why: str) -> bool:
        if await self._journal_denial(action, BUDGET_RULE, why, extra):
            await self._deny(429, BUDGET_RULE, why)
        return False

    async def _refuse_body(self, action: Action, extra: dict[str, Any], declared: int) -> bool:
        limit = self.limits.max_body_bytes
        why = f"request body of {declared} bytes is over the {limit}-byte limit"
        if not await self._journal_denial(action, BODY_LIMIT_RULE, why, extra):
            return False
        # Clients send the whole body before reading the answer: drain what
        # was declared (bounded) so the 413 is read rather than reset.
        drain = min(declared, 4 * self.limits.max_body_bytes)
        await self._deny(413, BODY_LIMIT_RULE, why, drain=drain, drain_s=5.0)
        return False

    async def _route_admitted(
        self,
        request: h11.Request,
        action: ProviderCall,
        name: str,
        extra: dict[str, Any],
        budget: SessionBudget | None,
    ) -> bool:
        route = self.state.policy.routes.get(name)
        rest, query = action.path, action.query
        admitted = await self._admit(action, route.port if route else 0, extra)
        if admitted is None or route is None:
            return False
        decision, obs_id = admitted
        secrets = self.state.routes.get(name, RouteSecrets((), frozenset()))
        default_port = 443 if route.scheme == "https" else 80
        host_header = (
            route.host if route.port == default_port else format_hostport(route.host, route.port)
        )
        upstream_target = route.base_path + rest + (f"?{query}" if query else "")
        return await self._forward(
            request,
            decision=decision,
            obs_id=obs_id,
            port=route.port,
            host_header=host_header.encode("ascii"),
            upstream_target=upstream_target.encode("ascii"),
            tls_host=route.host if route.scheme == "https" else None,
            strip=secrets.strip,
            inject=secrets.inject,
            budget=budget,
            meter=ResponseMeter(action.method, rest) if budget is not None else None,
        )

    async def _http(self, request: h11.Request, action: HttpRequest) -> bool:
        extra: dict[str, Any] = {"method": action.method}
        if action.query:
            extra["query"] = action.query[:1024]
        extra["headers"] = request_headers(request, frozenset())
        if self.state.credentials:
            from corral.broker.intercept import refuse_plain_leak

            if await refuse_plain_leak(self, request, action, extra):
                return False
        declared = _declared_length(request)
        if declared is not None and declared > self.limits.max_body_bytes:
            return await self._refuse_body(action, extra, declared)
        admitted = await self._admit(action, action.port, extra)
        if admitted is None:
            return False
        decision, obs_id = admitted
        host_header = (
            action.host if action.port == 80 else format_hostport(action.host, action.port)
        )
        upstream_target = action.path + (f"?{action.query}" if action.query else "")
        return await self._forward(
            request,
            decision=decision,
            obs_id=obs_id,
            port=action.port,
            host_header=host_header.encode("ascii"),
            upstream_target=upstream_target.encode("ascii"),
            tls_host=None,
            strip=frozenset(),
            inject=(),
        )

    # --- forwarding ----------------------------------------------------

    async def _open(
        self, decision: Decision, port: int, tls_host: str | None
    ) -> tuple[_Stream, str]:
        sock, address = await _connect(decision.addresses, port, self.limits.connect_timeout_s)
        if tls_host is None:
            return _Stream(sock), address
        try:
            reader, writer = await asyncio.open_connection(
                sock=sock,
                ssl=self.state.tls,
                server_hostname=tls_host,
                ssl_handshake_timeout=self.limits.connect_timeout_s,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            sock.close()
            raise BrokerError(f"TLS to {tls_host} failed: {exc}") from exc
        return _Stream(None, (reader, writer)), address

    async def _forward(
        self,
        request: h11.Request,
        *,
        decision: Decision,
        obs_id: int,
        port: int,
        host_header: bytes,
        upstream_target: bytes,
        tls_host: str | None,
        strip: frozenset[bytes],
        inject: Sequence[Header],
        budget: SessionBudget | None = None,
        meter: ResponseMeter | None = None,
        body: bytes | None = None,
        scrub: Scrub | None = None,
    ) -> bool:
        started = time.monotonic()
        key = (decision.addresses, port, host_header, tls_host)
        counts = [0, 0]
        headers = forward_request_headers(
            list(request.headers), host_header, strip, inject, close=False
        )
        outgoing = h11.Request(method=request.method, target=upstream_target, headers=headers)
        retry_ok = request.method in _IDEMPOTENT and _bodyless(request)
        while True:
            reused = self.upstream is not None and self.upstream.key == key
            if not reused:
                self._drop_upstream()
                try:
                    stream, address = await self._open(decision, port, tls_host)
                except BrokerError as exc:
                    self._outcome(obs_id, counts, started, {"error": str(exc)})
                    await self._deny(502, decision.rule or "upstream", str(exc))
                    return False
                self.upstream = _Pooled(key, stream, address, h11.Connection(h11.CLIENT))
            conn = self.upstream
            assert conn is not None
            try:
                status = await self._exchange(outgoing, conn, counts, meter, body=body, scrub=scrub)
            except _Upstream as exc:
                self._drop_upstream()
                # An idle kept connection the upstream closed meanwhile: try
                # once more on a fresh one when nothing was consumed or sent.
                if reused and retry_ok and not exc.started and exc.status is None:
                    continue
                failed: dict[str, Any] = {"status": exc.status, "error": str(exc)}
                self._outcome(obs_id, counts, started, self._metered(failed, budget, meter))
                if not exc.started:
                    await self._deny(502, decision.rule or "upstream", str(exc))
                return False
            except _BodyLimit:
                # Chunked bodies declare no length: cut off where the count
                # passes the limit; the upstream sees a request that never ended.
                self._drop_upstream()
                why = f"request body is over the {self.limits.max_body_bytes}-byte limit"
                over: dict[str, Any] = {"error": why, "rule": BODY_LIMIT_RULE}
                self._outcome(obs_id, counts, started, self._metered(over, budget, meter))
                await self._deny(413, BODY_LIMIT_RULE, why)
                return False
            except BaseException as exc:
                self._drop_upstream()
                failed = {"error": f"client: {exc!r}"}
                self._outcome(obs_id, counts, started, self._metered(failed, budget, meter))
                raise
            if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
                conn.h11.start_next_cycle()
            else:
                self._drop_upstream()
            detail: dict[str, Any] = {"status": status, "address": conn.address}
            if reused:
                detail["reused"] = True
            self._outcome(obs_id, counts, started, self._metered(detail, budget, meter))
            return True

    def _metered(
        self, detail: dict[str, Any], budget: SessionBudget | None, meter: ResponseMeter | None
    ) -> dict[str, Any]:
        """`detail` with the response's usage, which is added to the session's spend."""
        if budget is None or meter is None:
            return detail
        metered = meter.result()
        budget.add(metered)
        detail["usage"] = metered.usage.to_json_dict()
        if metered.error is not None:
            detail["usage_error"] = metered.error
        if metered.skipped_lines:
            detail["usage_skipped_lines"] = metered.skipped_lines
        detail["session_tokens"] = budget.spent.total
        return detail

    async def _exchange(
        self,
        outgoing: h11.Request,
        conn: _Pooled,
        counts: list[int],
        meter: ResponseMeter | None = None,
        *,
        body: bytes | None = None,
        scrub: Scrub | None = None,
    ) -> int:
        """Send the client's request upstream and relay the response; its status.

        `body`: the request body, already read from the client (credential
        swapping). `scrub`: replace these credentials' real values in the
        response. Raises _Upstream for upstream failures; client failures
        propagate.
        """
        scrubber = scrub.stream() if scrub is not None else None
        cc, upstream = conn.h11, conn.stream
        status: int | None = None
        started_reply = False
        # Bytes are gathered while h11 has events ready and written when it
        # needs more input: a small request and its response then cost one
        # write each way instead of one per event.
        out = bytearray()

        async def flush_up() -> None:
            try:
                await upstream.sendall(bytes(out))
            except OSError as exc:
                raise _Upstream(f"sending upstream failed: {exc!r}", False, None) from exc
            out.clear()

        try:
            out += cc.send(outgoing) or b""
        except h11.LocalProtocolError as exc:
            raise _Upstream(f"request not forwardable: {exc}", False, None) from exc
        if body:
            counts[0] += len(body)
            out += cc.send(h11.Data(data=body)) or b""
        if self.h11.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        # On a retry the (empty) request body was already read.
        while body is None and self.h11.their_state is not h11.DONE:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if out:
                    await flush_up()
                async with asyncio.timeout(self.limits.body_timeout_s):
                    data = await self.client.recv()
                self.h11.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                counts[0] += len(event.data)
                if counts[0] > self.limits.max_body_bytes:
                    raise _BodyLimit
                out += cc.send(h11.Data(data=event.data)) or b""
                if len(out) >= _RECV:
                    await flush_up()
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise _Closed(f"client sent {event!r} in a request body")
        out += cc.send(h11.EndOfMessage()) or b""
        await flush_up()
        while True:
            try:
                event = cc.next_event()
            except h11.RemoteProtocolError as exc:
                raise _Upstream(f"upstream broke HTTP: {exc}", started_reply, status) from exc
            if event is h11.NEED_DATA:
                if out:
                    await self.client.sendall(bytes(out))
                    out.clear()
                    started_reply = True
                try:
                    async with asyncio.timeout(self.limits.upstream_timeout_s):
                        data = await upstream.recv()
                except OSError as exc:
                    raise _Upstream(f"upstream failed: {exc!r}", started_reply, status) from exc
                cc.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                if meter is not None:
                    meter.start(status, list(event.headers))
                reply_headers = forward_response_headers(list(event.headers))
                if scrub is not None:
                    reply_headers = scrub.headers(reply_headers)
                    if scrubber is not None and outgoing.method != b"HEAD":
                        # A replaced value changes the length: h11 re-frames.
                        reply_headers = [(n, v) for n, v in reply_headers if n != b"content-length"]
                out += (
                    self.h11.send(
                        h11.Response(
                            status_code=event.status_code,
                            headers=reply_headers,
                            reason=event.reason,
                        )
                    )
                    or b""
                )
            elif isinstance(event, h11.Data):
                counts[1] += len(event.data)
                if meter is not None:
                    meter.feed(event.data)
                chunk = scrubber.feed(event.data) if scrubber is not None else event.data
                if chunk:
                    out += self.h11.send(h11.Data(data=chunk)) or b""
                if len(out) >= _RECV:
                    await self.client.sendall(bytes(out))
                    out.clear()
                    started_reply = True
            elif isinstance(event, h11.EndOfMessage):
                tail = scrubber.finish() if scrubber is not None else b""
                if tail:
                    out += self.h11.send(h11.Data(data=tail)) or b""
                out += self.h11.send(h11.EndOfMessage()) or b""
                await self.client.sendall(bytes(out))
                assert status is not None
                return status
            else:
                raise _Upstream("upstream ended before its response did", started_reply, status)

    # --- tunnels -------------------------------------------------------

    async def _tunnel(self, action: NetConnect) -> bool:
        admitted = await self._admit(action, action.port, {})
        if admitted is None:
            return False
        decision, obs_id = admitted
        if decision.intercept:
            from corral.broker.intercept import intercept

            return await intercept(self, action, decision, obs_id)
        started = time.monotonic()
        try:
            sock, address = await _connect(
                decision.addresses, action.port, self.limits.connect_timeout_s
            )
        except BrokerError as exc:
            self._outcome(obs_id, (0, 0), started, {"error": str(exc)})
            await self._deny(502, decision.rule or "upstream", str(exc))
            return False
        upstream = _Stream(sock)
        counts = [0, 0]
        error: str | None = None
        try:
            await self._send(
                h11.Response(status_code=200, headers=[], reason=b"Connection established")
            )
            pending, closed = self.h11.trailing_data
            error = await self._relay(
                action, obs_id, sock, pending=pending, client_closed=closed, counts=counts
            )
        except (OSError, _Closed) as exc:
            error = repr(exc)
        finally:
            upstream.close()
            detail: dict[str, Any] = {"address": address}
            if error:
                detail["error"] = error
            self._outcome(obs_id, counts, started, detail)
        return False

    async def _relay(
        self,
        action: NetConnect,
        obs_id: int,
        upstream: socket.socket,
        *,
        pending: bytes,
        client_closed: bool,
        counts: list[int],
    ) -> str | None:
        loop = self.loop
        client = self.sock
        idle = self.limits.tunnel_idle_timeout_s

        def pump(src: socket.socket, dst: socket.socket, index: int) -> asyncio.Task[None]:
            return asyncio.create_task(
                relay.pump(src, dst, counts, index, idle_s=idle, bufsize=_RECV)
            )

        down = pump(upstream, client, 1)
        try:
            if self.limits.sni_check:
                refusal = await self._check_sni(action, obs_id, pending, client_closed)
                if isinstance(refusal, str):
                    return refusal
                pending = refusal
            if pending:
                counts[0] += len(pending)
                await loop.sock_sendall(upstream, pending)
            if client_closed:
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_WR)
                await down
                return None
            up = pump(client, upstream, 0)
            try:
                return await relay.first_failure(up, down)
            finally:
                up.cancel()
                await asyncio.gather(up, return_exceptions=True)
        finally:
            down.cancel()
            await asyncio.gather(down, return_exceptions=True)
        return None

    async def _check_sni(
        self, action: NetConnect, obs_id: int, pending: bytes, client_closed: bool
    ) -> bytes | str:
        """Read the client's first bytes; the bytes to forward, or why the tunnel ends."""
        data = pending
        # Waiting for the client's first byte is just an idle tunnel (server-
        # first protocols); once a ClientHello has begun it must complete.
        while True:
            status, sni = client_hello_sni(data)
            if status != "incomplete" or client_closed:
                break
            wait = self.limits.header_timeout_s if data else self.limits.tunnel_idle_timeout_s
            try:
                async with asyncio.timeout(wait):
                    chunk = await self.loop.sock_recv(self.sock, _RECV)
            except TimeoutError:
                return "client sent no complete first TLS record in time"
            if not chunk:
                client_closed = True
                break
            data += chunk
        if status == "ok" and sni is not None and sni != action.host:
            reason = f"TLS server name {sni} differs from CONNECT host {action.host}"
            rule = "sni-mismatch"
        elif status == "malformed":
            reason, rule = "malformed TLS ClientHello", "sni-malformed"
        else:
            return data
        with contextlib.suppress(Exception):
            await self._record(action, Decision("deny", rule, reason), {"sni": sni}, cause=obs_id)
        return reason
