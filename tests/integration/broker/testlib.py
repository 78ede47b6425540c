"""Real servers, a throwaway CA and a broker handle for the broker's integration tests."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from corral.broker.config import BrokerConfig
from corral.broker.journal import JournalRow, read_rows
from corral.broker.process import BrokerProcess, start_broker

Body = bytes | Iterable[bytes]
Reply = tuple[int, list[tuple[str, str]], Body]


@dataclass(frozen=True)
class Hit:
    """One request a test server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Hit], Reply]


def _default(hit: Hit) -> Reply:
    return 200, [("Content-Type", "text/plain")], f"ok {hit.method} {hit.path}\n".encode()


class RecordingServer:
    """A threaded HTTP(S) server on 127.0.0.1 that records every request.

    `routes` maps a path prefix to a handler (longest prefix wins). A body
    that is an iterable is streamed without a length and the connection
    closed after it.
    """

    def __init__(
        self, routes: dict[str, Handler] | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.routes = dict(routes or {})
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _serve(self) -> None:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    body = self._read_chunked()
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(length) if length else b""
                hit = Hit(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with outer._lock:
                    outer.hits.append(hit)
                handler: Handler = _default
                best = -1
                for prefix, h in outer.routes.items():
                    if self.path.startswith(prefix) and len(prefix) > best:
                        handler, best = h, len(prefix)
                status, headers, payload = handler(hit)
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                if isinstance(payload, bytes):
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    for chunk in payload:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except OSError:
                    return

            def _read_chunked(self) -> bytes:
                parts: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _serve

        class _Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def finish_request(self, request: Any, client_address: Any) -> None:
                if tls is None:
                    super().finish_request(request, client_address)
                    return
                try:
                    wrapped = tls.wrap_socket(request, server_side=True)
                except (OSError, ssl.SSLError):
                    return
                # The wrapper owns the descriptor now; socketserver would
                # only close the detached original.
                with wrapped:
                    super().finish_request(wrapped, client_address)

        self._server = _Server(("127.0.0.1", 0), _Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def hits_for(self, prefix: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if h.path.startswith(prefix)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass(frozen=True)
class ThrowawayCA:
    """A throwaway CA and one server certificate for the `*.test` names used here."""

    ca_pem: Path
    cert_pem: Path
    key_pem: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_pem, self.key_pem)
        return ctx


TLS_NAMES = ("secure.test", "pypi.test", "api.provider.test", "other.test", "localhost")


def make_ca(directory: Path) -> ThrowawayCA:
    """Generate the CA and a server certificate with the openssl CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_pem = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "srv.key", directory / "srv.csr", directory / "srv.pem"
    ext = directory / "srv.ext"
    sans = ",".join([*(f"DNS:{n}" for n in TLS_NAMES), "IP:127.0.0.1"])
    ext.write_text(
        f"subjectAltName={sans}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    commands = [
        [
            "openssl", "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca_pem),
            "-days", "2", "-subj", "/CN=corral test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash",
        ],
        ["openssl", "req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=secure.test"],
        [
            "openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext),
        ],
    ]  # fmt: skip
    for argv in commands:
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return ThrowawayCA(ca_pem, cert, key)


@dataclass
class RunningBroker:
    """A broker process under test, with its port and journal."""

    process: BrokerProcess
    port: int
    journal: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rows(self, kind: str | None = None) -> list[JournalRow]:
        return read_rows(self.journal, kind=kind)

    def wait_rows(
        self, predicate: Callable[[list[JournalRow]], bool], timeout: float = 3.0
    ) -> list[JournalRow]:
        """Rows once `predicate` holds (outcomes land shortly after a response)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.rows()
            if predicate(rows) or time.monotonic() > deadline:
                return rows
            time.sleep(0.02)


def launch(
    config: BrokerConfig,
    journal: Path,
    environ: dict[str, str] | None = None,
    listen_fds: tuple[int, ...] = (),
) -> RunningBroker:
    """Start a broker on 127.0.0.1:0 (or the given fds) and wait until it is ready."""
    process = start_broker(
        config,
        journal,
        run="test-run",
        session="s1",
        env="exec",
        listen=() if listen_fds else ("127.0.0.1:0",),
        listen_fds=listen_fds,
        environ=environ,
    )
    ready = process.wait_ready(20.0)
    return RunningBroker(process, ready.tcp_ports[0], journal)


def curl(
    *args: str, proxy: str | None = None, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """Real curl with a clean environment: no proxy variables unless `proxy`."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    argv = ["curl", "-sS", "--max-time", "10", "--noproxy", ""]
    if proxy is not None:
        argv += ["--proxy", proxy]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def header(output: str, name: str) -> str | None:
    """The value of response header `name` in curl `-i`/`-D -` output (last response)."""
    value: str | None = None
    for line in output.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key.strip().lower() == name.lower():
            value = rest.strip()
    return value


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Send `data`, half-close, read until EOF; (reply, closed within `timeout`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return b"".join(chunks), False
            except OSError:
                return b"".join(chunks), True
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
        return b"".join(chunks), False


def slow_chunks(count: int, delay: float, size: int = 1024) -> Iterator[bytes]:
    """A streamed body that takes `count * delay` seconds."""
    for _ in range(count):
        yield b"x" * size
        time.sleep(delay)
