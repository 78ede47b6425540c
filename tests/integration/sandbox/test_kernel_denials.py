"""Landlock and seccomp denials reach the journal through kernel audit (issue 15).

Kernel audit is off on this host and corral never turns it on: each test sets
the flag for its own duration and restores the previous state.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import doctor
from corral.sandbox import kaudit

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_root, pytest.mark.requires_audit]

# ls of a directory outside the Landlock rules, mkdir there, and keyctl(2)
# (denied with EPERM by the seccomp profile) through ctypes.
ATTACK = (
    "ls /var >/dev/null 2>&1; mkdir /var/corral-x 2>/dev/null; "
    'python3 -c "import ctypes; print(ctypes.CDLL(None).syscall(250, 0, 0, 0))"; true'
)

# From inside: an AUDIT_USER message and a message typed as a Landlock record,
# both claiming a denial on /forged-by-sandbox.
FORGE = r"""
import socket, struct
body = b"audit(1.0:1): domain=1 blockers=fs.read_file path=\"/forged-by-sandbox\""
out = []
for mtype in (1005, 1423):
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)
        s.send(struct.pack("=IHHII", 16 + len(body), mtype, 5, 1, 0) + body)
        s.settimeout(1.0)
        reply = s.recv(8192)
        err = struct.unpack_from("=i", reply, 16)[0] if len(reply) >= 20 else 0
        out.append(f"{mtype}:sent:{err}")
    except OSError as exc:
        out.append(f"{mtype}:refused:{exc.errno}")
print(" ".join(out))
"""


def _audit_state(enabled: bool) -> Iterator[None]:
    prev = kaudit.audit_enabled()
    assert prev is not None
    kaudit.set_audit_enabled(enabled)
    try:
        yield
    finally:
        kaudit.set_audit_enabled(prev)


@pytest.fixture
def audit_on() -> Iterator[None]:
    yield from _audit_state(True)


@pytest.fixture
def audit_off() -> Iterator[None]:
    yield from _audit_state(False)


def _kernel_rows(journal: Path) -> list[tuple[str, str, str, str, str, dict[str, object]]]:
    with sqlite3.connect(journal) as db:
        rows = db.execute(
            "SELECT run, session, kind, target, decision, detail FROM observations"
            " WHERE kind IN ('landlock', 'seccomp') ORDER BY id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]


def test_landlock_and_seccomp_denials_are_journaled_with_run_and_session(
    audit_on: None, corral_exec: ExecFn, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    out = corral_exec(
        "sh",
        "-c",
        ATTACK,
        opts=("--journal", str(journal), "--run", "run-kd1", "--session", "sess-kd1"),
    )
    assert out.code == 0, out.stderr
    # The attack was denied in the sandbox (keyctl returned -1) ...
    assert out.stdout.strip().endswith("-1")
    rows = _kernel_rows(journal)
    targets = {(r[2], r[3]) for r in rows}
    # ... and every denial is on the host, under this run and session.
    assert ("landlock", "fs.read_dir /var") in targets, rows
    assert ("landlock", "fs.make_dir /var") in targets, rows
    assert ("seccomp", "keyctl") in targets, rows
    assert all(r[:2] == ("run-kd1", "sess-kd1") and r[4] == "deny" for r in rows)
    assert all("audit_serial" in r[5] for r in rows)


def test_with_audit_off_nothing_is_journaled_and_doctor_says_why(
    audit_off: None, corral_exec: ExecFn, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    out = corral_exec("sh", "-c", ATTACK, opts=("--journal", str(journal), "--run", "run-kd2"))
    assert out.code == 0, out.stderr
    assert out.stdout.strip().endswith("-1")
    assert _kernel_rows(journal) == []
    status = doctor.probe_audit()
    assert not status.available
    assert "not journaled" in status.reason and "auditctl -e 1" in status.hint


def test_a_sandbox_cannot_forge_an_audit_record(
    audit_on: None, corral_exec: ExecFn, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    out = corral_exec("python3", "-c", FORGE, opts=("--journal", str(journal), "--run", "run-kd3"))
    assert out.code == 0, out.stderr
    # The kernel refuses audit netlink from a non-initial user namespace (no
    # CAP_AUDIT_WRITE there) ...
    results = out.stdout.split()
    assert len(results) == 2 and all(":sent:0" not in r for r in results), out.stdout
    # ... and nothing the sandbox wrote is in the journal.
    with sqlite3.connect(journal) as db:
        hits = db.execute(
            "SELECT count(*) FROM observations WHERE target LIKE '%forged-by-sandbox%'"
            " OR reason LIKE '%forged-by-sandbox%'"
        ).fetchone()[0]
    assert hits == 0


def test_read_only_mount_writes_are_refused_unjournaled_and_doctor_says_so(
    audit_on: None, corral_exec: ExecFn, tmp_path: Path
) -> None:
    """The documented gap (docs/broker.md): EROFS comes before Landlock, so no row.

    The positive control (a write below /var, a tmpfs Landlock covers) must
    leave its row in the same sandbox: if this test starts failing because
    /usr or /etc rows appear, the gap closed and the docs must say so.
    """
    name = f"corral-kd-{os.getpid()}"
    script = (
        f"touch /usr/{name} /etc/{name}; mkdir /usr/{name}.d; echo x >> /etc/passwd;"
        f" touch /var/{name}; true"
    )
    journal = tmp_path / "j.sqlite"
    out = corral_exec("sh", "-c", script, opts=("--journal", str(journal), "--run", "run-kd4"))
    assert out.code == 0, out.stderr
    # /etc/passwd is corral's own file in the staged /etc, owned by nobody (0644):
    # the permission check refuses it before the read-only mount does.
    assert out.stderr.count("Read-only file system") == 3, out.stderr
    assert "cannot create /etc/passwd" in out.stderr, out.stderr
    assert not any(os.path.lexists(p) for p in (f"/usr/{name}", f"/etc/{name}", f"/usr/{name}.d"))
    paths = [str(r[3]) for r in _kernel_rows(journal)]
    assert any(p.endswith(" /var") for p in paths), paths
    assert not any("/usr" in p or "/etc" in p for p in paths), paths
    status = doctor.probe_audit()
    assert status.available and doctor.READ_ONLY_MOUNT_GAP in status.reason
    assert "/usr" in status.reason and "EROFS" in status.reason
