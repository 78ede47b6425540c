"""Live policy in a real `corral run` (issue 15): `corral allow` reaches the session's broker.

The scripted agent asks the host's loopback upstream through its broker,
waits until the host has added a rule, and asks again. Judged on the host:
what the upstream received and the run's journal (deny, `policy` with the
uid, allow), and that the control socket is gone once the run ended.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from corral.broker.journal import read_rows
from tests.integration.broker.testlib import RecordingServer
from tests.integration.run.helpers import corral, new_id, start_corral, wait_for, write_mission

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]

ASK = (
    "curl -s -o /dev/null -w '%{http_code}' --noproxy '' -x $HTTP_PROXY "
    "http://127.0.0.1:PORT/NAME > NAME.t; mv NAME.t NAME"
)
WAIT = "i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"


def test_corral_allow_admits_the_next_request_of_a_running_session(tmp_path: Path) -> None:
    upstream = RecordingServer()
    try:
        mission = write_mission(tmp_path / "m", max_sessions=1)
        port = str(upstream.port)
        shell = "; ".join(
            [ASK.replace("NAME", "first"), WAIT, ASK.replace("NAME", "second")]
        ).replace("PORT", port)
        scenario = tmp_path / "m" / "scenario.yaml"
        scenario.write_text(scenario.read_text().replace("sleep 0; echo one > stage1", shell))
        rid = new_id()
        runs = tmp_path / "runs"
        ws = runs / rid / "workspace"
        proc = start_corral(
            "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
        )
        try:
            wait_for((ws / "first").exists, 60, "the first request")
            assert (ws / "first").read_text() == "403"
            added = corral(
                "allow",
                rid,
                f"127.0.0.1:{port}",
                "--allow-private",
                "--runs-dir",
                str(runs),
                cwd=tmp_path,
            )
            assert added.returncode == 0, added.stderr
            assert "-agent: rule live:" in added.stdout
            (ws / "go").write_text("")
            wait_for((ws / "second").exists, 60, "the second request")
            assert (ws / "second").read_text() == "200"
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert [h.path for h in upstream.hits] == ["/second"]
        journal = runs / rid / "journal.sqlite"
        rows = [
            r
            for r in read_rows(journal)
            if r.kind == "policy" or (r.kind == "http_request" and port in r.target)
        ]
        assert [(r.kind, r.decision, r.env) for r in rows] == [
            ("http_request", "deny", "agent"),
            ("policy", "observe", "agent"),
            ("http_request", "allow", "agent"),
        ]
        assert rows[1].detail["uid"] == os.getuid() and rows[1].session == rows[0].session
        assert rows[2].rule == rows[1].detail["rule_id"]
        # The session's broker is gone, and so is its socket.
        assert list((runs / rid / "control").iterdir()) == []
    finally:
        upstream.close()
