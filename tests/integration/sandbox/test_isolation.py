"""M1, M2, M3, M4: what the sandboxed command can read, write and reach.

Each test plants something on the host, attacks it from inside, and checks
the effect on the host (canary content in the output, files on the host,
hits on a host server).
"""

from __future__ import annotations

import http.server
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox]


def test_home_canary_unreadable(corral_exec: ExecFn, host_canary: tuple[Path, str]) -> None:
    path, secret = host_canary
    out = corral_exec("sh", "-c", f"cat {path}; cat ~/{path.name}; ls -la {path.parent}")
    assert secret not in out.stdout + out.stderr


def test_root_ssh_canary_unreadable(corral_exec: ExecFn) -> None:
    ssh = Path("/root/.ssh")
    created_dir = not ssh.exists()
    ssh.mkdir(mode=0o700, exist_ok=True)
    secret = f"SSH-CANARY-{secrets.token_hex(8)}"
    canary = ssh / f"corral_test_key_{secrets.token_hex(4)}"
    canary.write_text(secret)
    try:
        out = corral_exec(
            "sh", "-c", f"cat {canary}; cat /root/.ssh/*; find / -name '{canary.name}' 2>/dev/null"
        )
        assert secret not in out.stdout + out.stderr
        assert canary.name not in out.stdout
    finally:
        canary.unlink()
        if created_dir:
            ssh.rmdir()


def test_symlink_planted_in_workspace_does_not_reach_host(
    corral_exec: ExecFn, workspace: Path, host_canary: tuple[Path, str]
) -> None:
    path, secret = host_canary
    (workspace / "link").symlink_to(path)
    (workspace / "dirlink").symlink_to(path.parent)
    out = corral_exec("sh", "-c", f"cat link; cat dirlink/{path.name}; cat /proc/self/root{path}")
    assert secret not in out.stdout + out.stderr


def test_hard_link_to_host_file_cannot_be_made(corral_exec: ExecFn, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    secret = f"HL-{secrets.token_hex(6)}"
    outside.write_text(secret)
    out = corral_exec("sh", "-c", f"ln {outside} hl; cat hl; cat {outside}")
    assert secret not in out.stdout


def test_writes_outside_workspace_do_not_reach_host(corral_exec: ExecFn, workspace: Path) -> None:
    name = f"corral-escape-{secrets.token_hex(4)}"
    targets = [
        workspace.parent / name,
        Path("/usr") / name,
        Path("/etc") / name,
        Path(os.path.expanduser("~")) / name,
        Path("/tmp") / name,
        Path("/var/tmp") / name,
    ]
    script = "; ".join(f"echo x > {t}" for t in targets) + "; echo inside > ok.txt"
    out = corral_exec("sh", "-c", script)
    for t in targets:
        assert not t.exists(), f"{t} was written on the host"
    assert (workspace / "ok.txt").read_text() == "inside\n"
    assert out.summary["reason"] == "exited"


def test_caller_secrets_absent_from_environment(corral_exec: ExecFn) -> None:
    secret = f"ENV-{secrets.token_hex(8)}"
    env = dict(os.environ, CORRAL_TEST_SECRET=secret, AWS_SECRET_ACCESS_KEY=secret)
    out = corral_exec(
        "sh", "-c", "env; cat /proc/*/environ | tr '\\0' '\\n'; cat /proc/*/cmdline", env=env
    )
    assert out.code == 0, out.stderr
    assert secret not in out.stdout
    assert "CORRAL_TEST_SECRET" not in out.stdout


class _SecretHandler(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []
    secret: ClassVar[str] = ""

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        body = self.secret.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def host_http() -> Iterator[tuple[int, str, list[str]]]:
    secret = f"HTTP-CANARY-{secrets.token_hex(8)}"

    class handler(_SecretHandler):
        hits: ClassVar[list[str]] = []

    handler.secret = secret
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], secret, handler.hits
    finally:
        server.shutdown()
        server.server_close()


def test_host_loopback_http_unreachable(
    corral_exec: ExecFn, host_http: tuple[int, str, list[str]]
) -> None:
    port, secret, hits = host_http
    code = (
        "import urllib.request, sys\n"
        f"for h in ('127.0.0.1', 'localhost', '[::1]', '0.0.0.0'):\n"
        "    try:\n"
        f"        url = f'http://{{h}}:{port}/'\n"
        "        print(urllib.request.urlopen(url, timeout=2).read().decode())\n"
        "    except Exception as e:\n"
        "        print('blocked', h, type(e).__name__)\n"
    )
    out = corral_exec("python3", "-c", code)
    assert secret not in out.stdout
    assert hits == []


def test_host_abstract_unix_socket_unreachable(corral_exec: ExecFn) -> None:
    name = f"corral-test-{secrets.token_hex(6)}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(1)
    srv.settimeout(0.1)
    try:
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "try:\n"
            f"    s.connect('\\0{name}'); print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('blocked', e)\n"
        )
        out = corral_exec("python3", "-c", code)
        assert "CONNECTED" not in out.stdout
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()


def test_no_dns(corral_exec: ExecFn) -> None:
    # A canary resolver on host loopback must see no query.
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.2)
    port = udp.getsockname()[1]
    code = (
        "import socket\n"
        "for name in ('example.com', 'pypi.org'):\n"
        "    try:\n"
        "        print('RESOLVED', socket.getaddrinfo(name, 443))\n"
        "    except OSError as e:\n"
        "        print('no dns', e)\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.sendto(b'query', ('127.0.0.1', {port}))\n"
    )
    try:
        out = corral_exec("python3", "-c", code)
        assert "RESOLVED" not in out.stdout
        with pytest.raises(TimeoutError):
            udp.recvfrom(100)
    finally:
        udp.close()


def test_only_loopback_interface(corral_exec: ExecFn) -> None:
    out = corral_exec("cat", "/proc/net/dev")
    ifaces = {line.split(":")[0].strip() for line in out.stdout.splitlines() if ":" in line}
    assert ifaces == {"lo"}


def test_no_new_files_in_dev(corral_exec: ExecFn) -> None:
    """A sandbox cannot plant files in /dev (e.g. a fake /dev/kmsg); devices still work."""
    out = corral_exec(
        "sh",
        "-c",
        "echo x > /dev/kmsg && echo PLANTED; echo ok > /dev/null && echo null-ok; "
        "echo shm > /dev/shm/f && cat /dev/shm/f",
    )
    assert "PLANTED" not in out.stdout
    assert "null-ok" in out.stdout
    assert "shm" in out.stdout
