"""Guarantees every isolating backend keeps, each an attack with a host-side oracle.

Run against the fake too, as the control: it isolates nothing, so there
every attack must *succeed* - proof that each oracle sees the attack when it
works. On a real backend it must fail.
"""

from __future__ import annotations

import os
import select
import socket
from pathlib import Path

import pytest

from tests.conformance.cases import Case
from tests.conformance.helpers import PY, free_port, run, spec


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def test_host_canary_unreadable(case: Case, ws: Path, tmp_path: Path) -> None:
    secret = f"canary-{os.urandom(8).hex()}"
    canary = tmp_path / "canary"  # beside the workspace, in no mount
    canary.write_text(secret)
    run(case.make(), spec(ws, "/bin/sh", "-c", f"cat {canary} > leak 2>/dev/null; exit 0"))
    leak = ws / "leak"
    leaked = leak.exists() and secret in leak.read_text(errors="replace")
    assert leaked is (not case.isolates)


def test_write_outside_workspace(case: Case, ws: Path, tmp_path: Path) -> None:
    target = tmp_path / "planted"
    run(case.make(), spec(ws, "/bin/sh", "-c", f"echo pwned > {target}; exit 0"))
    assert target.exists() is (not case.isolates)


def test_host_loopback_unreachable(case: Case, ws: Path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as host:
        dial = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'x')\n"
            "except OSError:\n"
            "    pass\n"
        )
        run(case.make(), spec(ws, PY, "-c", dial))
        # A connection that reached the host's listener is queued there.
        reached = bool(select.select([host], [], [], 0)[0])
    assert reached is (not case.isolates)
