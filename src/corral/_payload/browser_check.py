"""One browser acceptance check, run inside a verifier sandbox (stdlib only).

Usage: python3 -I browser_check.py '{"script": PATH, "site": DIR, "timeout": S}'

Starts headless Chromium (Debian's binary) with its DevTools endpoint on the
sandbox's own loopback, waits until it answers, then runs the mission's
Playwright script with `CORRAL_CDP_URL` (for `chromium.connect_over_cdp`) and
`PRODUCT_URL` in its environment and `DIR` (the host's Playwright for Python,
bound read-only) on its path. The exit status is the script's; 125 when
Chromium did not come up. Chromium is killed with its process group at the end.
Corral copies this file into the run's tools/ directory; the host never runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

CHROMIUM = "/usr/lib/chromium/chromium"
DEVTOOLS = "http://127.0.0.1:9222"


def _chromium() -> subprocess.Popen[bytes]:
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--mute-audio",
        "--password-store=basic",
        "--user-data-dir=/tmp/corral-check-profile",
        "--remote-debugging-port=9222",
        "--remote-debugging-address=127.0.0.1",
        "about:blank",
    ]
    # Chromium's own output is product-influenced noise: it goes nowhere.
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait_devtools(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with opener.open(DEVTOOLS + "/json/version", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def main() -> int:
    spec = json.loads(sys.argv[1])
    timeout = float(spec.get("timeout") or 60)
    proc = _chromium()
    try:
        if not _wait_devtools(proc, time.monotonic() + min(30.0, timeout)):
            print("corral: Chromium did not start in the verifier sandbox")
            return 125
        env = dict(os.environ)
        env["CORRAL_CDP_URL"] = DEVTOOLS
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("CORRAL_CHECKS", ""), spec["site"]) if p
        )
        # The agent's snapshot is never on the script's path (PYTHONSAFEPATH is
        # set by corral); the script runs from the sandbox's scratch directory.
        sys.stdout.flush()
        return subprocess.call(
            [sys.executable, "-s", spec["script"]], env=env, cwd=os.getcwd(), timeout=timeout
        )
    except subprocess.TimeoutExpired:
        print(f"corral: the browser check ran over {timeout:g}s")
        return 124
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
