"""One acceptance check's `setup`, main command and `teardown`, inside its verifier sandbox.

Usage: python3 -I check_run.py '{"setup": CMD|null, "teardown": CMD|null, "main": ARGV,
"timeout": SECONDS, "reason": PATH}'

`setup` and `teardown` are shell commands; `main` is the check itself (a
shell command's argv or `http_check.py`'s). Each gets `timeout` seconds and
is killed with its whole process group when it overruns; time the run
spent paused does not count (`pauses.json` next to this file: the host's
record of the run's pauses as CLOCK_MONOTONIC intervals; this process is
frozen with the run, and its own timers run on meanwhile). `teardown` runs
whatever happened before it (setup failed, the check failed or timed out).
Exit 0 when all passed; 124 when the check timed out; 1 otherwise. The
first line of the check's own output that says why it failed (or the exit
status) goes to `reason`, one line, for the host to show. The host reads
it as the word of the sandbox: bounded and escaped there, and never the
verdict, which is this process's exit status as the sandbox reports it.
Stdlib only; the host never runs this file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

TIMED_OUT = 124
_TAIL = 64 << 10
_PAUSES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pauses.json")


def _paused_s(pauses: str | None, since: float, now: float) -> float:
    """Seconds of [since, now] the run spent paused, by the host's record (0 without one)."""
    if not pauses:
        return 0.0
    try:
        with open(pauses, encoding="utf-8") as f:
            intervals = json.loads(f.read(1 << 16))
        total = 0.0
        for start, end in intervals:
            lo, hi = max(float(start), since), min(now if end is None else float(end), now)
            total += max(hi - lo, 0.0)
    except (OSError, ValueError, TypeError):
        return 0.0
    return total


def _run(
    argv: list[str], timeout: float, capture: bool, pauses: str | None = None
) -> tuple[int | None, str]:
    """(exit status or None on timeout, the last output lines when `capture`)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        start_new_session=True,
    )
    out = b""
    left = timeout
    while True:
        try:
            if capture:
                assert proc.stdout is not None
                out, _ = proc.communicate(timeout=left)
            else:
                proc.wait(timeout=left)
            break
        except subprocess.TimeoutExpired:
            # Waiting what is left never overshoots: a paused clock runs no
            # faster than the real one. Budget left means a pause came between.
            now = time.monotonic()
            left = timeout - (now - started - _paused_s(pauses, started, now))
            if left > 0:
                continue
        # The group, not just the child: a shell's children would outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, ""
    text = out[-_TAIL:].decode("utf-8", "replace")
    if capture:
        sys.stdout.write(text)
        sys.stdout.flush()
    return proc.returncode, text


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def main() -> int:
    spec = json.loads(sys.argv[1])
    timeout = float(spec["timeout"])
    pauses = _PAUSES
    reason = ""
    rc = 0
    if spec.get("setup"):
        code, _ = _run(["/bin/sh", "-c", spec["setup"]], timeout, False, pauses)
        if code != 0:
            reason = f"setup timed out after {timeout:g}s" if code is None else f"setup exit {code}"
            rc = 1
    if rc == 0:
        code, out = _run(list(spec["main"]), timeout, True, pauses)
        if code is None:
            reason, rc = f"timed out after {timeout:g}s", TIMED_OUT
        elif code != 0:
            line = _last_line(out)
            reason = line if spec.get("http") else f"exit {code}" + (f": {line}" if line else "")
            rc = 1
        else:
            reason = _last_line(out) if spec.get("http") else "passed"
    if spec.get("teardown"):
        code, _ = _run(["/bin/sh", "-c", spec["teardown"]], timeout, False, pauses)
        if code != 0 and rc == 0:
            reason = f"teardown exit {code}" if code is not None else "teardown timed out"
            rc = 1
    with open(spec["reason"], "w", encoding="utf-8") as f:
        f.write(reason[:4000] + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
