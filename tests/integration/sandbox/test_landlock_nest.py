"""The command's nested Landlock domain keeps the init out of its reach (kernel semantics).

In a child process: apply an outer domain (as the init does), fork a
dumpable "init" B that stays in it, fork a "command" C that enters
`landlock.nest()` (or, as the control, does not) and tries ptrace-mode
access (open /proc/B/mem) and a signal. The runner is root, so only
Landlock (not dumpability, not uids) can refuse.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from corral.sandbox import landlock

pytestmark = [pytest.mark.requires_landlock, pytest.mark.timeout(30)]

_SCRIPT = """
import os, signal, sys, time
from corral.sandbox import landlock
rules = landlock.LandlockRules.from_dict({"read_only": ["/"], "read_write": ["/proc"]})
landlock.apply(rules)
b = os.fork()
if b == 0:
    time.sleep(20)
    os._exit(0)
r, w = os.pipe()
c = os.fork()
if c == 0:
    if sys.argv[1] == "nest":
        landlock.nest(rules)
    out = []
    try:
        with open(f"/proc/{b}/mem", "rb"):
            out.append("mem=ok")
    except OSError as exc:
        out.append(f"mem=denied({exc.errno})")
    try:
        os.kill(b, signal.SIGCONT)
        out.append("kill=ok")
    except OSError as exc:
        out.append(f"kill=denied({exc.errno})")
    os.write(w, " ".join(out).encode())
    os._exit(0)
os.close(w)
os.waitpid(c, 0)
print(os.read(r, 200).decode())
os.kill(b, signal.SIGKILL)
os.waitpid(b, 0)
"""


def _attempt(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=25,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_same_domain_reaches_the_init() -> None:
    # The control: in the init's own domain the "command" gets both.
    assert _attempt("same") == "mem=ok kill=ok"


def test_nested_domain_cannot_ptrace_or_signal_the_init() -> None:
    out = _attempt("nest")
    assert "mem=denied(13)" in out, out
    if landlock.abi_version() >= 6:
        assert "kill=denied(1)" in out, out
