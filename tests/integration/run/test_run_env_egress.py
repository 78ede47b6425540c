"""Issue 14: secrets through broker routes and `[network.*] allow` for the product and verifier.

Three servers on the host's loopback: an upstream that records the
Authorization header it receives (the secret's route), one the mission
declares as a host service of the product and the verifier (reached as
`ok.corral.internal`, through the broker) and one it does not (tried as
`host.corral.internal`, refused by the broker). Host-side effects asserted:
what each server received, the journal's rows for env `product` and
`verifier`, and that the secret's bytes are nowhere in the run directory
(workspace, snapshots, logs, journal, git).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import corral, env_with, new_id

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(120)]


class _Recorder(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("authorization")))  # type: ignore[attr-defined]
        body = b"upstream-ok"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def servers() -> Iterator[dict[str, ThreadingHTTPServer]]:
    out: dict[str, ThreadingHTTPServer] = {}
    for name in ("upstream", "allowed", "denied"):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        srv.seen = []  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        out[name] = srv
    yield out
    for srv in out.values():
        srv.shutdown()
        srv.server_close()


SERVER = r"""
import os, sys, urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
for name, host in (("ALLOWED", "ok"), ("DENIED", "host")):
    try:
        port = os.environ["T_" + name]
        url = "http://%s.corral.internal:%s/from-product" % (host, port)
        urllib.request.urlopen(url, timeout=5)
        print(name, "reached", flush=True)
    except Exception as exc:
        print(name, "failed", exc, flush=True)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""

FETCH = (
    'python3 -c "import os, sys, urllib.request as u; '
    "print(sorted(os.environ.items())); "
    "r = u.urlopen(sys.argv[1], timeout=5).read(); print(r); assert r == b'upstream-ok'\" "
)


def _mission(ports: dict[str, int]) -> str:
    up, ok, no = ports["upstream"], ports["allowed"], ports["denied"]
    return f"""+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 1

[session]
wall_time = "40s"

[limits]
run_memory = "1G"
agent = {{ memory = "256M", pids = 128 }}
product = {{ memory = "128M", pids = 64 }}
verifier = {{ memory = "256M", pids = 64 }}

[[network.product.host_services]]
name = "ok"
port = {ok}

[[network.verifier.host_services]]
name = "ok"
port = {ok}

[secrets.api]
value = "env:CORRAL_TEST_SECRET"
upstream = "http://127.0.0.1:{up}"
for = ["product", "verifier"]

[product]
command = "T_ALLOWED={ok} T_DENIED={no} exec python3 -u server.py"
port = 8000
ready_timeout = "30s"

[[checks]]
name = "route"
run = {json.dumps(FETCH + '"$CORRAL_SECRET_API_URL/through-route"')}
timeout = "20s"

[[checks]]
name = "allowed"
run = {json.dumps(FETCH + f"http://ok.corral.internal:{ok}/from-verifier")}
timeout = "20s"

[[checks]]
name = "denied"
run = {json.dumps(FETCH + f"http://host.corral.internal:{no}/from-verifier")}
timeout = "20s"
+++
# A product with egress

Write server.py.
"""


def test_secret_route_and_product_verifier_egress(
    tmp_path: Path, servers: dict[str, ThreadingHTTPServer]
) -> None:
    secret = f"Bearer s3cr3t-{uuid.uuid4().hex}"
    ports = {k: int(s.server_address[1]) for k, s in servers.items()}
    m = tmp_path / "m"
    m.mkdir()
    calls = [{"write_file": {"path": "server.py", "content": SERVER}}]
    scenario = {"name": "egress", "turns": [{"calls": calls}, {"say": "done"}]}
    (m / "scenario.yaml").write_text(json.dumps(scenario))
    (m / "MISSION.md").write_text(_mission(ports))
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
        env=env_with(CORRAL_TEST_SECRET=secret),
    )
    out = proc.stdout + proc.stderr
    run_dir = runs / rid
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        results = {c.name: c for c in s.checks(1)}
    # The check using the route got the upstream's answer; the upstream got the secret.
    assert results["route"].passed, (results["route"], out)
    up = servers["upstream"].seen  # type: ignore[attr-defined]
    assert ("/through-route", secret) in up, up
    # Allowed destinations were reached from the product and the verifier; the other never.
    allowed = [p for p, _ in servers["allowed"].seen]  # type: ignore[attr-defined]
    assert "/from-product" in allowed and "/from-verifier" in allowed, allowed
    assert results["allowed"].passed, results["allowed"]
    assert servers["denied"].seen == [], servers["denied"].seen  # type: ignore[attr-defined]
    assert not results["denied"].passed
    # Journaled like the agent's egress, under the environment that asked.
    conn = sqlite3.connect(run_dir / "journal.sqlite")
    rows = conn.execute(
        "SELECT env, decision, target FROM observations WHERE target LIKE ?",
        (f"%corral.internal:{ports['denied']}%",),
    ).fetchall()
    allow_rows = conn.execute(
        "SELECT env, decision FROM observations WHERE target LIKE ?",
        (f"%corral.internal:{ports['allowed']}%",),
    ).fetchall()
    conn.close()
    assert {(e, d) for e, d, _ in rows} >= {("product", "deny"), ("verifier", "deny")}, rows
    assert {("product", "allow"), ("verifier", "allow")} <= set(allow_rows), allow_rows
    # The secret is nowhere the run keeps: workspace, snapshots, logs, journal, git history.
    needle = secret.rsplit(maxsplit=1)[-1].encode()
    hits = [p for p in run_dir.rglob("*") if p.is_file() and needle in p.read_bytes()]
    assert hits == [], hits
    history = subprocess.run(
        ["git", "--git-dir", str(run_dir / "git"), "log", "-p", "--all"],
        capture_output=True,
        check=False,
    ).stdout
    assert needle not in history
    # The check printed its whole environment: the route URL is there, the value not.
    route_out = (run_dir / "sessions/session-1/check-0/stdout.log").read_text()
    assert "CORRAL_SECRET_API_URL" in route_out and needle.decode() not in route_out
