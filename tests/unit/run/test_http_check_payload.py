"""`_payload/http_check.py` and `_payload/check_run.py` against a loopback server.

The payload programs run as they do in a verifier (`python3 -I FILE JSON`),
as child processes, against a tiny server this test starts on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from corral._payload import path as payload_path
from corral.run.checkspec import HttpStep, http_payload

HTTP_CHECK = payload_path("http_check.py")
CHECK_RUN = payload_path("check_run.py")
BLOB = bytes(range(256)) * 40


class _Handler(BaseHTTPRequestHandler):
    todos: ClassVar[list[dict[str, Any]]] = []
    seen: ClassVar[list[tuple[str, str, dict[str, str]]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json", **h: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in h.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, dict(self.headers.items())))
        if self.path == "/blob":
            self._send(200, BLOB, "application/octet-stream")
        elif self.path.startswith("/todos/"):
            tid = self.path.rsplit("/", 1)[1]
            match = [t for t in self.todos if str(t["id"]) == tid]
            if match:
                self._send(200, json.dumps(match[0]).encode())
            else:
                self._send(404, b'{"error": "no such todo"}')
        elif self.path == "/todos":
            self._send(200, json.dumps({"items": self.todos}).encode())
        else:
            self._send(200, b"ok", "text/plain")

    def do_POST(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        doc = json.loads(self.rfile.read(n))
        self.seen.append(("POST", self.path, dict(self.headers.items())))
        if self.path == "/nope":
            self._send(501, b"not implemented", "text/plain")
            return
        item = {"id": len(self.todos) + 1, "title": doc["title"]}
        self.todos.append(item)
        self._send(201, json.dumps(item).encode(), location=f"/todos/{item['id']}")


@pytest.fixture
def port() -> Iterator[int]:
    _Handler.todos, _Handler.seen = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _check(port: int, *steps: dict[str, Any]) -> tuple[int, str]:
    doc = http_payload(tuple(HttpStep.model_validate(s) for s in steps), port, 5.0)
    p = subprocess.run(
        [sys.executable, "-I", HTTP_CHECK, json.dumps(doc)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return p.returncode, p.stdout.strip()


def test_status_mismatch_is_the_reason(port: int) -> None:
    rc, line = _check(port, {"http": "POST /nope", "body": '{"title": "x"}', "expect_status": 201})
    assert rc == 1 and line.startswith("POST /nope: status 501, expected 201"), line


def test_header_regex_and_json_assertions(port: int) -> None:
    ok = {
        "http": "POST /todos",
        "body": '{"title": "buy milk"}',
        "expect_status": 201,
        "expect_headers": {"Content-Type": "^application/json$", "location": r"^/todos/\d+$"},
        "expect_regex": r'"id":\s*1\b',
        "expect_json": {"$.title": "buy milk", "$.id": 1},
    }
    rc, line = _check(port, ok)
    assert rc == 0 and line.startswith("POST /todos: status 201"), line


def test_each_assertion_fails_with_its_own_reason(port: int) -> None:
    base = {"http": "GET /todos", "expect_status": 200}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"expect_headers": {"content-type": "^text/html"}}, "header content-type"),
        ({"expect_regex": "^never$"}, "body did not match /^never$/"),
        ({"expect_json": {"$.items[0].title": "x"}}, "$.items[0].title is missing"),
        ({"expect_json": {"$.items": {}}}, "$.items is '[]', expected '{}'"),
        ({"expect_body": "zzz"}, "body lacks 'zzz'"),
    ]
    for extra, want in cases:
        rc, line = _check(port, {**base, **extra})
        assert rc == 1 and want in line, (extra, line)


def test_binary_sha256_and_size(port: int) -> None:
    good = hashlib.sha256(BLOB).hexdigest()
    rc, line = _check(port, {"http": "GET /blob", "expect_sha256": good, "expect_size": len(BLOB)})
    assert rc == 0, line
    rc, line = _check(port, {"http": "GET /blob", "expect_sha256": "0" * 64})
    assert rc == 1 and "body sha256" in line, line
    rc, line = _check(port, {"http": "GET /blob", "expect_size": 3})
    assert rc == 1 and f"body is {len(BLOB)} bytes, expected 3" in line, line


def test_steps_use_captured_values(port: int) -> None:
    steps = (
        {
            "http": "POST /todos",
            "body": '{"title": "first"}',
            "expect_status": 201,
            "capture": {"first": "$.id"},
        },
        {
            "http": "POST /todos",
            "body": '{"title": "after ${first}"}',
            "expect_status": 201,
            "capture": {"loc": "header:location", "word": 'regex:"title": "(\\w+)'},
        },
        {"http": "GET ${loc}", "expect_json": {"$.title": "after 1"}},
        {
            "http": "GET /todos/${first}",
            "headers": {"x-word": "${word}"},
            "expect_json": {"$.title": "first"},
        },
    )
    rc, line = _check(port, *steps)
    assert rc == 0 and line.startswith("4 steps passed"), line
    # The server saw the substituted values, host side.
    assert [s[1] for s in _Handler.seen] == ["/todos", "/todos", "/todos/2", "/todos/1"]
    assert _Handler.seen[-1][2].get("X-Word") == "after"
    rc, line = _check(port, steps[0], {"http": "GET /todos/${first}", "expect_status": 201})
    assert rc == 1 and line.startswith("step 2/2: GET /todos/3: status 200, expected 201"), line


def test_captured_value_is_bounded(port: int) -> None:
    big = "x" * 5000
    steps = (
        {
            "http": "POST /todos",
            "body": json.dumps({"title": big}),
            "expect_status": 201,
            "capture": {"t": "$.title"},
        },
        {"http": "GET /todos/${t}"},
    )
    rc, line = _check(port, *steps)
    assert rc == 1 and "longer than 1024 characters" in line, line
    assert len(_Handler.seen) == 1  # the oversized value was never sent on


def _runner(tmp_path: Path, **doc: Any) -> tuple[int, str]:
    reason = tmp_path / "reason.txt"
    full = {"setup": None, "teardown": None, "http": False, "timeout": 5.0, **doc}
    full["reason"] = str(reason)
    p = subprocess.run(
        [sys.executable, "-I", CHECK_RUN, json.dumps(full)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    return p.returncode, reason.read_text().strip()


def test_setup_runs_first_and_teardown_always(tmp_path: Path) -> None:
    log = tmp_path / "log"
    rc, why = _runner(
        tmp_path,
        setup=f"echo setup >> {log}",
        main=["/bin/sh", "-c", f"echo main >> {log}; echo 'wanted 3 rows, got 2'; exit 3"],
        teardown=f"echo teardown >> {log}",
    )
    assert rc == 1 and why == "exit 3: wanted 3 rows, got 2"
    assert log.read_text().split() == ["setup", "main", "teardown"]


def test_teardown_runs_after_a_failed_setup_and_a_timeout(tmp_path: Path) -> None:
    log = tmp_path / "log"
    rc, why = _runner(
        tmp_path,
        setup="exit 7",
        main=["/bin/sh", "-c", f"echo main >> {log}"],
        teardown=f"echo teardown >> {log}",
    )
    assert (rc, why) == (1, "setup exit 7")
    assert log.read_text().split() == ["teardown"]
    log.unlink()
    rc, why = _runner(
        tmp_path,
        timeout=0.5,
        main=["/bin/sh", "-c", "sleep 60 & wait"],
        teardown=f"echo teardown >> {log}",
    )
    assert (rc, why) == (124, "timed out after 0.5s")
    assert log.read_text().split() == ["teardown"]


def test_failing_teardown_fails_the_check(tmp_path: Path) -> None:
    rc, why = _runner(tmp_path, main=["/bin/true"], teardown="exit 4")
    assert (rc, why) == (1, "teardown exit 4")
