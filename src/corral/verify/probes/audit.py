"""Audit (M9) and fail-closed (M10).

An audit probe provokes an event corral can observe (timeout, OOM kill,
pids-limit hit, processes killed at teardown, a broker decision, a seccomp
or Landlock denial) and the attack is *that the event goes unrecorded*: it
is "allowed" unless the backend's end-of-task report (`corral exec --json`)
or the journal (`--journal FILE`) records it. Fail-closed probes ask for a
journal that cannot be written: the command must not run at all.
"""

from __future__ import annotations

from corral.verify.model import JournalLacks, Need, PathExists, Probe, ProbeLimits
from corral.verify.oracles import (
    AnyOf,
    BrokerKilled,
    DegradationRecorded,
    Fact,
    HitLogged,
    HitMatches,
    JournalHas,
    JournalShape,
    RefusedWith,
    ReportField,
)
from corral.verify.probes._dsl import MCP_CLIENT, MCP_ROUTE, code

__all__ = ["PROBES"]

_TIMEOUT = code("""
time.sleep(4 * SLOW)
""")
_OOM = code("""
chunks = []
for i in range(32):
    chunks.append(bytearray(16 << 20))
    for j in range(0, 16 << 20, 4096):
        chunks[-1][j] = 1
""")
_DAEMONS = code("""
for i in range(3):
    detach(sleeper(30))
time.sleep(0.2)
""")
_PIDS = code("""
for i in range(100):
    try:
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
    except OSError:
        break
time.sleep(0.5)
""")
_DENIED_REQUEST = code("""
r, e = via_proxy_or_direct("127.0.0.1", P["http_b_port"], "/secret/" + MARKER)
net_report("denied request", r, e)
""")
_ALLOWED_REQUEST = code("""
r, e = via_proxy_or_direct(P["http_a_host"], P["http_a_port"], "/ok")
net_report("allowed request", r, e)
""")
_JOURNAL: frozenset[Need] = frozenset({"journal"})
_BROKER_JOURNAL: frozenset[Need] = frozenset({"broker", "journal"})
_KERNEL_AUDIT_JOURNAL: frozenset[Need] = frozenset({"journal", "kernel-audit"})
_ALLOW_A = ("{http_a_host}:{http_a_port}",)
_RAN = Fact("ran", "the command ran although its journal could not be written")
_RAN_CODE = code("""
open(P["ws"] + "/ran-" + MARKER, "w").close()
""")

