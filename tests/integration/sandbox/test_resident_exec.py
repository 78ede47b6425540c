"""Two real `corral exec` sandboxes on one resident broker; its SIGKILL cuts egress.

The resident's socket lives under the test's own XDG_RUNTIME_DIR, so nothing
here shares a broker with anything else on the machine.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from corral.broker.journal import JournalRow, read_rows
from corral.errors import JournalError

from .conftest import corral_argv

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_curl]


class _Upstream(http.server.BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[str]]]:
    class handler(_Upstream):
        paths: ClassVar[list[str]] = []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], handler.paths
    finally:
        server.shutdown()
        server.server_close()


def _config(path: Path, host: str, port: int) -> Path:
    path.write_text(
        'resolver_overrides = { "a.test" = "127.0.0.1", "b.test" = "127.0.0.1" }\n'
        "system_dns = false\n"
        f'[[rules]]\nhost = "{host}"\nports = [{port}]\nallow_private = true\n'
    )
    return path


def _curl(url: str) -> str:
    return f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}\\n' {url} 2>/dev/null || true"


def _broker_pid(journal: Path) -> int | None:
    with contextlib.suppress(JournalError):
        for row in read_rows(journal):
            if row.target.startswith("broker_start") and row.detail.get("resident"):
                return int(row.target.split("pid=")[1].split()[0])
    return None


def _wait_pid(journal: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        pid = _broker_pid(journal)
        if pid is not None:
            return pid
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no resident broker_start in {journal}: {proc.communicate()}")


def _traffic(rows: list[JournalRow]) -> set[tuple[str | None, str, str]]:
    return {(r.session, r.target, r.decision) for r in rows if r.target.startswith("GET ")}


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[dict[str, str]]:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(rt), "CORRAL_BROKER": "resident"}
    yield env
    # Teardown: the resident of this test is ours to end.
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "resident" in cmd and any(str(rt) in part for part in cmd):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


def test_two_execs_share_one_resident_each_with_its_policy_and_journal(
    tmp_path: Path, upstream: tuple[int, list[str]], runtime: dict[str, str]
) -> None:
    port, paths = upstream
    runs = []
    for name, host, other in (("a", "a.test", "b.test"), ("b", "b.test", "a.test")):
        ws = tmp_path / f"ws-{name}"
        ws.mkdir(mode=0o700)
        cfg = _config(tmp_path / f"{name}.toml", host, port)
        script = (
            "sleep 1; "
            + _curl(f"http://{host}:{port}/{name}-own")
            + "; "
            + _curl(f"http://{other}:{port}/{name}-other")
        )
        argv = corral_argv(
            "--workspace", str(ws), "--config", str(cfg), "--session", f"s-{name}",
            "--journal", str(tmp_path / f"{name}.sqlite"), "--", "sh", "-c", script,
        )  # fmt: skip
        runs.append(
            subprocess.Popen(argv, env=runtime, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    outs = [p.communicate(timeout=120) for p in runs]
    for proc, (out, err) in zip(runs, outs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert out.decode().split() == ["200", "403"], (out, err)
    assert sorted(paths) == ["/a-own", "/b-own"]
    pid_a, pid_b = _broker_pid(tmp_path / "a.sqlite"), _broker_pid(tmp_path / "b.sqlite")
    assert pid_a is not None and pid_a == pid_b, "one resident served both sandboxes"
    assert _traffic(read_rows(tmp_path / "a.sqlite")) == {
        ("s-a", f"GET http://a.test:{port}/a-own", "allow"),
        ("s-a", f"GET http://b.test:{port}/a-other", "deny"),
    }
    assert _traffic(read_rows(tmp_path / "b.sqlite")) == {
        ("s-b", f"GET http://b.test:{port}/b-own", "allow"),
        ("s-b", f"GET http://a.test:{port}/b-other", "deny"),
    }


def test_sigkill_of_the_resident_cuts_egress_with_a_clear_error(
    tmp_path: Path, upstream: tuple[int, list[str]], runtime: dict[str, str]
) -> None:
    port, paths = upstream
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o700)
    cfg = _config(tmp_path / "a.toml", "a.test", port)
    journal = tmp_path / "j.sqlite"
    flag = ws / "go"
    # curl's exit status tells a refused connection (7) from one that hung
    # in a stale listener's backlog until the timeout (28).
    script = (
        _curl(f"http://a.test:{port}/before")
        + "; while [ ! -e go ]; do sleep 0.05; done; "
        + f"curl -sS -m 5 -o /dev/null http://a.test:{port}/after 2>/dev/null; echo rc=$?"
    )
    argv = corral_argv(
        "--workspace", str(ws), "--config", str(cfg), "--journal", str(journal),
        "--", "sh", "-c", script,
    )  # fmt: skip
    with subprocess.Popen(
        argv, env=runtime, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        pid = _wait_pid(journal, proc)
        deadline = time.monotonic() + 60
        while "/before" not in paths and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        flag.touch()
        out, err = proc.communicate(timeout=120)
    assert out.split() == ["200", "rc=7"], (out, err)
    assert paths == ["/before"], "a request got out after the broker died"
    assert f"the resident broker (pid {pid}) died" in err

    # A later sandbox gets a fresh resident, and egress again.
    ws2 = tmp_path / "ws2"
    ws2.mkdir(mode=0o700)
    j2 = tmp_path / "j2.sqlite"
    later = subprocess.run(
        corral_argv("--workspace", str(ws2), "--config", str(cfg), "--journal", str(j2),
                    "--", "sh", "-c", _curl(f"http://a.test:{port}/later")),
        env=runtime, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert later.stdout.split() == ["200"], later.stderr
    fresh = _broker_pid(j2)
    assert fresh is not None and fresh != pid
