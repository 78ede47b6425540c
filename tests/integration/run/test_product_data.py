"""Issue 14: the product's env, ports, persistent data directory and restarts, end to end.

The product counts its starts in `$CORRAL_DATA/starts` and answers on both its
ports with that count, `$CORRAL_PRODUCT_START` and its `env`. The checks
print what they got (their stdout is kept host-side), one of them after
`restart_product`. The agent of session 2 looks for the data directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import corral, journal_events, new_id, run_cgroup

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]

SERVER = """import os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
data = os.environ["CORRAL_DATA"]
path = os.path.join(data, "starts")
try:
    starts = int(open(path).read()) + 1
except FileNotFoundError:
    starts = 1
open(path, "w").write(str(starts))
open(os.path.join(data, "marker"), "w").write("DATA-MARKER-7f3a")
open(os.path.join(data, "suid"), "w").write("#!/bin/sh")
try:
    os.chmod(os.path.join(data, "suid"), 0o6755)
except OSError as exc:
    open(os.path.join(data, "suid-refused"), "w").write(str(exc))
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"starts={starts} start={os.environ['CORRAL_PRODUCT_START']} "
        body += f"port={self.server.server_port} greeting={os.environ.get('GREETING')}"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *a):
        pass
servers = [ThreadingHTTPServer(("127.0.0.1", int(p)), H) for p in os.environ["PORTS"].split()]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
"""

SCENARIO = """name: data
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{write_file: {path: server.py, content: SERVER_JSON}}]
      - say: "server written"
  - prompt: "(?m)^Session 2 of"
    turns:
      - calls: [{shell: LOOK}]
      - say: "done"
"""

#: The agent of session 2 looks for the data: its variable, beside the workspace, its host path.
LOOK = (
    '(echo "env=$CORRAL_DATA"; ls -a ..; cat ../data/marker DATA_GUESS) > seen 2>&1;'
    " echo yes > done"
)

CHECK = (
    'python3 -c \\"import os, urllib.request as u; '
    "[print(u.urlopen('http://127.0.0.1:' + p + '/').read().decode()) "
    "for p in os.environ['PRODUCT_PORTS'].split()]\\\""
)

MISSION = f"""+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 2

[session]
wall_time = "40s"

[limits]
run_memory = "1G"
agent = {{ memory = "512M", pids = 256 }}
product = {{ memory = "128M", pids = 64 }}
verifier = {{ memory = "256M", pids = 64 }}

[product]
command = "exec python3 server.py"
ports = [8000, 8001]
ready_timeout = "30s"
data = true
data_for_agent = "AGENT_DATA"
env = {{ GREETING = "hello" }}

[[checks]]
name = "both ports"
run = "{CHECK}"
timeout = "20s"

[[checks]]
name = "after a restart"
run = "{CHECK}"
restart_product = true
timeout = "20s"

[[checks]]
name = "done"
run = "test -f done"
timeout = "10s"
+++
# A product with data

