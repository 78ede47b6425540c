"""Oracle logic: each judge decides from host-side evidence only."""

from __future__ import annotations

import pytest

from corral.verify.model import Evidence, Expected, Hit, Observed
from corral.verify.oracles import (
    AllOf,
    AnyOf,
    BrokerKilled,
    CpuRateAbove,
    DegradationRecorded,
    ExfilJournaled,
    Fact,
    HitLogged,
    HitMatches,
    HostStatus,
    InjectedNotLeaked,
    JournalHas,
    JournalShape,
    MemoryAbove,
    NonceEcho,
    OutlivedLimit,
    ProcsAbove,
    RefusedWith,
    Reported,
    ReportField,
    SecretSeen,
    Survived,
    excerpt,
    key_digest,
    verdict,
)

SECRET = "CORRALCANARY-home-0123456789abcdef"


def ev(**kw: object) -> Evidence:
    base: dict[str, object] = {
        "secrets": {"home": SECRET},
        "ctx": {"marker": "cvm0123456789", "nonce": "abc123"},
    }
    base.update(kw)
    return Evidence(**base)  # type: ignore[arg-type]


def test_secret_seen_in_stdout_or_stderr() -> None:
    o = SecretSeen(("home",))
    assert o.judge(ev(stdout=f"read: {SECRET}")).observed == "allowed"
    assert o.judge(ev(stderr=f"oops {SECRET}")).observed == "allowed"
    assert o.judge(ev(stdout="read: ERR EACCES")).observed == "denied"


def test_secret_seen_ignores_the_exit_status() -> None:
    assert SecretSeen(("home",)).judge(ev(stdout="nothing", exit=0)).observed == "denied"
    assert SecretSeen(("home",)).judge(ev(stdout=SECRET, exit=1)).observed == "allowed"


def test_secret_seen_unknown_canary_is_an_error() -> None:
    assert SecretSeen(("nope",)).judge(ev()).observed == "error"


def test_hit_logged_filters_by_server() -> None:
    hit = Hit("http_b", "cvm0123456789", "GET /secret", 1.0)
    assert HitLogged(("http_b",)).judge(ev(hits=(hit,))).observed == "allowed"
    assert HitLogged(("udp",)).judge(ev(hits=(hit,))).observed == "denied"


def test_survived() -> None:
    assert Survived().judge(ev(survivors=("python3 sleep cvm0",))).observed == "allowed"
    assert Survived().judge(ev()).observed == "denied"


def test_fact_missing_is_error_and_meaning_is_filled() -> None:
    o = Fact("created", "{marker} was created")
    assert o.judge(ev()).observed == "error"
    j = o.judge(ev(facts={"created": True}))
    assert j.observed == "allowed" and "cvm0123456789 was created" in j.why
    assert o.judge(ev(facts={"created": False})).observed == "denied"


def test_reported() -> None:
    assert Reported().judge(ev(results=({"ok": True, "ret": 3},))).observed == "allowed"
    assert Reported().judge(ev(results=({"ok": False, "errno": "EPERM"},))).observed == "denied"
    # killed before reporting (seccomp KILL) counts as denied
    assert Reported().judge(ev()).observed == "denied"


def test_nonce_echo_transforms() -> None:
    assert NonceEcho("rev").judge(ev(stdout="321cba\n")).observed == "allowed"
    assert NonceEcho("upper").judge(ev(stdout="ABC123")).observed == "allowed"
    assert NonceEcho("plain").judge(ev(stdout="abc12")).observed == "denied"


def test_host_status_fields() -> None:
    rows = (
        {
            "pid": "7",
            "Uid": "64000\t64000\t64000\t64000",
            "CapEff": "0000000000000000",
            "NoNewPrivs": "1",
            "Seccomp": "2",
        },
    )
    assert HostStatus("Uid", "zero").judge(ev(facts={"host_status": rows})).observed == "denied"
    assert (
        HostStatus("CapEff", "nonzero").judge(ev(facts={"host_status": rows})).observed == "denied"
    )
    assert (
        HostStatus("NoNewPrivs", "zero-flag").judge(ev(facts={"host_status": rows})).observed
        == "denied"
    )
    root = ({"pid": "8", "Uid": "1000\t0\t0\t0", "CapEff": "000001ffffffffff", "Seccomp": "0"},)
    assert HostStatus("Uid", "zero").judge(ev(facts={"host_status": root})).observed == "allowed"
    assert (
        HostStatus("CapEff", "nonzero").judge(ev(facts={"host_status": root})).observed == "allowed"
    )
    assert (
        HostStatus("Seccomp", "zero-flag").judge(ev(facts={"host_status": root})).observed
        == "allowed"
    )
    assert HostStatus("Uid", "zero").judge(ev(facts={"host_status": []})).observed == "error"


