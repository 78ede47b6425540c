"""Live policy (issue 15): rules added to a running broker, and who can add them.

Judged on the host: the journal's rows (deny, `policy` with the uid, allow, in
that order), what the loopback upstream received, the control socket's file
and whether a broker still listens on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig
from corral.broker.control import exec_control_dir, request, socket_name
from corral.broker.journal import read_rows
from corral.broker.livepolicy import parse_rule
from corral.broker.process import BrokerProcess, start_broker
from corral.errors import BrokerError

from .testlib import RecordingServer

pytestmark = [pytest.mark.timeout(90)]

# Asks the broker for URL with a raw proxy request (urllib would honour
# NO_PROXY=127.0.0.1 and go to the sandbox's own loopback), twice: before and
# after the host says "go".
TWO_REQUESTS = r"""
import os, socket, sys, time
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1].strip("/"))
url = sys.argv[1]
def get(path):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(f"GET {url}{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.split(b" ", 2)[1].decode()
def put(name, value):
    open(name + ".t", "w").write(value)
    os.rename(name + ".t", name)
put("first", get("/first"))
for _ in range(600):
    if os.path.exists("go"):
        break
    time.sleep(0.05)
put("second", get("/second"))
"""

# Everything a sandboxed process could try against the control channel.
ATTACK = r"""
import json, os, socket, sys
path = sys.argv[1]
rule = {"host": "evil.test", "ports": [443], "id": "live:attack"}
out = {"path_exists": os.path.exists(path), "dir_exists": os.path.exists(os.path.dirname(path))}
def attempt(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
        s.sendall(json.dumps({"op": "add_rule", "rule": rule}).encode() + b"\n")
        return "connected: " + s.recv(4096).decode()
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
out["path"] = attempt(path)
out["abstract"] = attempt("\0" + path)
out["abstract_name"] = attempt("\0" + os.path.basename(path))
with open("/proc/net/unix") as fh:
    out["listed"] = [l.split()[-1] for l in fh if os.path.basename(path) in l]
print(json.dumps(out))
"""


WAIT_FOR_GO = """
import time
for _ in range(600):
    time.sleep(0.05)
    if os.path.exists("go"):
        break
"""

# pytest's tmp is 0700: keep a handle on the directory, not on its ancestors,
# then become nobody and ask.
AS_NOBODY = r"""
import json, os, socket, sys
d = os.open(os.path.dirname(sys.argv[1]), os.O_PATH)
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
s = socket.socket(socket.AF_UNIX)
s.connect(f"/proc/self/fd/{d}/" + os.path.basename(sys.argv[1]))
try:
    s.sendall(json.dumps({"op": "add_rule", "rule": json.loads(sys.argv[2])}).encode() + b"\n")
except BrokenPipeError:
    pass  # refused before the request was read; the answer is queued
print(s.recv(4096).decode())
"""


def _corral(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    for _ in range(1200):
        if path.exists() or proc.poll() is not None:
            return
        time.sleep(0.05)


@contextlib.contextmanager
def _long_exec(
    tmp_path: Path, run_id: str, *cmd: str
) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o700)
    journal = tmp_path / "j.sqlite"
    argv = [sys.executable, "-m", "corral", "exec", "--workspace", str(ws), "--journal"]
    argv += [str(journal), "--run", run_id, "--allow", "unused.example", "--", *cmd]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc, ws, journal
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.requires_sandbox
def test_approved_rule_admits_the_next_request_of_a_running_exec(tmp_path: Path) -> None:
    upstream = RecordingServer()
    run_id = f"live-{os.urandom(4).hex()}"
    url = f"http://127.0.0.1:{upstream.port}"
    try:
        with _long_exec(tmp_path, run_id, "python3", "-c", TWO_REQUESTS, url) as (proc, ws, j):
            _wait_for(ws / "first", proc)
            assert (ws / "first").read_text() == "403"
            listed = _corral("proposals", run_id, "--json")
            assert listed.returncode == 0, listed.stderr
            [prop] = [
                json.loads(line)
                for line in listed.stdout.splitlines()
                if json.loads(line)["rule"]["ports"] == [upstream.port]
            ]
            assert prop["rule"]["host"] == "127.0.0.1" and prop["count"] == 1
            # Loopback on the host: refused without the explicit flag.
            refused = _corral("approve", run_id, prop["id"])
            assert refused.returncode == 2 and "--allow-private" in refused.stderr
            done = _corral("approve", run_id, prop["id"], "--allow-private")
            assert done.returncode == 0, done.stderr
            (ws / "go").write_text("")
            _wait_for(ws / "second", proc)
            assert (ws / "second").read_text() == "200"
        assert [h.path for h in upstream.hits] == ["/second"]
        rows = [r for r in read_rows(j) if r.kind in ("http_request", "policy")]
        assert [(r.kind, r.decision) for r in rows] == [
            ("http_request", "deny"),
            ("policy", "observe"),
            ("http_request", "allow"),
        ]
        policy = rows[1]
        assert policy.detail["uid"] == os.getuid() and policy.detail["user"]
        assert policy.detail["proposal"] == prop["id"] == policy.detail["rule_hash"]
        assert rows[2].rule == policy.detail["rule_id"] == f"live:{prop['id']}"
        assert _corral("proposals", run_id, "--json").stdout == ""  # gone: nothing live, or done
    finally:
        upstream.close()


@pytest.mark.requires_sandbox
def test_the_control_socket_is_out_of_the_sandboxs_reach(tmp_path: Path) -> None:
    run_id = f"live-{os.urandom(4).hex()}"
    control = exec_control_dir(run_id) / socket_name(None, "exec")
    write = "open('o.t', 'w').write(json.dumps(out)); os.rename('o.t', 'out')"
    script = ATTACK.replace("print(json.dumps(out))", write)
    script += WAIT_FOR_GO
    with _long_exec(tmp_path, run_id, "python3", "-c", script, str(control)) as (proc, ws, j):
        _wait_for(ws / "out", proc)
        seen = json.loads((ws / "out").read_text())
        # The target was real: the broker listens there, for the host user.
        assert request(control, {"op": "info"})["ok"]
        # Control: the same attack from the host (outside any sandbox) works.
        host = subprocess.run(
            [sys.executable, "-c", ATTACK, str(control)], capture_output=True, text=True, check=True
        )
        assert json.loads(host.stdout)["path"].startswith('connected: {"ok": true')
        (ws / "go").write_text("")
    assert seen == {
        "path_exists": False,
        "dir_exists": False,
        "path": "FileNotFoundError",
        "abstract": "ConnectionRefusedError",
        "abstract_name": "ConnectionRefusedError",
        "listed": [],
    }
    # One rule change in the journal: the host's, none from inside.
    [row] = read_rows(j, kind="policy")
    assert row.detail["uid"] == os.getuid()


def _broker(tmp_path: Path, control: Path) -> tuple[BrokerProcess, int]:
    b = start_broker(BrokerConfig(), tmp_path / "j.sqlite", listen=["127.0.0.1:0"], control=control)
    return b, b.wait_ready(15).tcp_ports[0]


@pytest.mark.requires_root
def test_another_uid_is_refused_whatever_the_file_modes(tmp_path: Path) -> None:
    control = tmp_path / "control" / "s-exec.sock"
    broker, _ = _broker(tmp_path, control)
    try:
        assert oct(control.stat().st_mode & 0o777) == "0o600"
        assert oct(control.parent.stat().st_mode & 0o777) == "0o700"
        # Suppose the modes were lost (a copy, a chmod): the peer's uid still decides.
        os.chmod(tmp_path, 0o755)
        os.chmod(control.parent, 0o755)
        os.chmod(control, 0o666)
        rule = parse_rule("evil.test:443").model_dump(mode="json")
        other = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, str(control), json.dumps(rule)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert other.returncode == 0, other.stderr
        assert json.loads(other.stdout) == {"ok": False, "error": "permission denied"}
        assert request(control, {"op": "info"})["rules"] == []
        # Control: the owner's identical request is taken.
        assert request(control, {"op": "add_rule", "rule": rule})["ok"]
        assert request(control, {"op": "info"})["rules"] == [rule["id"]]
    finally:
        broker.stop()
    rows = read_rows(tmp_path / "j.sqlite", kind="policy")
    assert [(r.decision, r.detail["uid"]) for r in rows] == [("deny", 65534), ("observe", 0)]


COORDINATOR = r"""
import sys
from pathlib import Path
from corral.broker.config import BrokerConfig
from corral.broker.process import start_broker
journal, control = Path(sys.argv[1]), Path(sys.argv[2])
b = start_broker(BrokerConfig(), journal, listen=["127.0.0.1:0"], control=control)
b.wait_ready(15)
print(b.pid, flush=True)
import time
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    for _ in range(400):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    return False


def test_kill_9_of_the_coordinator_leaves_no_usable_control_socket(tmp_path: Path) -> None:
    control = tmp_path / "control" / "s-exec.sock"
    with subprocess.Popen(
        [sys.executable, "-c", COORDINATOR, str(tmp_path / "j.sqlite"), str(control)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as coord:
        assert coord.stdout is not None
        broker_pid = int(coord.stdout.readline())
        assert request(control, {"op": "info"})["ok"]
        coord.kill()
        coord.wait()
    # The broker follows its parent (PR_SET_PDEATHSIG) and removes its socket.
    assert _gone(broker_pid)
    assert not os.path.lexists(control)
    with pytest.raises(BrokerError):
        request(control, {"op": "info"})


def test_a_sigkilled_brokers_socket_is_dead_and_replaced(tmp_path: Path) -> None:
    control = tmp_path / "control" / "s-exec.sock"
    first, _ = _broker(tmp_path, control)
    first.kill()
    # The file stays, but nothing answers on it: a connect is refused.
    assert os.path.lexists(control)
    with pytest.raises(BrokerError) as info:
        request(control, {"op": "info"})
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    second, _ = _broker(tmp_path, control)
    try:
        # A new broker at the same path took the leftover's place.
        assert request(control, {"op": "info"})["ok"]
    finally:
        second.stop()
    assert not os.path.lexists(control)


def test_a_foreign_file_at_the_path_refuses_the_start(tmp_path: Path) -> None:
    control = tmp_path / "control" / "s-exec.sock"
    control.parent.mkdir(mode=0o700)
    control.write_text("not a socket")
    b = start_broker(BrokerConfig(), tmp_path / "j.sqlite", listen=["127.0.0.1:0"], control=control)
    with pytest.raises(BrokerError, match="not a socket"):
        b.wait_ready(15)
    assert control.read_text() == "not a socket"


def test_allow_and_proposals_for_a_run_directory(tmp_path: Path) -> None:
    """`corral allow RUN_DIR` reaches the session broker in the run's control/ directory."""
    runs = tmp_path / "runs"
    root = runs / "r-1"
    root.mkdir(parents=True, mode=0o700)
    (root / "state.sqlite").write_bytes(b"")
    control = root / "control" / socket_name("session-1", "agent")
    upstream = RecordingServer()
    b = start_broker(
        BrokerConfig(), root / "journal.sqlite", listen=["127.0.0.1:0"], control=control
    )
    try:
        port = b.wait_ready(15).tcp_ports[0]
        # A hostile name the sandbox asked for: denied, then shown as data.
        for target in ("evil\x1b[2J.test:443", f"127.0.0.1:{upstream.port}", "pypi.org:443"):
            with contextlib.closing(socket.create_connection(("127.0.0.1", port))) as s:
                s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert s.recv(4096).startswith(b"HTTP/1.1 4")
        shown = _corral("proposals", "r-1", "--runs-dir", str(runs))
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "pypi.org" in shown.stdout
        listed = _corral("proposals", str(root), "--json")
        items = [json.loads(line) for line in listed.stdout.splitlines()]
        assert {(p["rule"]["host"], p["private"]) for p in items} == {
            ("127.0.0.1", True),
            ("pypi.org", False),
        }
        refused = _corral("allow", str(root), f"127.0.0.1:{upstream.port}")
        assert refused.returncode == 2 and "--allow-private" in refused.stderr
        added = _corral("allow", str(root), "pypi.org:443")
        assert added.returncode == 0, added.stderr
        assert "session-1-agent: rule live:" in added.stdout
        again = _corral("proposals", str(root), "--json")
        assert [json.loads(x)["rule"]["host"] for x in again.stdout.splitlines()] == ["127.0.0.1"]
    finally:
        b.stop()
        upstream.close()
    # Nothing live any more: a clear failure, not a silent success.
    late = _corral("allow", str(root), "example.org")
    assert late.returncode == 1 and "no live broker" in late.stderr
    [row] = read_rows(root / "journal.sqlite", kind="policy")
    assert row.detail["user"] and row.detail["rule"]["host"] == "pypi.org"


@pytest.mark.requires_sandbox
def test_an_exec_leaves_no_control_socket_or_directory(tmp_path: Path) -> None:
    run_id = f"live-{os.urandom(4).hex()}"
    with _long_exec(tmp_path, run_id, "true") as (proc, _, _):
        proc.wait(60)
    assert proc.returncode == 0
    assert not exec_control_dir(run_id).exists()
    assert exec_control_dir(run_id).parent.is_dir()  # the per-user base stays, 0700
    assert exec_control_dir(run_id).parent.parent.stat().st_mode & 0o077 == 0
