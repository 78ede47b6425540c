"""`corral run`: the agent's Landlock and seccomp denials are journaled with the run and
session ids when kernel audit is on (issue 15; the test turns audit on and restores it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.run.store import Store
from corral.sandbox import kaudit
from tests.integration.run.helpers import SCENARIO, corral, new_id, write_mission

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_audit,
    pytest.mark.timeout(90),
]

ATTACK = (
    "ls /var >/dev/null 2>&1; "
    "python3 -c 'import ctypes; ctypes.CDLL(None).syscall(250, 0, 0, 0)'; echo one > stage1"
)


@pytest.fixture
def audit_on() -> Iterator[None]:
    prev = kaudit.audit_enabled()
    assert prev is not None
    kaudit.set_audit_enabled(True)
    try:
        yield
    finally:
        kaudit.set_audit_enabled(prev)


def test_agent_denials_are_journaled_with_run_and_session(audit_on: None, tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m", max_sessions=1, check_cmd="true")
    scenario = tmp_path / "m" / "scenario.yaml"
    scenario.write_text(
        SCENARIO.replace("sleep AGENT_SLEEP; echo one > stage1", ATTACK.replace('"', '\\"'))
    )
    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    assert (runs / rid / "journal.sqlite").exists(), proc.stdout + proc.stderr
    with Store(runs / rid / "state.sqlite", readonly=True) as store:
        (s1,) = store.sessions()[:1]
    conn = sqlite3.connect(runs / rid / "journal.sqlite")
    try:
        rows = conn.execute(
            "SELECT run, session, env, kind, target FROM observations"
            " WHERE kind IN ('landlock', 'seccomp')"
        ).fetchall()
    finally:
        conn.close()
    targets = {(r[3], r[4]) for r in rows if r[2] == "agent"}
    assert ("landlock", "fs.read_dir /var") in targets, (rows, proc.stdout[-2000:])
    assert ("seccomp", "keyctl") in targets, rows
    # The journal's session id is the session's number; the product's and the
    # verifier's own denials (e.g. clone3's ENOSYS) carry their env.
    assert all(r[:2] == (rid, str(s1.n)) for r in rows), (rows, s1)
    assert {r[2] for r in rows} <= {"agent", "product", "verifier"}, rows


def test_product_and_verifier_denials_are_journaled_with_their_env(
    audit_on: None, tmp_path: Path
) -> None:
    # Each environment denies itself something: a Landlock read outside its rules
    # and keyctl(2) (seccomp); the product then serves, the check then fails.
    product = (
        "ls /var >/dev/null 2>&1; python3 -c 'import ctypes; ctypes.CDLL(None).syscall(250, 0, 0,"
        " 0)'; exec python3 -m http.server 8000 --bind 127.0.0.1"
    )
    check = (
        "ls /var >/dev/null 2>&1; python3 -c 'import ctypes; ctypes.CDLL(None).syscall(250, 0, 0,"
        " 0)'; false"
    )
    mission = write_mission(tmp_path / "m", max_sessions=1, product_cmd=product, check_cmd=check)
    rid = new_id()
    runs = tmp_path / "runs"
    proc = corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(runs), cwd=tmp_path
    )
    assert (runs / rid / "journal.sqlite").exists(), proc.stdout + proc.stderr
    conn = sqlite3.connect(runs / rid / "journal.sqlite")
    try:
        rows = conn.execute(
            "SELECT run, session, env, kind, target FROM observations"
            " WHERE kind IN ('landlock', 'seccomp')"
        ).fetchall()
    finally:
        conn.close()
    got = {(r[2], r[3], r[4]) for r in rows}
    for env in ("product", "verifier"):
        assert (env, "landlock", "fs.read_dir /var") in got, (rows, proc.stdout[-2000:])
        assert (env, "seccomp", "keyctl") in got, rows
    assert all(r[:2] == (rid, "1") for r in rows), rows
