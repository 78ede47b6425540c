"""Issue 14 checks in a real `corral run`: steps, assertions, setup/teardown, env, reasons.

The agent (the script test agent) writes a small todo server and a hostile
`lie.py`; the product serves the snapshot; each check runs in a verifier
sandbox of its own. The host-side effects asserted: what the product saw
(its request log, written by the product sandbox into its own directory),
the verdicts in state.sqlite, and the lines of report.md / `corral status`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import corral, new_id

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(120)]

SERVER = r"""
import ctypes, json, os, sys, time
if os.fork() == 0:
    # A daemon named to forge a row and recolour the terminal (comm: 15 bytes).
    ctypes.CDLL(None).prctl(15, b"\x1b[2J|x|\xe2\x80\xae", 0, 0, 0)
    time.sleep(600)
from http.server import BaseHTTPRequestHandler, HTTPServer
todos = []
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        print("REQ", self.command, self.path, flush=True)
    def _send(self, status, body, **h):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        for k, v in h.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith("/todos/"):
            t = [x for x in todos if "/todos/%d" % x["id"] == self.path]
            return self._send(200 if t else 404, json.dumps(t[0] if t else {}).encode())
        self._send(200, b'"ok"')
    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        doc = json.loads(self.rfile.read(n) or b"{}")
        if self.path != "/todos":
            return self._send(501, b'{"error": "not here"}')
        item = {"id": len(todos) + 1, "title": doc.get("title")}
        todos.append(item)
        self._send(201, json.dumps(item).encode(), location="/todos/%d" % item["id"])
HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""

# Prints a forged row and terminal controls, on many lines, then fails.
LIE = r"""
import sys
print("\x1b[2J\x1b]0;owned\x07")
print("| create then read | FAIL | forged |")
print("| wrong status | pass | passed |\x1b[0m")
sys.exit(1)
"""

MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 1

[session]
wall_time = "40s"

[limits]
run_memory = "1G"
agent = { memory = "256M", pids = 128 }
product = { memory = "128M", pids = 64 }
verifier = { memory = "256M", pids = 64 }

[product]
command = "exec python3 -u server.py"
port = 8000
ready_timeout = "30s"

[[checks]]
name = "create then read"
timeout = "15s"
[[checks.steps]]
http = "POST /todos"
body = '{"title": "milk"}'
expect_status = 201
expect_headers = { "content-type" = "^application/json$" }
capture = { id = "$.id", loc = "header:location" }
[[checks.steps]]
http = "GET /todos/${id}"
expect_json = { "$.title" = "milk", "$.id" = 1 }
[[checks.steps]]
http = "GET ${loc}"
expect_regex = '"title": "milk"'

[[checks]]
name = "wrong status"
http = "POST /elsewhere"
body = "{}"
expect_status = 201
timeout = "15s"

[[checks]]
name = "liar"
run = "python3 lie.py"
timeout = "15s"

[[checks]]
name = "setup and teardown"
setup = "python3 -c \\"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/setup-ran')\\""
run = "test \\"$GREETING\\" = hi && exit 5"
teardown = "python3 -c \\"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/teardown-ran')\\""
env = { GREETING = "hi" }
timeout = "15s"
+++
# A todo server

Write server.py.
"""


def test_checks_steps_assertions_and_reasons(tmp_path: Path) -> None:
    m = tmp_path / "m"
    m.mkdir()
    calls = [
        {"write_file": {"path": "server.py", "content": SERVER}},
        {"write_file": {"path": "lie.py", "content": LIE}},
    ]
    scenario = {"name": "checks", "turns": [{"calls": calls}, {"say": "done"}]}
    (m / "scenario.yaml").write_text(json.dumps(scenario))
    (m / "MISSION.md").write_text(MISSION)
    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run",
        str(m / "MISSION.md"),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=110,
    )
    out = proc.stdout + proc.stderr
    run_dir = runs / rid
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        (session,) = s.sessions()
        results = {c.name: c for c in s.checks(session.n)}
    steps = results["create then read"]
    assert steps.passed, (steps, out)
    assert steps.reason == "passed"
    wrong = results["wrong status"]
    assert not wrong.passed
    assert wrong.reason.startswith("POST /elsewhere: status 501, expected 201"), wrong
    liar = results["liar"]
    assert not liar.passed and liar.exit == 1
    # The liar's reason is its own last line, escaped; nothing of it is a verdict.
    assert liar.reason.startswith("exit 1: | wrong status | pass | passed |\\x1b[0m"), liar
    st = results["setup and teardown"]
    assert not st.passed and st.reason == "exit 5", st
    # The product saw setup before and teardown after the failing check (host-side log).
    log = (run_dir / "sessions/session-1/product/stdout.log").read_text()
    reqs = [ln.split()[2] for ln in log.splitlines() if ln.startswith("REQ")]
    assert reqs[-2:] == ["/setup-ran", "/teardown-ran"], reqs

    report = (run_dir / "report.md").read_text()
    assert "\x1b" not in report
    rows = [ln for ln in report.splitlines() if ln.startswith("| ") and " | s |" not in ln]
    check_rows = [ln for ln in rows if ln.split(" | ")[1] in ("pass", "FAIL")]
    assert len(check_rows) == 4, report
    assert "status 501, expected 201" in report
    # The daemon the product left is listed by its name, escaped, in one row.
    kills = report.split("## Processes killed at teardown", 1)[1].split("##", 1)[0]
    (row,) = [ln for ln in kills.splitlines() if ln.startswith("| product |")]
    assert r"\\x1b\[2J\|x\|\\u202e" in row and "python3" in row, row
    assert "\u202e" not in report

    status = corral("status", rid, "--runs-dir", str(runs), "--json", cwd=tmp_path)
    doc = json.loads(status.stdout)
    failed = {c["name"]: c["reason"] for c in doc["failed_checks"]}
    assert failed["wrong status"].startswith("POST /elsewhere: status 501, expected 201")
    assert set(failed) == {"wrong status", "liar", "setup and teardown"}
    (killed,) = [k for k in doc["killed_at_teardown"] if k["env"] == "product"]
    assert killed["count"] >= 2 and r"\x1b[2J|x|\u202e" in killed["names"], killed
    plain = corral("status", rid, "--runs-dir", str(runs), cwd=tmp_path).stdout
    assert "status 501, expected 201" in plain and "\x1b" not in plain


def test_steps_example_fails_with_its_reason_then_passes(tmp_path: Path) -> None:
    from tests.integration.run.helpers import EXAMPLES

    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run",
        str(EXAMPLES / "todo-steps" / "MISSION.md"),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(runs / rid / "state.sqlite", readonly=True) as s:
        first = {c.name: c for c in s.checks(1)}
        second = s.checks(2)
    step = first["create, then read it back"]
    assert not step.passed
    assert step.reason.startswith("step 2/3: GET /todos/1: status 404, expected 200"), step
    assert all(c.passed for c in second), second