Write server.py.
"""


def _mission(root: Path, agent_data: str, data_path: Path) -> Path:
    import json

    root.mkdir(parents=True)
    look = LOOK.replace("DATA_GUESS", str(data_path / "marker"))
    scenario = SCENARIO.replace("SERVER_JSON", json.dumps(SERVER)).replace("LOOK", json.dumps(look))
    (root / "scenario.yaml").write_text(scenario)
    (root / "MISSION.md").write_text(MISSION.replace("AGENT_DATA", agent_data))
    return root / "MISSION.md"


def _out(run_dir: Path, n: int, i: int) -> str:
    return (run_dir / "sessions" / f"session-{n}" / f"check-{i}" / "stdout.log").read_text()


@pytest.mark.parametrize("agent_data", ["none", "ro"])
def test_data_survives_restarts_and_sessions_on_both_ports(tmp_path: Path, agent_data: str) -> None:
    rid = new_id()
    runs = tmp_path / "runs"
    run_dir = runs / rid
    mission = _mission(tmp_path / "m", agent_data, run_dir / "data")
    proc = corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=85,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(run_dir / "state.sqlite", readonly=True) as store:
        assert store.run().state == "passed"
        assert [c.passed for c in store.checks(1)] == [True, True, False]
    # Two ports, each reached by the check; the env table reached the product.
    for n, first in ((1, 1), (2, 3)):
        before, after = _out(run_dir, n, 0), _out(run_dir, n, 1)
        for port in (8000, 8001):
            assert f"starts={first} start=1 port={port} greeting=hello" in before
            # `restart_product`: a second start of the product, which read the
            # first's count from the data directory (and session 2 session 1's).
            assert f"starts={first + 1} start=2 port={port} greeting=hello" in after
    assert (run_dir / "data" / "starts").read_text() == "4"
    # The product cannot leave a setuid file in its data for the host (M13): the
    # sandbox refuses the chmod; corral would clear the bits after the stop anyway.
    assert (run_dir / "data" / "suid").stat().st_mode & 0o6000 == 0
    ready = [r for s, r in journal_events(run_dir / "journal.sqlite", "product_ready")]
    assert sum("restart 2 before check 'after a restart'" in r for r in ready) == 2
    # The data directory is never part of a snapshot.
    for n in (1, 2):
        names = {p.name for p in (run_dir / "snapshots" / f"session-{n}").rglob("*")}
        assert "starts" not in names and "marker" not in names
    # The agent sees the data only when the mission declares it.
    seen = (run_dir / "snapshots" / "session-2" / "seen").read_text()
    if agent_data == "none":
        assert "DATA-MARKER" not in seen and "env=\n" in seen, seen
    else:
        assert re.search(r"env=\S+/data\n", seen) and "DATA-MARKER-7f3a" in seen, seen
    assert not run_cgroup(rid).exists()


def test_the_notes_example_passes_once_its_notes_survive_a_restart(tmp_path: Path) -> None:
    from tests.integration.run.helpers import EXAMPLES

    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run",
        str(EXAMPLES / "notes-api" / "MISSION.md"),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(runs),
        cwd=tmp_path,
        timeout=85,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(runs / rid / "state.sqlite", readonly=True) as store:
        first, second = store.checks(1), store.checks(2)
    # Session 1 keeps its notes in memory: lost by the restart before check 3.
    assert [c.passed for c in first] == [True, True, False]
    assert all(c.passed for c in second)
    assert "buy milk" in (runs / rid / "data" / "notes.json").read_text()
    assert not (runs / rid / "snapshots" / "session-2" / "notes.json").exists()


@pytest.mark.requires_root
def test_a_data_filling_product_is_bounded_by_run_disk(tmp_path: Path) -> None:
    import os
    import subprocess

    from corral.run.rundisk import sweep_stale
    from tests.integration.run.helpers import SERVE, write_mission

    mib = 1 << 20
    # A filesystem of our own stands in for the host's: statvfs sees only this test.
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(fs)], check=True)
    try:
        fill = f"head -c 300M /dev/zero > $CORRAL_DATA/big; {SERVE}"
        mission = write_mission(tmp_path / "m", max_sessions=1, product_cmd=fill)
        text = mission.read_text().replace(
            'run_memory = "1G"', 'run_memory = "1G"\nrun_disk = "64M"'
        )
        mission.write_text(text.replace("port = 8000\n", "port = 8000\ndata = true\n"))
        runs = fs / "runs"
        rid = new_id()
        st = os.statvfs(fs)
        before = st.f_bavail * st.f_frsize
        proc = corral(
            "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
        )
        # The product's data shares the run's image with corral's own state.
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        st = os.statvfs(fs)
        assert before - st.f_bavail * st.f_frsize <= 64 * mib + 8 * mib
        assert (runs / rid / "data" / "big").stat().st_size < 64 * mib
        sweep_stale(runs)
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