PROBES: list[Probe] = [
    Probe(
        "audit-timeout-reported",
        "audit",
        "M9",
        "a wall-clock timeout is reported (reason timeout, exit 124)",
        _TIMEOUT,
        AnyOf((ReportField("reason", equals="timeout"), ReportField("exit", equals=124))),
        limits=ProbeLimits(timeout_s=1.0),
        serial=True,
    ),
    Probe(
        "audit-oom-reported",
        "audit",
        "M9",
        "an OOM kill is reported (reason oom, oom_kills >= 1)",
        _OOM,
        AnyOf((ReportField("reason", equals="oom"), ReportField("oom_kills", at_least=1))),
        limits=ProbeLimits(memory="128M"),
        serial=True,
    ),
    Probe(
        "audit-teardown-counted",
        "audit",
        "M9",
        "processes killed at teardown are counted (3 setsid daemons)",
        _DAEMONS,
        ReportField("processes_killed_at_end", at_least=3),
        grace_s=0.5,
    ),
    Probe(
        "audit-pids-hit-reported",
        "audit",
        "M9",
        "a pids-limit hit is reported (pids_limit_hits >= 1)",
        _PIDS,
        ReportField("pids_limit_hits", at_least=1),
        limits=ProbeLimits(pids=32),
        serial=True,
    ),
    Probe(
        "audit-journal-timeout",
        "audit",
        "M9",
        "a wall-clock timeout is journaled",
        _TIMEOUT,
        JournalHas((), ("timeout",)),
        limits=ProbeLimits(timeout_s=1.0),
        needs=_JOURNAL,
        serial=True,
    ),
    Probe(
        "audit-journal-oom",
        "audit",
        "M9",
        "an OOM kill is journaled",
        _OOM,
        JournalHas((), ("oom",)),
        limits=ProbeLimits(memory="128M"),
        needs=_JOURNAL,
        serial=True,
    ),
    Probe(
        "audit-journal-teardown",
        "audit",
        "M9",
        "processes killed at teardown are journaled",
        _DAEMONS,
        JournalHas((), ("teardown", "killed")),
        needs=_JOURNAL,
        grace_s=0.5,
    ),
    Probe(
        "audit-journal-pids",
        "audit",
        "M9",
        "a pids-limit hit is journaled",
        _PIDS,
        JournalHas((), ("pids",)),
        limits=ProbeLimits(pids=32),
        needs=_JOURNAL,
        serial=True,
    ),
    Probe(
        "audit-journal-broker-deny",
        "audit",
        "M9",
        "a broker denial is journaled with its target",
        _DENIED_REQUEST,
        JournalHas(("deny", "{http_b_port}")),
        allow=_ALLOW_A,
        needs=_BROKER_JOURNAL,
    ),
    Probe(
        "audit-journal-broker-allow",
        "audit",
        "M9",
        "an allowed brokered request is journaled with its target",
        _ALLOWED_REQUEST,
        JournalHas(("allow", "{http_a_host}")),
        allow=_ALLOW_A,
        needs=_BROKER_JOURNAL,
    ),
    Probe(
        "audit-journal-row-shape",
        "audit",
        "M9",
        "journal rows carry time, run, session, env, kind, target, decision, rule, reason, detail",
        _DENIED_REQUEST,
        JournalShape(),
        allow=_ALLOW_A,
        needs=_BROKER_JOURNAL,
    ),
    Probe(
        "audit-journal-seccomp",
        "audit",
        "M9",
        "a seccomp denial (bpf) is journaled",
        code("""
          attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1) + b"\\0" * 112)
          r, e = sysc("bpf", 0, attr, 128)
          sys_result("bpf", r, e)
          """),
        JournalHas(("seccomp", "bpf")),
        needs=_KERNEL_AUDIT_JOURNAL,
    ),
    Probe(
        "audit-journal-landlock",
        "audit",
        "M9",
        "a Landlock denial (reading /etc/shadow's directory) is journaled",
        code("""
          show("root dir", read("/root/.profile"))
          try:
              os.listdir("/")
          except OSError as e:
              print("listdir /:", errname(e.errno))
          """),
        JournalHas(("landlock", "fs.read_dir")),
        needs=_KERNEL_AUDIT_JOURNAL,
    ),
    Probe(
        "failclosed-journal-unwritable",
        "audit",
        "M10",
        "ask for a journal in a directory that does not exist: the command must not run",
        _RAN_CODE,
        _RAN,
        journal="/proc/corral-verify-none/journal.sqlite",
        refusal_ok=True,
        checks=(PathExists("ran", "{ws}/ran-{marker}"),),
    ),
    Probe(
        "failclosed-journal-is-directory",
        "audit",
        "M10",
        "ask for a journal path that is a directory: the command must not run",
        _RAN_CODE,
        _RAN,
        journal="{ws_parent}",
        refusal_ok=True,
        checks=(PathExists("ran", "{ws}/ran-{marker}"),),
    ),
    Probe(
        "audit-mcp-denied-tool",
        "audit",
        "M9",
        "call an MCP tool the gateway's policy denies (demo shred): it must not run, and the "
        "denial must be journaled",
        MCP_CLIENT
        + code("""
          mcp_call("shred", {"path": MARKER})
          """),
        AnyOf(
            (
                Fact("ran", "the denied MCP tool ran on the demo server"),
                Fact("unjournaled", "the denial of demo/shred went unjournaled"),
            )
        ),
        broker_config=MCP_ROUTE,
        checks=(
            PathExists("ran", "{mcp_ws}/shred-called"),
            JournalLacks("unjournaled", "{mcp_journal}", ("demo/shred", "deny", "{marker}")),
        ),
        baseline="the gateway is the host's own: without a sandbox the probe reaches the same "
        "gateway, whose policy and journal hold regardless",
        deadline_s=40,
    ),
    Probe(
        "failclosed-missing-layer",
        "audit",
        "M10",
        "start with the cgroup layer missing (cgroups read-only): refuse with 125, run nothing",
        _RAN_CODE,
        RefusedWith("ran"),
        needs=frozenset({"faults"}),
        fault="ro-cgroups",
        refusal_ok=True,
        checks=(PathExists("ran", "{ws}/ran-{marker}"),),
    ),
    Probe(
        "failclosed-degraded-recorded",
        "audit",
        "M10",
        "start with the cgroup layer missing and the degradation accepted: it must be recorded",
        _RAN_CODE,
        DegradationRecorded("ran", "cgroup"),
        needs=frozenset({"faults", "exec-json"}),
        fault="ro-cgroups",
        exec_args=("--allow-degraded", "cgroup"),
        refusal_ok=True,
        checks=(PathExists("ran", "{ws}/ran-{marker}"),),
    ),
    Probe(
        "failclosed-broker-dies",
        "audit",
        "M10",
        "SIGKILL the broker during an allowlisted download: the transfer must break and "
        "nothing may leave afterwards",
        code("""
          a, port = P["http_a_host"], P["http_a_port"]
          px = proxy()
          path = "/m/%s/big" % MARKER
          got, err = 0, None
          try:
              if px:
                  s = socket.create_connection((px[0], px[1]), timeout=5)
                  s.sendall(http_req("http://%s:%d%s" % (a, port, path), "%s:%d" % (a, port),
                                     px[2]))
              else:
                  s = socket.create_connection((a, port), timeout=5)
                  s.sendall(http_req(path, "%s:%d" % (a, port)))
              got, told = 0, False
              while True:
                  d = s.recv(65536)
                  if not d:
                      break
                  got += len(d)
                  if got > 65536 and not told:
                      ready()
                      told = True
          except OSError as e:
              err = errname(e.errno) if e.errno else type(e).__name__
          print("download: %d bytes, error %s" % (got, err))
          time.sleep(0.5)
          r, e = via_proxy_or_direct(a, port, "/m/%s/after" % MARKER)
          r2, e2 = tcp(a, port, http_req("/m/%s/after-direct" % MARKER, a), timeout=2)
          result(r is not None and b"A-OK" in r, after=e, direct=e2)
          """),
        BrokerKilled(
            AnyOf(
                (
                    HitLogged(("http_a_done",)),
                    HitMatches("http_a", "/after"),
                )
            )
        ),
        allow=_ALLOW_A,
        needs=_BROKER_JOURNAL,
        during="kill-broker",
        deadline_s=25,
        serial=True,
    ),
]
