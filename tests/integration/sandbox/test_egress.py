"""M3/M4/M10 through `corral exec`: the broker is the only way out, and it fails closed.

Host HTTP servers listen on 127.0.0.1; the broker's test resolver maps names
like `allowed.test` to them, so nothing leaves the machine.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from corral.broker.journal import read_rows
from corral.errors import JournalError

from .conftest import ExecFn, corral_argv, parse_summary

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_curl]


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []
    body: ClassVar[bytes] = b"hello from upstream\n"
    slow: ClassVar[bool] = False

    def do_GET(self) -> None:
        type(self).seen.append(
            {"path": self.path, **{k.lower(): v for k, v in self.headers.items()}}
        )
        if self.path.startswith("/big"):
            self.send_response(200)
            self.send_header("Content-Length", str(50 * 1024 * 1024))
            self.end_headers()
            try:
                for _ in range(50 * 1024):
                    self.wfile.write(b"x" * 1024)
                    time.sleep(0.0005)
            except OSError:
                return
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[dict[str, str]]]]:
    class handler(_Recorder):
        seen: ClassVar[list[dict[str, str]]] = []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server.server_address[1], handler.seen
    finally:
        server.shutdown()
        server.server_close()


def _config(tmp_path: Path, port: int, extra: str = "") -> Path:
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        'resolver_overrides = { "allowed.test" = "127.0.0.1", "rebind.test" = "127.0.0.1", '
        '"other.test" = "127.0.0.1" }\n'
        "system_dns = false\n"
        f'[[rules]]\nid = "test-upstream"\nhost = "allowed.test"\nports = [{port}]\n'
        "allow_private = true\n"
        f'[[rules]]\nid = "no-private"\nhost = "rebind.test"\nports = [{port}]\n' + extra
    )
    return cfg


def _curl(url: str) -> str:
    return f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}\\n' {url} 2>&1 || true"


def test_no_egress_without_allow(
    corral_exec: ExecFn, upstream: tuple[int, list[dict[str, str]]]
) -> None:
    port, seen = upstream
    out = corral_exec("sh", "-c", _curl(f"http://127.0.0.1:{port}/") + "; env")
    assert "PROXY" not in out.stdout.upper().replace("NO_PROXY", "")
    assert seen == []
    layers = out.summary["layers"]
    assert isinstance(layers, dict) and "broker" not in layers


def test_allowlisted_reachable_others_denied_and_journaled(
    corral_exec: ExecFn, upstream: tuple[int, list[dict[str, str]]], tmp_path: Path
) -> None:
    port, seen = upstream
    journal = tmp_path / "j.sqlite"
    cfg = _config(tmp_path, port)
    exfil = f"EXFIL-{secrets.token_hex(6)}"
    script = "; ".join(
        [
            _curl(f"-H 'X-Exfil: {exfil}' http://allowed.test:{port}/ok"),
            _curl(f"http://other.test:{port}/no"),
            _curl(f"http://rebind.test:{port}/rebind"),
            _curl(f"http://127.0.0.1:{port}/direct"),
        ]
    )
    out = corral_exec("sh", "-c", script, opts=("--config", str(cfg), "--journal", str(journal)))
    codes = out.stdout.split()
    assert codes[:3] == ["200", "403", "403"], out.stdout
    assert [s["path"] for s in seen] == ["/ok"]
    rows = [r for r in read_rows(journal) if r.kind != "process_event"]
    decisions = [(r.target, r.decision) for r in rows]
    assert (f"GET http://allowed.test:{port}/ok", "allow") in decisions
    # Data leaving in a header of an allowed request is journaled (allowed-but-observed).
    allowed_row = next(r for r in rows if r.decision == "allow")
    assert ["x-exfil", exfil] in allowed_row.detail["headers"]
    assert any(t.startswith("GET http://other.test") and d == "deny" for t, d in decisions)
    assert any(t.startswith("GET http://rebind.test") and d == "deny" for t, d in decisions)
    assert out.summary["observations"] == {
        "allowed": 1,
        "denied": sum(d == "deny" for _, d in decisions),
    }
    layers = out.summary["layers"]
    assert isinstance(layers, dict) and layers["broker"] is True


def test_injected_credential_reaches_upstream_but_not_sandbox(
    workspace: Path, upstream: tuple[int, list[dict[str, str]]], tmp_path: Path
) -> None:
    port, seen = upstream
    journal = tmp_path / "j.sqlite"
    secret = f"sk-test-{secrets.token_hex(12)}"
    cfg = _config(
        tmp_path,
        port,
        (
            f'[routes.llm]\nupstream = "http://127.0.0.1:{port}"\nallow_private = true\n'
            'inject_header = { "x-api-key" = "env:CORRAL_TEST_API_KEY" }\n'
        ),
    )
    script = (
        "curl -sS -m 5 -H 'x-api-key: dummy' http://127.0.0.1:3128/routes/llm/v1/messages; "
        "env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
        "grep -r sk-test /home /tmp /etc /run 2>/dev/null"
    )
    proc = subprocess.run(
        corral_argv(
            "--workspace",
            str(workspace),
            "--config",
            str(cfg),
            "--journal",
            str(journal),
            "--json",
            "--",
            "sh",
            "-c",
            script,
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, CORRAL_TEST_API_KEY=secret),
    )
    assert "hello from upstream" in proc.stdout, proc.stderr
    assert [s.get("x-api-key") for s in seen] == [secret]
    assert secret not in proc.stdout
    assert secret not in proc.stderr
    rows = read_rows(journal)
    route_rows = [r for r in rows if r.kind == "provider_call"]
    assert route_rows and ["x-api-key", "<stripped>"] in route_rows[0].detail["headers"]
    assert secret not in json.dumps([r.to_json_dict() for r in rows])


def test_config_in_workspace_refused(workspace: Path, tmp_path: Path) -> None:
    cfg = workspace / "corral.toml"
    cfg.write_text('allow = ["example.com"]\n')
    proc = subprocess.run(
        corral_argv("--workspace", str(workspace), "--config", str(cfg), "--", "true"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "inside the workspace" in proc.stderr


def test_broker_death_cuts_egress(
    workspace: Path, upstream: tuple[int, list[dict[str, str]]], tmp_path: Path
) -> None:
    """SIGKILL the broker during a download: the transfer dies and nothing gets out afterwards."""
    port, seen = upstream
    cfg = _config(tmp_path, port)
    journal = tmp_path / "j.sqlite"
    script = (
        f"curl -sS -m 20 -o /dev/null http://allowed.test:{port}/big; echo first=$?; "
        "sleep 0.5; "
        f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' http://allowed.test:{port}/after; "
        "echo second=$?"
    )
    with subprocess.Popen(
        corral_argv(
            "--workspace",
            str(workspace),
            "--config",
            str(cfg),
            "--journal",
            str(journal),
            "--json",
            "--",
            "sh",
            "-c",
            script,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        broker_pid = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and broker_pid is None:
            try:
                rows = read_rows(journal)
            except JournalError:
                rows = []
            for row in rows:
                if row.target.startswith("broker_start"):
                    broker_pid = int(row.target.split("pid=")[1].split()[0])
            if not any(s["path"] == "/big" for s in seen):
                broker_pid = None
            time.sleep(0.05)
        assert broker_pid is not None, "the download never started"
        os.kill(broker_pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    assert "first=0" not in stdout, stdout
    assert "second=0" not in stdout or "000" in stdout, stdout
    assert not any(s["path"] == "/after" for s in seen)
    assert read_rows(journal)  # the journal survived the SIGKILL
    summary = parse_summary(stderr)
    assert summary["exit"] == 0
    assert json.dumps(summary)
