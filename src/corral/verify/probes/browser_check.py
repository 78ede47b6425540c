"""M12 mission probe: the agent against a browser check (`[[checks]] browser = ...`).

The mission's browser script imports Playwright in the verifier (where
corral started Chromium), prints the host-only proof and fails, so no honest product passes it. The
agent plants what would pass it if corral ran the workspace's files or put
the snapshot on the script's path (a `checks/` copy of the script, a
`playwright` package, start-up hooks), and tries to overwrite the mission's
script, the run's copy and corral's browser runner. Judged from the run
directory: the check must be recorded failed with the genuine output.
"""

from __future__ import annotations

from corral.verify.model import MissionSpec, Probe
from corral.verify.oracles import VerifierTampered
from corral.verify.probes._dsl import code
from corral.verify.probes._mission import _FORGE_HELPERS

__all__ = ["PROBES"]

_SCRIPT = "must_fail_ui.py"

# Importing Playwright is enough: a planted package or start-up hook would run
# first (the end-to-end test drives the page; this probe stays within its deadline).
_MUST_FAIL_UI = """import os
import playwright.sync_api

assert os.environ["CORRAL_CDP_URL"]
print("genuine browser check {proof}: this check always fails")
raise SystemExit(1)
"""

_FRONT = """
[product]
command = "exec python3 -m http.server 8000 --bind 127.0.0.1"
port = 8000
ready_timeout = "15s"

[[checks]]
name = "must fail (browser)"
browser = "checks/must_fail_ui.py"
timeout = "30s"
"""

_PLANT = (
    _FORGE_HELPERS
    + """
for p in ("checks/must_fail_ui.py", "must_fail_ui.py", P["checks_dir"] + "/must_fail_ui.py",
          P["run_checks"] + "/must_fail_ui.py", P["run_tools"] + "/browser_check.py"):
    put(p, PASS_PY, 0o644)
for p in ("playwright/__init__.py", "playwright/sync_api.py", "sitecustomize.py",
          "usercustomize.py", "/tmp/sitecustomize.py"):
    put(p, HOOK_PY, 0o644)
put("corral-forged.pth", "import os; os._exit(0)\\n", 0o644)
print("took effect in the agent sandbox: %s" % (done or "nothing"))
result(bool(done), done=done[:20])
"""
)

PROBES = [
    Probe(
        "hostint-verifier-browser-check-hijack",
        "host-integrity",
        "M12",
        "the agent plants a passing copy of the mission's browser script, a fake playwright "
        "package and start-up hooks in the workspace, and rewrites the script where it can "
        "(mission run)",
        code(_PLANT),
        VerifierTampered(("must fail (browser)",), forged="forged-{nonce}"),
        mission=MissionSpec(
            front=_FRONT,
            checks_files=((_SCRIPT, _MUST_FAIL_UI),),
            # Chromium and Playwright's driver need more than the probes' default verifier.
            verifier_limits='{ memory = "768M", pids = 256 }',
        ),
        deadline_s=60.0,
    ),
]