def test_memory_uses_the_highest_source() -> None:
    limit = 256 * 2**20
    assert MemoryAbove(limit).judge(ev(peak_rss=100 * 2**20)).observed == "denied"
    assert MemoryAbove(limit).judge(ev(cgroup_peak=700 * 2**20)).observed == "allowed"
    assert (
        MemoryAbove(limit).judge(ev(backend_report={"peak_memory_bytes": 400 * 2**20})).observed
        == "allowed"
    )


def test_procs_cpu_wall() -> None:
    assert ProcsAbove(64).judge(ev(max_procs=65)).observed == "allowed"
    assert ProcsAbove(64).judge(ev(max_procs=64)).observed == "denied"
    assert CpuRateAbove(0.5).judge(ev(cpu_s=3.9, wall_s=3.0)).observed == "allowed"
    assert CpuRateAbove(0.5).judge(ev(cpu_s=0.8, wall_s=3.2)).observed == "denied"
    # The backend's own report counts when it is higher than the host's measure.
    assert (
        CpuRateAbove(0.5).judge(ev(wall_s=3.0, backend_report={"cpu_s": 2.0})).observed == "allowed"
    )
    assert CpuRateAbove(0.5).judge(ev(cpu_s=1.0)).observed == "error"


def test_outlived_limit_decides_from_host_paths_and_the_timeout_record() -> None:
    o = OutlivedLimit("started", "finished")
    timeout = {"reason": "timeout", "exit": 124}
    ran = {"started": True, "finished": False}
    # A slow teardown on a loaded host no longer counts: only what the task did.
    assert o.judge(ev(facts=ran, backend_report=timeout, wall_s=9.0)).observed == "denied"
    outlived = {"started": True, "finished": True}
    assert o.judge(ev(facts=outlived, backend_report=timeout)).observed == "allowed"
    assert o.judge(ev(facts=outlived)).observed == "allowed"  # the baseline: no limit at all
    assert o.judge(ev(facts=ran, survivors=("sleep",))).observed == "allowed"
    assert o.judge(ev(facts=ran, harness_timeout=True)).observed == "allowed"
    # Nothing tested: the task never ran, or stopped without the host's timeout.
    assert o.judge(ev(facts={"started": False, "finished": False})).observed == "error"
    assert o.judge(ev(facts=ran, backend_report={"reason": "exited"})).observed == "error"
    assert o.judge(ev(facts=ran)).observed == "error"
    assert o.judge(ev()).observed == "error"


def test_report_field_means_unrecorded_when_absent() -> None:
    o = ReportField("reason", equals="timeout")
    assert o.judge(ev()).observed == "allowed"
    assert o.judge(ev(backend_report={"reason": "exited"})).observed == "allowed"
    assert o.judge(ev(backend_report={"reason": "timeout"})).observed == "denied"
    n = ReportField("processes_killed_at_end", at_least=3)
    assert n.judge(ev(backend_report={"processes_killed_at_end": 2})).observed == "allowed"
    assert n.judge(ev(backend_report={"processes_killed_at_end": 4})).observed == "denied"


def test_journal_has_templates_and_any_of() -> None:
    rows = ({"kind": "http", "target": "127.0.0.1:4242", "decision": "deny"},)
    o = JournalHas(("deny", "{port}"))
    assert o.judge(ev(journal=rows, ctx={"port": 4242})).observed == "denied"
    assert o.judge(ev(journal=rows, ctx={"port": 9})).observed == "allowed"
    assert o.judge(ev(journal=None)).observed == "allowed"
    assert (
        JournalHas((), ("oom", "memory")).judge(ev(journal=({"kind": "oom_kill"},))).observed
        == "denied"
    )


def test_journal_shape() -> None:
    full = {
        f: "x"
        for f in (
            "time",
            "run",
            "session",
            "env",
            "kind",
            "target",
            "decision",
            "rule",
            "reason",
            "detail",
        )
    }
    assert JournalShape().judge(ev(journal=(full,))).observed == "denied"
    assert JournalShape().judge(ev(journal=({"kind": "x"},))).observed == "allowed"
    assert JournalShape().judge(ev(journal=())).observed == "allowed"


