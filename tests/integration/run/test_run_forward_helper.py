"""The product-port forwarder and the MCP gateway run in the run cgroup (issue 10).

The attacks and what the host observes:

* a product floods every connection a verifier opens through the forward
  while the verifier reads nothing: the relay's buffers are charged to the
  run's `helpers-forward` cgroup (its kernel peak grows), the coordinator's
  own high-water mark (VmHWM) does not; each connection is still journaled
  (`rule=product-port`) before it is relayed;
* a hostile MCP client (the agent) posts large JSON-RPC bodies to the
  gateway: parsed in `helpers-mcp`, not in the coordinator;
* kill -9 of the coordinator while a check is being forwarded leaves no
  forward helper; kill -9 of the forward helper fails the run, journaled.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from corral.run.store import Store
from tests.integration.run.helpers import (
    in_phase,
    journal_events,
    new_id,
    run_cgroup,
    start_corral,
    vm_hwm,
    wait_for,
)
from tests.integration.run.test_run_helpers import (
    _finish,
    _helpers_of,
    _peak_file,
    _read_int,
    _run,
)
from tests.integration.run.test_run_mcp import _mission

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.timeout(120),
]

MiB = 1 << 20
CONNS = 400

#: Every accepted connection is written to for as long as it takes writes
#: (one thread: the product's pids limit would stop a thread per connection).
_FLOOD = (
    "import socket,selectors",
    's=socket.create_server(("127.0.0.1",8000));s.setblocking(0)',
    "sel=selectors.DefaultSelector();sel.register(s,selectors.EVENT_READ)",
    "b=bytes(1<<16)",
    "while 1:",
    " for k,_ in sel.select():",
    "  if k.fileobj is s:",
    "   c=s.accept()[0];c.setblocking(0);sel.register(c,selectors.EVENT_WRITE)",
    "  else:",
    "   try:k.fileobj.send(b)",
    "   except OSError:sel.unregister(k.fileobj)",
)
# Written into a TOML basic string: quotes and newlines escaped for it.
FLOOD_PRODUCT = "python3 -c '" + "\\n".join(_FLOOD).replace('"', '\\"') + "'"

#: Opens CONNS connections through the forward and reads none of them.
GREEDY_CHECK = (
    "python3 -c 'import socket,time;"
    f'c=[socket.create_connection((\\"127.0.0.1\\",8000)) for _ in range({CONNS})];'
    "time.sleep(SLEEP)'"
)


def _forward_run(tmp_path: Path, sleep: float) -> tuple[str, Path, subprocess.Popen[bytes]]:
    return _run(
        tmp_path,
        None,
        product_cmd=FLOOD_PRODUCT,
        check_cmd=GREEDY_CHECK.replace("SLEEP", str(sleep)),
        check_timeout="40s",
    )


def _forwards(run_dir: Path) -> int:
    """Forwarded connections journaled so far (the journal opened read-only)."""
    path = run_dir / "journal.sqlite"
    if not path.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM observations WHERE env='verifier' AND kind='net_connect'"
                " AND rule='product-port'"
            ).fetchone()[0]
        )
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def _forward_helpers(rid: str) -> list[psutil.Process]:
    out = []
    for h in _helpers_of(rid):
        try:
            if h.cmdline()[2:4] == ["corral.run.helper_main", "forward"]:
                out.append(h)
        except psutil.Error:
            continue
    return out


def test_a_flooded_forward_is_charged_to_the_run_not_to_the_coordinator(tmp_path: Path) -> None:
    rid, run_dir, proc = _forward_run(tmp_path, 6)
    base_coord = base_fwd = fwd_peak = coord_peak = 0
    seen = False
    try:
        while proc.poll() is None:
            coord_peak = max(coord_peak, vm_hwm(proc.pid))
            fwd = _read_int(_peak_file(rid, "forward"))
            if not base_fwd and in_phase(run_dir, 1, "agent"):
                # The helper said ready before the first session: its
                # interpreter is in its peak, nothing is relayed yet.
                base_fwd = fwd
            if not seen and _forwards(run_dir) >= 1:
                # The coordinator's own check work (sandboxes, probes) is done.
                seen = True
                base_coord = vm_hwm(proc.pid)
            fwd_peak = max(fwd_peak, fwd)
            time.sleep(0.05)
    finally:
        _finish(proc, 1)
    grew, coord_grew = fwd_peak - base_fwd, coord_peak - base_coord
    print(
        f"forward helper peak {base_fwd / MiB:.1f} -> {fwd_peak / MiB:.1f} MiB; "
        f"coordinator VmHWM {base_coord / MiB:.1f} -> {coord_peak / MiB:.1f} MiB; "
        f"{_forwards(run_dir)} forwards journaled"
    )
    assert base_fwd > 0, "the forward helper was never in its run cgroup"
    # Every connection was journaled before it was relayed...
    assert _forwards(run_dir) >= CONNS
    # ...the relay's buffers for the flood were charged to the run's helper...
    assert grew >= 4 * MiB, f"forward helper peak grew {grew / MiB:.1f} MiB"
    # ...and the coordinator never held them.
    assert coord_grew < 4 * MiB, f"coordinator VmHWM grew {coord_grew / MiB:.1f} MiB"


def test_sigkill_of_the_coordinator_leaves_no_forward_helper(tmp_path: Path) -> None:
    rid, run_dir, proc = _forward_run(tmp_path, 30)
    try:
        wait_for(lambda: _forwards(run_dir) >= CONNS, 90, "the verifier's forwarded connections")
        helpers = _forward_helpers(rid)
        assert helpers, "no forward helper while the check runs"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_for(
            lambda: not any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers),
            5,
            "the forward helper to die with the coordinator",
        )
    finally:
        _finish(proc, 1)
        run_cgroup(rid).sweep()


def test_forward_helper_death_fails_the_run_with_a_journaled_reason(tmp_path: Path) -> None:
    rid, run_dir, proc = _forward_run(tmp_path, 30)
    try:
        wait_for(lambda: _forwards(run_dir) >= 1, 90, "a forwarded connection")
        (helper,) = _forward_helpers(rid)
        helper.send_signal(signal.SIGKILL)
        proc.wait(90)
    finally:
        _finish(proc, 1)
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        run = s.run()
    assert run.state == "failed", (run.state, run.end_reason)
    assert "forward helper died (signal 9)" in (run.end_reason or "")
    rows = journal_events(run_dir / "journal.sqlite", "helper_died")
    assert rows and "forward helper died" in rows[0][1], rows


#: The agent posts JSON-RPC bodies of ~1 MiB (under the gateway's 4 MiB limit), two at once.
MCP_BOMB = """import os, threading, time, urllib.error, urllib.request
open("armed", "w").write("1")
time.sleep(2)
url = "http://127.0.0.1:3128/routes/mcp/demo/mcp"
body = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",'
        b'"arguments":{"text":"x","pad":[' + b"[]," * (350 << 10) + b'[]]}}}')
