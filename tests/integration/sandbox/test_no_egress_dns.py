"""No egress: a name lookup fails at once, permanently, and corral says why (issue 14).

Judged on the host: the lookups corral's responder counted (attempts, not
wall time), the journal's `dns_refused` rows, and the line on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from corral.broker.journal import read_rows

from .conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(60)]

LOOKUP = (
    "import socket, sys\n"
    "try:\n"
    "    socket.getaddrinfo('pypi.org', 443)\n"
    "except socket.gaierror as e:\n"
    "    print(e.errno)\n"
)


def _refused(journal: Path) -> list[dict[str, object]]:
    return [r.detail for r in read_rows(journal, kind="process_event") if r.target == "dns_refused"]


def test_lookup_fails_permanently_once_and_is_journaled(
    corral_exec: ExecFn, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    out = corral_exec("python3", "-c", LOOKUP, opts=("--journal", str(journal)))
    assert out.code == 0, out.stderr
    # EAI_NONAME: "no such name", which clients do not retry; EAI_AGAIN (-3) they do.
    assert out.stdout.strip() == "-2", out.stdout
    [row] = _refused(journal)
    assert row["name"] == "pypi.org"
    assert 1 <= int(str(row["queries_total"])) <= 2  # one A and one AAAA question, no resend
    line = next(x for x in out.stderr.splitlines() if "egress is off" in x)
    assert "pypi.org" in line and "--allow HOST" in line


def test_pip_makes_one_attempt(corral_exec: ExecFn, tmp_path: Path) -> None:
    has_pip = subprocess.run(["python3", "-c", "import pip"], capture_output=True, check=False)
    if has_pip.returncode != 0:
        if os.environ.get("CORRAL_REQUIRE_ALL") == "1":
            pytest.fail("python3 on this host has no pip: run scripts/install-system.sh")
        pytest.skip("python3 on this host has no pip (python3-pip)")
    journal = tmp_path / "j.sqlite"
    cmd = ("python3", "-m", "pip", "download", "--no-deps", "-d", "/tmp/d", "requests")
    out = corral_exec(*cmd, opts=("--journal", str(journal)))
    assert out.code != 0
    [row] = _refused(journal)
    # pip's default is 5 retries (12 questions); with no egress one attempt is all.
    assert int(str(row["queries_total"])) <= 2, row
    assert "allow a host with --allow HOST" in out.stderr


HOSTILE = (
    "import socket, struct\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.settimeout(2)\n"
    "label = b'\\x1b[2Jevil\\xe2\\x80\\xae'\n"
    "q = struct.pack('!6H', 7, 0x0100, 1, 0, 0, 0) + bytes([len(label)]) + label + b'\\0'"
    " + struct.pack('!2H', 1, 1)\n"
    "ptr = struct.pack('!6H', 1, 0, 1, 0, 0, 0) + b'\\xc0\\x0c'\n"
    "for junk in (b'', b'x' * 11, b'\\xff' * 600, ptr):\n"
    "    s.sendto(junk, ('127.0.0.1', 53))\n"
    "s.sendto(q, ('127.0.0.1', 53))\n"
    "while True:\n"
    "    data = s.recv(4096)\n"
    "    if data[:2] == struct.pack('!H', 7):\n"
    "        break\n"
    "print(len(data), data[3] & 15)\n"
)


def test_hostile_queries_are_answered_bounded_and_shown_escaped(
    corral_exec: ExecFn, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    out = corral_exec("python3", "-c", HOSTILE, opts=("--journal", str(journal)))
    assert out.code == 0, out.stderr
    size, rcode = map(int, out.stdout.split())
    assert rcode == 3 and size == 12 + 1 + 11 + 1 + 4  # header + the question, nothing more
    assert "\x1b" not in out.stderr and "\u202e" not in out.stderr
    line = next(x for x in out.stderr.splitlines() if "egress is off" in x)
    assert "\\x1b[2Jevil\\u202e" in line
    assert json.dumps(_refused(journal))  # the raw name stays in the journal