def test_exfil_must_be_journaled_before_the_hit() -> None:
    hit = Hit("http_a", "cvm0123456789", "GET /ok?d=cvm0123456789", 1000.0)
    early = {"time": 999.9, "target": "/ok?d=cvm0123456789"}
    late = {"time": 1000.5, "target": "/ok?d=cvm0123456789"}
    o = ExfilJournaled("http_a")
    assert o.judge(ev(hits=(hit,), journal=(early,))).observed == "denied"
    assert o.judge(ev(hits=(hit,), journal=(late,))).observed == "allowed"
    assert o.judge(ev(hits=(hit,), journal=None)).observed == "allowed"
    assert o.judge(ev(hits=(), journal=None)).observed == "denied"


def test_any_and_all() -> None:
    yes, no = Survived(), SecretSeen(("home",))
    e = ev(survivors=("x",))
    assert AnyOf((no, yes)).judge(e).observed == "allowed"
    assert AllOf((no, yes)).judge(e).observed == "denied"
    assert AnyOf((SecretSeen(("nope",)), no)).judge(e).observed == "error"


@pytest.mark.parametrize(
    ("expected", "observed", "baseline", "exempt", "want"),
    [
        ("denied", "denied", False, False, "ok"),
        ("denied", "allowed", False, False, "unexpected"),
        ("denied", "error", False, False, "unexpected"),
        ("allowed", "denied", False, False, "unexpected"),
        ("denied", "allowed", True, False, "unexpected"),
        ("denied", "denied", True, False, "broken-probe"),
        ("denied", "denied", True, True, "ok"),
        ("allowed", "allowed", True, False, "ok"),
        ("allowed", "denied", True, False, "broken-probe"),
        ("denied", "error", True, True, "broken-probe"),
    ],
)
def test_verdict_table(
    expected: Expected, observed: Observed, baseline: bool, exempt: bool, want: str
) -> None:
    assert verdict(expected, observed, baseline=baseline, exempt=exempt) == want


def test_excerpt_keeps_canary_lines_only() -> None:
    text = "CORRAL-START\nHOME=/root\nread: CORRALCANARY-x-1\nPATH=/usr/bin\n"
    assert excerpt(text) == "read: CORRALCANARY-x-1"
    assert excerpt("CORRAL-START\nplain\n") == "plain"


def test_injected_key_leak_proof_and_no_injection() -> None:
    o = InjectedNotLeaked("home")
    injected = Hit("http_a", "m", f"POST /m/m/v1/messages {key_digest(SECRET)} host: a", 0.0)
    assert o.judge(ev(hits=(injected,))).observed == "denied"
    # Seen inside: a leak, whatever the upstream received.
    assert o.judge(ev(hits=(injected,), stdout=SECRET)).observed == "allowed"
    # Nothing injected: silence inside proves nothing.
    plain = Hit("http_a", "m", "POST /m/m/v1/messages host: a", 0.0)
    assert o.judge(ev(hits=(plain,))).observed == "error"
    wrong = Hit("http_a", "m", key_digest("other"), 0.0)
    assert o.judge(ev(hits=(wrong,))).observed == "error"
    assert SECRET not in key_digest(SECRET)


def test_hit_matches_and_broker_killed_guard() -> None:
    hits = (Hit("http_a", "m", "GET /m/m/big", 0.0), Hit("http_a", "m", "GET /m/m/after", 1.0))
    o = HitMatches("http_a", "/after")
    assert o.judge(ev(hits=hits[:1])).observed == "denied"
    assert o.judge(ev(hits=hits)).observed == "allowed"
    guard = BrokerKilled(o)
    assert guard.judge(ev(hits=hits, facts={"broker_kill": "not-found"})).observed == "error"
    j = guard.judge(ev(hits=hits[:1], facts={"broker_kill": "killed pid=7"}))
    assert j.observed == "denied" and "pid=7" in j.why
    assert guard.judge(ev(hits=hits, facts={"broker_kill": "none"})).observed == "allowed"


def test_refused_with_and_degradation_recorded() -> None:
    r = RefusedWith("ran")
    assert r.judge(ev(facts={"ran": True}, exit=0)).observed == "allowed"
    assert r.judge(ev(facts={"ran": False}, exit=125)).observed == "denied"
    assert r.judge(ev(facts={"ran": False}, exit=1)).observed == "error"
    d = DegradationRecorded("ran", "cgroup")
    rep = {"exit": 0, "reason": "exited", "layers": {"cgroup": "degraded: read-only"}}
    assert d.judge(ev(facts={"ran": True}, backend_report=rep)).observed == "denied"
    silent = {"exit": 0, "reason": "exited", "layers": {"cgroup": True}}
    assert d.judge(ev(facts={"ran": True}, backend_report=silent)).observed == "allowed"
    assert d.judge(ev(facts={"ran": True})).observed == "allowed"
    assert d.judge(ev(facts={"ran": False}, exit=125)).observed == "error"
