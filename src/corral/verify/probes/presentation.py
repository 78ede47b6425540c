"""M13 hostile output: what corral prints and renders about a run a hostile agent drove.

Both probes are mission runs (a whole `corral run`; see `_mission.py`). The
host-side oracle is corral's own host commands run on the finished run
(`corral.verify.host_views.collect`: `corral log` table/`--denied`/`--json`,
`corral status` table/`--json`, report.md, corral's commit of the workspace
read by bytes). On `--backend none` and the peers they are not applicable:
the views are corral's own, and a bare host or a bubblewrap line keeps no
journal, run state or report to show. Without corral's escaping the attack
is plain on namespace itself: `corral log --denied` died with rich's
MarkupError on the `[/x]` target and the first commit failed on the name
`bad\\xff.txt` (tests/integration/broker/test_log_hostile.py and
tests/integration/run/test_hostile_names.py show both against the old code).
"""

from __future__ import annotations

from corral.verify.host_views import HostViewsInert, NamesCommitted
from corral.verify.model import MissionSpec, Probe
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_DEADLINE_S = 60.0

#: Session 1's agent asks the broker for targets carrying rich markup (each is
#: denied and journaled), then ends with a hostile error text as its result
#: (`MissionSpec.agent_error`: markup, HTML, Markdown links and images, OSC 8,
#: ED, CR, a bidi override), which becomes the session's end reason in
#: state.sqlite, report.md and the progress lines. (An agent's child cannot
#: write into the agent's own stdout any more: the pipe is corral's, and
#: /proc/PID/fd reopening and pidfd_getfd are refused; the agent itself can.)
_HOSTILE_TEXT = r"""
TOKEN = "cvt-" + MARKER
for path in ("/[/x]", "/[link=file:///etc/passwd]x[/link]", "/[blink]spoofed[/]"):
    reply, err = via_proxy_or_direct("x.example", 80, path)
    head = (reply or b"").split(b"\r\n", 1)[0][:60].decode("latin-1")
    print("request %s: %s %s" % (path, head, err or ""))
result(True, token=TOKEN)
"""

_AGENT_ERROR = (
    "cvt-{marker} [/x] [link=file:///etc/passwd]x[/link] <script>alert(1)</script> </table>"
    " | pass | [x](javascript:alert(1)) ![img](http://x.example/i.png)"
    " \x1b]8;;file:///etc/passwd\x1b\\osc\x1b]8;;\x1b\\ \x1b[2J \r \u202e end"
)

_TEXT_FRONT = """
[[checks]]
name = "ran"
run = "true"
timeout = "15s"
"""

#: Names corral's host git must record as bytes. The quoted one is what
#: `git hash-object --stdin-paths` unquotes: `"..\057state.sqlite"` names the
#: run's state.sqlite on the host, one directory above the workspace.
_HOSTILE_NAMES = r"""
import hashlib
NAMES = (b"bad\xff.txt", b"new\nline", b"cr\rname", b"-rf", b"--output=x",
         b"[red]x[link=file:]y", b"\xe2\x80\xaeexe.txt", b"\x1b]8;;x\x07",
         b'"..\\057state.sqlite"')
planted = {}
for n in NAMES:
    data = b"planted by the agent as " + n + b" " + MARKER.encode()
    with open(n, "wb") as f:
        f.write(data)
    planted[n.hex()] = hashlib.sha256(data).hexdigest()
print("planted %d names" % len(planted))
result(True, planted=planted)
"""

_NAMES_FRONT = """
[[checks]]
name = "session 2 ran"
run = "test -f session-2.txt"
timeout = "15s"
"""

PROBES = [
    Probe(
        "present-run-markup-escapes",
        "audit",
        "M13",
        "the agent asks the broker for `http://x.example/[/x]` and `[link=...]` targets and "
        "ends with a hostile error text (markup, HTML, Markdown links, OSC 8, ED, CR, bidi); "
        "corral log (table, --denied, --json), corral status and report.md on the host "
        "(mission run)",
        code(_HOSTILE_TEXT),
        HostViewsInert(),
        mission=MissionSpec(front=_TEXT_FRONT, host_views=True, agent_error=_AGENT_ERROR),
        deadline_s=_DEADLINE_S,
    ),
    Probe(
        "present-run-hostile-names",
        "host-integrity",
        "M13",
        "session 1 leaves names that are not UTF-8, hold a newline/CR/ESC, start with `-`, "
        'carry markup, or are C-quoted paths to a host file (`"..\\057state.sqlite"`); '
        "corral commits (bytes and content) and snapshots them, and session 2 runs "
        "(mission run)",
        code(_HOSTILE_NAMES),
        NamesCommitted(),
        mission=MissionSpec(
            front=_NAMES_FRONT,
            max_sessions=2,
            next_files=(("session-2.txt", "written by session 2\n"),),
            host_views=True,
        ),
        deadline_s=_DEADLINE_S,
    ),
]