out = []
def post():
    req = urllib.request.Request(url, data=body, headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream"})
    try:
        out.append(str(urllib.request.urlopen(req, timeout=60).status))
    except urllib.error.HTTPError as exc:
        out.append(str(exc.code))
    except OSError as exc:
        out.append("error:" + type(exc).__name__)
ts = [threading.Thread(target=post) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
open("bomb-status", "w").write(" ".join(sorted(out)))
"""

MCP_BOMB_SCENARIO = """name: mcp-bomb
turns:
  - calls: [{write_file: {path: bomb.py, content: BOMB_JSON}}]
  - calls: [{shell: "python3 bomb.py; echo ok > fixed"}]
  - say: "done"
"""


def test_hostile_mcp_bodies_are_charged_to_the_run_not_to_the_coordinator(
    tmp_path: Path,
) -> None:
    mission, _demo = _mission(tmp_path / "m")
    (tmp_path / "m" / "scenario.yaml").write_text(
        MCP_BOMB_SCENARIO.replace("BOMB_JSON", json.dumps(MCP_BOMB))
    )
    rid = new_id()
    runs = tmp_path / "runs"
    run_dir = runs / rid
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    armed = run_dir / "workspace" / "armed"
    seen = False
    base_coord = base_mcp = mcp_peak = coord_peak = 0
    try:
        while proc.poll() is None:
            coord_peak = max(coord_peak, vm_hwm(proc.pid))
            if not seen and armed.exists():
                seen = True
                base_coord = vm_hwm(proc.pid)
                base_mcp = _read_int(_peak_file(rid, "mcp"))
            if seen:
                mcp_peak = max(mcp_peak, _read_int(_peak_file(rid, "mcp")))
            time.sleep(0.05)
    finally:
        _finish(proc, 1)
    grew, coord_grew = mcp_peak - base_mcp, coord_peak - base_coord
    print(
        f"mcp helper peak {base_mcp / MiB:.1f} -> {mcp_peak / MiB:.1f} MiB; "
        f"coordinator VmHWM {base_coord / MiB:.1f} -> {coord_peak / MiB:.1f} MiB; "
        f"status {(run_dir / 'workspace' / 'bomb-status').read_text()!r}"
    )
    assert (run_dir / "workspace" / "bomb-status").exists()
    assert base_mcp > 0, "the MCP gateway helper was never in its run cgroup"
    assert grew >= 16 * MiB, f"mcp helper peak grew {grew / MiB:.1f} MiB"
    assert coord_grew < 4 * MiB, f"coordinator VmHWM grew {coord_grew / MiB:.1f} MiB"


def _mcp_helpers(rid: str) -> list[psutil.Process]:
    out = []
    for h in _helpers_of(rid):
        try:
            if h.cmdline()[2:4] == ["corral.run.helper_main", "mcp"]:
                out.append(h)
        except psutil.Error:
            continue
    return out


def _mcp_run(tmp_path: Path) -> tuple[str, Path, subprocess.Popen[bytes]]:
    mission, _demo = _mission(tmp_path / "m")
    rid = new_id()
    runs = tmp_path / "runs"
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    marker = runs / ".mcp" / rid / "session-1" / "demo" / "marker"
    try:
        wait_for(marker.exists, 60, "the agent's first MCP call")
    except BaseException:
        _finish(proc, 1)
        raise
    return rid, runs / rid, proc


def test_sigkill_of_the_coordinator_leaves_no_mcp_gateway_helper(tmp_path: Path) -> None:
    rid, _run_dir, proc = _mcp_run(tmp_path)
    try:
        helpers = _mcp_helpers(rid)
        assert len(helpers) == 1, "the MCP gateway is not in its helper"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_for(
            lambda: not any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers),
            30,
            "the MCP gateway helper to die with the coordinator",
        )
    finally:
        _finish(proc, 1)
        run_cgroup(rid).sweep()


def test_mcp_gateway_helper_death_ends_the_session_journaled(tmp_path: Path) -> None:
    rid, run_dir, proc = _mcp_run(tmp_path)
    try:
        (helper,) = _mcp_helpers(rid)
        helper.send_signal(signal.SIGKILL)
        # Both well before the session's 60 s wall time would end it (the agent
        # still waits for `release`), with room for a loaded host.
        wait_for(
            lambda: bool(journal_events(run_dir / "journal.sqlite", "helper_died")),
            40,
            "the gateway's death to be journaled",
        )
        wait_for(
            lambda: bool(journal_events(run_dir / "journal.sqlite", "session_end")),
            40,
            "the session to end",
        )
        proc.wait(60)
    finally:
        _finish(proc, 1)
    rows = journal_events(run_dir / "journal.sqlite", "helper_died")
    assert "mcp helper died (signal 9)" in rows[0][1], rows
