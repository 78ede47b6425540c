"""SOCKS5 (RFC 1928) for raw TCP egress: a sans-IO parser and the broker's handler.

Only what corral needs: method 0 (no authentication) and CONNECT, with
IPv4, IPv6 and domain-name addresses. The parser functions take the bytes
received so far and return either `None` (more bytes needed) or a parsed
message plus how many bytes it used; they raise `SocksError` carrying the
reply code to send. No I/O happens in them.

The broker serves SOCKS5 on its ordinary listener: a connection whose first
byte is 0x05 (never the first byte of an HTTP request line) is SOCKS. A
CONNECT is decided by the `[[tcp]]` policy only (`corral.broker.tcp`): the
broker resolves a name itself and connects only to the addresses the policy
checked, refuses private addresses unless the rule allows them, and journals
the CONNECT when it is decided (kind `tcp_connect`) and the bytes each way
when the stream closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from corral.broker.actions import Observation, ProcessEvent, TcpConnect
from corral.broker.policy import Decision, decide
from corral.broker.relay import first_failure, pump
from corral.errors import BrokerError

if TYPE_CHECKING:
    from corral.broker.proxy import _ClientConnection

__all__ = [
    "REPLY_ADDRESS_TYPE",
    "REPLY_COMMAND",
    "REPLY_FAILURE",
    "REPLY_HOST_UNREACHABLE",
    "REPLY_NOT_ALLOWED",
    "REPLY_OK",
    "ConnectRequest",
    "SocksError",
    "parse_greeting",
    "parse_request",
    "reply",
    "serve_socks",
]

VERSION: Final = 5
METHOD_NONE: Final = 0x00
METHOD_UNACCEPTABLE: Final = 0xFF
CMD_CONNECT: Final = 0x01
ATYP_IPV4: Final = 0x01
ATYP_DOMAIN: Final = 0x03
ATYP_IPV6: Final = 0x04

REPLY_OK: Final = 0x00
REPLY_FAILURE: Final = 0x01
REPLY_NOT_ALLOWED: Final = 0x02
REPLY_HOST_UNREACHABLE: Final = 0x04
REPLY_COMMAND: Final = 0x07
REPLY_ADDRESS_TYPE: Final = 0x08

#: The longest greeting or request a client can send (255 methods; a 255-byte name).
MAX_MESSAGE: Final = 2 + 255 + 4 + 1 + 255 + 2


class SocksError(ValueError):
    """A malformed or unsupported SOCKS message; `code` is the reply to send (None: just close)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """A CONNECT to `host` (a name as sent, or an address in canonical text) and `port`."""

    host: str
    port: int
    address_type: int


def parse_greeting(data: bytes) -> tuple[bool, int] | None:
    """(whether "no authentication" is offered, bytes used), or None for more bytes."""
    if not data:
        return None
    if data[0] != VERSION:
        raise SocksError(f"not SOCKS version 5 (version byte {data[0]})", None)
    if len(data) < 2:
        return None
    count = data[1]
    if count == 0:
        raise SocksError("greeting offers no method", None)
    if len(data) < 2 + count:
        return None
    return METHOD_NONE in data[2 : 2 + count], 2 + count


def parse_request(data: bytes) -> tuple[ConnectRequest, int] | None:
    """The CONNECT request and bytes used, or None for more bytes."""
    if len(data) < 4:
        if data and data[0] != VERSION:
            raise SocksError(f"request version {data[0]}", REPLY_FAILURE)
        return None
    version, command, reserved, atyp = data[0], data[1], data[2], data[3]
    if version != VERSION:
        raise SocksError(f"request version {version}", REPLY_FAILURE)
    if reserved != 0:
        raise SocksError("reserved byte is not zero", REPLY_FAILURE)
    if command != CMD_CONNECT:
        raise SocksError(f"command {command} is not supported (CONNECT only)", REPLY_COMMAND)
    if atyp == ATYP_IPV4:
        end = 4 + 4
        if len(data) < end + 2:
            return None
        host = str(ipaddress.IPv4Address(data[4:end]))
    elif atyp == ATYP_IPV6:
        end = 4 + 16
        if len(data) < end + 2:
            return None
        host = str(ipaddress.IPv6Address(data[4:end]))
    elif atyp == ATYP_DOMAIN:
        if len(data) < 5:
            return None
        length = data[4]
        if length == 0:
            raise SocksError("empty domain name", REPLY_FAILURE)
        end = 5 + length
        if len(data) < end + 2:
            return None
        raw = data[5:end]
        if not raw.isascii():
            raise SocksError("domain name is not ASCII", REPLY_HOST_UNREACHABLE)
        host = raw.decode("ascii")
    else:
        raise SocksError(f"address type {atyp} is not supported", REPLY_ADDRESS_TYPE)
    port = int.from_bytes(data[end : end + 2], "big")
    if port == 0:
        raise SocksError("port 0", REPLY_FAILURE)
    return ConnectRequest(host, port, atyp), end + 2


def reply(code: int, bound: tuple[str, int] = ("0.0.0.0", 0)) -> bytes:
    """A reply carrying `code` and the bound address (IPv4 or IPv6)."""
    address = ipaddress.ip_address(bound[0])
    atyp = ATYP_IPV4 if address.version == 4 else ATYP_IPV6
    return bytes([VERSION, code, 0, atyp]) + address.packed + bound[1].to_bytes(2, "big")


