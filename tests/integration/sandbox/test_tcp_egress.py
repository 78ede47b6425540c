"""Raw TCP through the broker (SOCKS5, ssh ProxyCommand) and host services, in `corral exec`.

Real clients inside the sandbox (curl's telnet:// over `ALL_PROXY=socks5h`,
git over ssh with the ProxyCommand corral configures) against servers on the
host's loopback; every assertion is on the host side: what the servers saw,
what the journal holds.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from corral.broker.journal import JournalRow, read_rows

from .conftest import ExecFn, wait_for

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl missing"),
]


@dataclass
class EchoServer:
    """Answers `echo:<first chunk>` and closes; counts the connections it accepted."""

    sock: socket.socket
    accepted: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.accepted.append(str(peer))
            with conn:
                conn.settimeout(10)
                try:
                    data = conn.recv(4096)
                    conn.sendall(b"echo:" + data)
                except OSError:
                    pass


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = EchoServer(sock)
    threading.Thread(target=server.serve, daemon=True).start()
    yield server
    sock.close()


@pytest.fixture
def web() -> Iterator[tuple[int, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            seen.append(self.headers.get("Host") or "")
            body = b"web-service-answer\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    yield int(server.server_address[1]), seen
    server.shutdown()
    server.server_close()


def _rows(journal: Path, kind: str = "tcp_connect") -> list[JournalRow]:
    return [r for r in read_rows(journal) if r.kind == kind]


def _telnet(target: str, socks: bool = False) -> str:
    # curl skips ALL_PROXY for NO_PROXY's loopback names; `socks` insists on the broker.
    via = "-x \"$ALL_PROXY\" --noproxy '' " if socks else ""
    return f"printf ping | curl -sS -m 10 {via}telnet://{target} 2>&1; echo"


def test_host_service_reached_by_name_not_the_sandbox_loopback(
    corral_exec: ExecFn, echo: EchoServer, web: tuple[int, list[str]], tmp_path: Path
) -> None:
    web_port, web_seen = web
    journal = tmp_path / "j.sqlite"
    script = "; ".join(
        [
            _telnet(f"db.corral.internal:{echo.port}"),
            _telnet(f"host.corral.internal:{echo.port}"),
            f"curl -sS -m 10 http://web.corral.internal:{web_port}/",
            # The sandbox's own loopback stays its own: nothing listens there.
            f"curl -sS -m 5 --noproxy '*' telnet://127.0.0.1:{echo.port} </dev/null"
            " && echo DIRECT-REACHED || echo DIRECT-REFUSED",
        ]
    )
    opts = ("--host-service", f"db={echo.port}", "--host-service", f"web={web_port}")
    out = corral_exec("sh", "-c", script, opts=(*opts, "--journal", str(journal)), timeout=90)
    assert out.code == 0, out.stderr
    assert out.stdout.count("echo:ping") == 2, out.stdout + out.stderr
    assert "web-service-answer" in out.stdout
    assert "DIRECT-REFUSED" in out.stdout
    assert len(echo.accepted) == 2
    assert web_seen == [f"web.corral.internal:{web_port}"]
    rows = _rows(journal)
    assert [(r.target, r.decision, r.rule) for r in rows] == [
        (f"tcp://db.corral.internal:{echo.port}", "allow", "host-service:db"),
        (f"tcp://host.corral.internal:{echo.port}", "allow", "host-service:host"),
    ]
    assert all(r.bytes_up == 4 and r.bytes_down == 9 for r in rows), rows
    http = [r for r in read_rows(journal) if r.kind == "http_request"]
    assert [(r.decision, r.rule) for r in http] == [("allow", "host-service:web")]


def test_socks_to_a_private_address_is_refused(
    corral_exec: ExecFn, echo: EchoServer, tmp_path: Path
) -> None:
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "pvt.test" = "127.0.0.1", "ok.test" = "127.0.0.1" }\n'
        f'[[tcp]]\nhost = "pvt.test"\nport = {echo.port}\n'
        f'[[tcp]]\nhost = "ok.test"\nport = {echo.port}\nallow_private = true\n'
    )
    journal = tmp_path / "j.sqlite"
    script = "; ".join(
        [
            _telnet(f"pvt.test:{echo.port}"),  # a name resolving to loopback
            _telnet(f"127.0.0.1:{echo.port}", socks=True),  # the host's loopback by address
            _telnet(f"[::1]:{echo.port}", socks=True),
            _telnet(f"ok.test:{echo.port}"),  # the positive control: allowed
        ]
    )
    out = corral_exec(
        "sh", "-c", script, opts=("--config", str(cfg), "--journal", str(journal)), timeout=90
    )
    assert out.code == 0, out.stderr
    assert out.stdout.count("echo:ping") == 1, out.stdout
    assert len(echo.accepted) == 1  # only ok.test's
    got = [(r.target, r.decision, r.rule) for r in _rows(journal)]
    assert got == [
        (f"tcp://pvt.test:{echo.port}", "deny", "private-address"),
        (f"tcp://127.0.0.1:{echo.port}", "deny", "default-deny"),
        (f"tcp://[::1]:{echo.port}", "deny", "default-deny"),
        (f"tcp://ok.test:{echo.port}", "allow", f"tcp-allow:ok.test:{echo.port}"),
    ]


def test_no_tcp_rule_means_no_tcp(corral_exec: ExecFn, echo: EchoServer, tmp_path: Path) -> None:
    journal = tmp_path / "j.sqlite"
    script = f"curl -sS -m 10 -x socks5h://127.0.0.1:3128 telnet://pypi.org:{echo.port} </dev/null"
    out = corral_exec(
        "sh", "-c", script, opts=("--allow", "pypi.org", "--journal", str(journal)), timeout=60
    )
    assert out.code != 0
    rows = _rows(journal)
    assert [(r.decision, r.rule) for r in rows] == [("deny", "default-deny")]
    assert echo.accepted == []


def test_allow_of_loopback_is_refused_with_a_pointer(
    corral_exec: ExecFn, echo: EchoServer, tmp_path: Path
) -> None:
    for flag in (f"127.0.0.1:{echo.port}", "localhost", f"[::1]:{echo.port}"):
        out = corral_exec("true", opts=("--allow", flag))
        assert out.code == 2, (flag, out.stderr)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "host_services" in lines[0], out.stderr
    cfg = tmp_path / "corral.toml"
    cfg.write_text(f'allow = ["127.0.0.1:{echo.port}"]\n')
    out = corral_exec("true", opts=("--config", str(cfg)))
    assert out.code == 2 and "host_services" in out.stderr
    out = corral_exec("true", opts=("--host-service", f"host={echo.port}"))
    assert out.code == 2 and "--host-service" in out.stderr
    assert echo.accepted == []


# --- git over ssh -------------------------------------------------------------


@dataclass
class Sshd:
    allowed: int
    other: int
    repo: Path
    key: Path
    log: Path

    def connections_on(self, port: int) -> int:
        lines = self.log.read_text(errors="replace").splitlines()
        return sum(1 for x in lines if x.startswith("Connection from") and f" port {port} " in x)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh-keygen") is None:
        # A missing sshd must not hide the ssh guarantees in a full run.
        if os.environ.get("CORRAL_REQUIRE_ALL") == "1":
            pytest.fail("openssh-server missing: run scripts/install-system.sh")
        pytest.skip("openssh-server missing")
    if os.geteuid() != 0:
        pytest.skip("sshd for the test runs as root")
    # sshd's privilege-separation directory (the Debian service creates it).
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    d = tmp_path / "sshd"
    d.mkdir()
    for name in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True
        )
    (d / "authorized_keys").write_bytes((d / "client.pub").read_bytes())
    cfg = d / "cfg"
    repo = tmp_path / "srv" / "repo.git"
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", "--bare", str(repo)], check=True)
    seed = tmp_path / "seed"
    subprocess.run([*git, "init", "-q", str(seed)], check=True)
    (seed / "README").write_text("over-ssh\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "-C", str(seed), "add", "README"], check=True)
    subprocess.run(["git", "-C", str(seed), *ident, "commit", "-qm", "seed"], check=True)
    subprocess.run(["git", "-C", str(seed), "push", "-q", str(repo), "HEAD:main"], check=True)
    log = d / "log"
    # Chosen just before sshd binds them: the fewer the calls in between, the
    # smaller the chance another socket takes one meanwhile.
    allowed, other = _free_port(), _free_port()
    cfg.write_text(
        f"Port {allowed}\nPort {other}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPidFile none\nLogLevel VERBOSE\n"
    )
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(cfg), "-E", str(log)],
        stdin=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", allowed), timeout=1).close()
            except OSError:
                return False
            return True

        if not wait_for(listening, 10):
            pytest.fail("the test sshd did not start")
        yield Sshd(allowed, other, repo, d / "client", log)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(shutil.which("git") is None, reason="git missing")
def test_git_clone_over_ssh_through_the_broker(
    corral_exec: ExecFn, sshd: Sshd, workspace: Path, tmp_path: Path
) -> None:
    shutil.copy(sshd.key, workspace / "key")
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "git.test" = "127.0.0.1" }\n'
        f'[[tcp]]\nhost = "git.test"\nport = {sshd.allowed}\nallow_private = true\n'
    )
    journal = tmp_path / "j.sqlite"
    ssh_opts = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes"
    script = "\n".join(
        [
            "chmod 600 key",
            f'export GIT_SSH_COMMAND="$GIT_SSH_COMMAND -i $PWD/key {ssh_opts}"',
            f"git clone -q ssh://root@git.test:{sshd.allowed}{sshd.repo} clone && cat clone/README",
            f"if git clone -q ssh://root@git.test:{sshd.other}{sshd.repo} other 2>err;"
            " then echo OTHER-CLONED; else echo OTHER-REFUSED; fi",
            f"if git clone -q ssh://root@127.0.0.1:{sshd.allowed}{sshd.repo} lo 2>err;"
            " then echo LO-CLONED; else echo LO-REFUSED; fi",
        ]
    )
    out = corral_exec(
        "sh", "-c", script, opts=("--config", str(cfg), "--journal", str(journal)), timeout=120
    )
    assert "over-ssh" in out.stdout, out.stdout + out.stderr
    assert "OTHER-REFUSED" in out.stdout and "LO-REFUSED" in out.stdout, out.stdout
    time.sleep(0.2)  # sshd writes its log line after accepting
    # One authenticated session (the readiness probe never authenticates); none on `other`.
    assert sshd.log.read_text().count("Accepted publickey for root") == 1
    assert sshd.connections_on(sshd.other) == 0
    got = [(r.target, r.decision, r.rule) for r in _rows(journal)]
    assert got == [
        (f"tcp://git.test:{sshd.allowed}", "allow", f"tcp-allow:git.test:{sshd.allowed}"),
        (f"tcp://git.test:{sshd.other}", "deny", "default-deny"),
        (f"tcp://127.0.0.1:{sshd.allowed}", "deny", "default-deny"),
    ]
    allowed = _rows(journal)[0]
    assert allowed.bytes_up > 1000 and allowed.bytes_down > 1000  # the ssh session itself


@pytest.mark.skipif(shutil.which("git") is None, reason="git missing")
def test_plain_ssh_and_git_use_the_ssh_config_corral_writes(
    corral_exec: ExecFn, sshd: Sshd, workspace: Path, tmp_path: Path
) -> None:
    """No ProxyCommand option, no GIT_SSH_COMMAND: the sandbox's ssh_config routes them."""
    shutil.copy(sshd.key, workspace / "key")
    host_key = (sshd.key.parent / "host.pub").read_text().split()
    (workspace / "known").write_text(f"[git.test]:{sshd.allowed} {host_key[0]} {host_key[1]}\n")
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "git.test" = "127.0.0.1" }\n'
        f'[[tcp]]\nhost = "git.test"\nport = {sshd.allowed}\nallow_private = true\n'
    )
    journal = tmp_path / "j.sqlite"
    url = f"ssh://root@git.test:{sshd.allowed}"
    script = "\n".join(
        [
            "unset GIT_SSH_COMMAND CORRAL_SSH_PROXY_COMMAND",
            "mkdir -p ~/.ssh && cp key ~/.ssh/id_ed25519 && cp known ~/.ssh/known_hosts",
            "chmod 700 ~/.ssh && chmod 600 ~/.ssh/id_ed25519",
            f"ssh -T {url} echo plain-ssh-reached </dev/null",
            f"git clone -q {url}{sshd.repo} clone && cat clone/README",
            # The file is corral's, read-only: the sandbox cannot rewrite it.
            "echo 'Host *' >> /etc/ssh/ssh_config 2>/dev/null && echo CONFIG-WRITTEN"
            " || echo CONFIG-READONLY",
        ]
    )
    out = corral_exec(
        "sh", "-c", script, opts=("--config", str(cfg), "--journal", str(journal)), timeout=120
    )
    assert "plain-ssh-reached" in out.stdout, out.stdout + out.stderr
    assert "over-ssh" in out.stdout, out.stdout + out.stderr
    assert "CONFIG-READONLY" in out.stdout, out.stdout
    time.sleep(0.2)  # sshd writes its log line after accepting
    assert sshd.log.read_text().count("Accepted publickey for root") == 2
    got = [(r.target, r.decision) for r in _rows(journal)]
    assert got == [(f"tcp://git.test:{sshd.allowed}", "allow")] * 2


def test_no_tcp_rule_means_no_ssh_config(corral_exec: ExecFn, tmp_path: Path) -> None:
    out = corral_exec(
        "sh", "-c", "cat /etc/ssh/ssh_config || echo NO-CONFIG", opts=("--allow", "pypi.org")
    )
    assert "NO-CONFIG" in out.stdout and "ProxyCommand" not in out.stdout, out.stdout