async def _read(conn: _ClientConnection, buffer: bytearray, deadline: float) -> None:
    async with asyncio.timeout_at(deadline):
        data = await conn.client.recv()
    if not data:
        raise BrokerError("client closed during the SOCKS handshake")
    buffer += data
    if len(buffer) > MAX_MESSAGE:
        raise SocksError("handshake too long", None)


async def serve_socks(conn: _ClientConnection, first: bytes) -> None:
    """Serve one SOCKS5 client connection whose first received bytes are `first`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + conn.limits.header_timeout_s
    buffer = bytearray(first)
    try:
        while (greeting := parse_greeting(bytes(buffer))) is None:
            await _read(conn, buffer, deadline)
        offered, used = greeting
        del buffer[:used]
        if not offered:
            await conn.client.sendall(bytes([VERSION, METHOD_UNACCEPTABLE]))
            await _journal_malformed(conn, "no acceptable method (corral offers no authentication)")
            return
        await conn.client.sendall(bytes([VERSION, METHOD_NONE]))
        while (parsed := parse_request(bytes(buffer))) is None:
            await _read(conn, buffer, deadline)
    except SocksError as exc:
        if exc.code is not None:
            with contextlib.suppress(OSError):
                await conn.client.sendall(reply(exc.code))
        await _journal_malformed(conn, str(exc))
        return
    except (BrokerError, TimeoutError):
        return
    request, used = parsed
    pending = bytes(buffer[used:])
    try:
        action = TcpConnect(host=request.host, port=request.port)
    except ValueError as exc:
        await conn.client.sendall(reply(REPLY_HOST_UNREACHABLE))
        await _journal_malformed(conn, f"invalid host: {exc}".splitlines()[0])
        return
    await _connect_and_relay(conn, action, pending)


async def _journal_malformed(conn: _ClientConnection, reason: str) -> None:
    event = ProcessEvent(event="socks_malformed", name="socks5")
    obs = Observation.of(
        event, conn.state.identity, decision="deny", rule="malformed", reason=reason[:200]
    )
    with contextlib.suppress(Exception):
        await conn.state.journal.append(obs)


async def _connect_and_relay(conn: _ClientConnection, action: TcpConnect, pending: bytes) -> None:
    state = conn.state
    ctx = state.context
    detail: dict[str, Any] = {"via": "socks5"}
    policy = state.tcp_policy
    if policy is None:
        decision = Decision("deny", "default-deny", "no [[tcp]] rule: raw TCP is not allowed")
    else:
        decision = decide(action, ctx, policy)
        if decision.verdict == "resolve" and decision.resolve_host is not None:
            try:
                addresses = await state.resolver.resolve(decision.resolve_host, action.port)
            except BrokerError as exc:
                decision = Decision("deny", decision.rule, str(exc))
            else:
                detail["resolved"] = list(addresses)
                decision = decide(action, ctx.with_addresses(addresses), policy)
        if decision.verdict == "resolve":
            decision = Decision("deny", "policy-error", "policy asked to resolve twice")
    if decision.allowed and any(
        (a, action.port) in state.own_endpoints for a in decision.addresses
    ):
        decision = Decision("deny", "broker-self", "the broker does not connect to itself")
    obs = Observation.of(
        action,
        state.identity,
        decision="allow" if decision.allowed else "deny",
        rule=decision.rule,
        reason=decision.reason,
        detail=detail,
    )
    try:
        obs_id = await state.journal.append(obs)
    except Exception:
        with contextlib.suppress(OSError):
            await conn.client.sendall(reply(REPLY_FAILURE))
        return
    if not decision.allowed:
        with contextlib.suppress(OSError):
            await conn.client.sendall(reply(REPLY_NOT_ALLOWED))
        return
    from corral.broker.proxy import _connect

    started = time.monotonic()
    try:
        upstream, address = await _connect(
            decision.addresses, action.port, conn.limits.connect_timeout_s
        )
    except BrokerError as exc:
        conn._outcome(obs_id, (0, 0), started, {"error": str(exc)})
        with contextlib.suppress(OSError):
            await conn.client.sendall(reply(REPLY_HOST_UNREACHABLE))
        return
    counts = [0, 0]
    error: str | None = None
    try:
        bound = upstream.getsockname()[:2]
        await conn.client.sendall(reply(REPLY_OK, (str(bound[0]), int(bound[1]))))
        if pending:
            counts[0] += len(pending)
            await asyncio.get_running_loop().sock_sendall(upstream, pending)
        error = await _relay(conn, conn.sock, upstream, counts)
    except OSError as exc:
        error = repr(exc)
    finally:
        upstream.close()
        out: dict[str, Any] = {"address": address, "via": "socks5"}
        if error:
            out["error"] = error
        conn._outcome(obs_id, counts, started, out)


async def _relay(
    conn: _ClientConnection, client: socket.socket, upstream: socket.socket, counts: list[int]
) -> str | None:
    idle = conn.limits.tunnel_idle_timeout_s
    up = asyncio.create_task(pump(client, upstream, counts, 0, idle_s=idle, bufsize=65536))
    down = asyncio.create_task(pump(upstream, client, counts, 1, idle_s=idle, bufsize=65536))
    try:
        return await first_failure(up, down)
    except (OSError, TimeoutError) as exc:
        return repr(exc)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
    return None
