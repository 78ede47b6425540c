"""The probe catalogue: coverage, shape, and programs that compile without secrets."""

from __future__ import annotations

import re
from collections import Counter

from corral.verify.backends import (
    BwrapBasicBackend,
    CorralBackend,
    NoneBackend,
    RunSpec,
    SrtBackend,
    parse_exec_report,
    srt_settings,
    with_fault,
)
from corral.verify.model import CATEGORIES, REQUIREMENTS, ProbeLimits
from corral.verify.probes import PRELUDE, all_probes
from corral.verify.runner import select_probes


def test_at_least_150_probes_in_every_category() -> None:
    probes = all_probes()
    assert len(probes) >= 150
    per = Counter(p.category for p in probes)
    assert set(per) == set(CATEGORIES)


def test_every_probe_names_a_known_requirement_and_one_line_description() -> None:
    for p in all_probes():
        assert p.requirement in REQUIREMENTS, p.id
        assert p.description and "\n" not in p.description, p.id
        assert re.fullmatch(r"[a-z0-9-]+", p.id), p.id
        if p.category == "usability":
            assert p.expected == "allowed" and p.requirement.startswith("U"), p.id
        else:
            assert p.expected == "denied", p.id


def test_every_mandatory_and_usability_requirement_has_a_probe() -> None:
    covered = {p.requirement for p in all_probes()}
    assert set(REQUIREMENTS) == covered


def test_programs_compile_and_carry_no_secret() -> None:
    for p in all_probes():
        compile("import json\nP = {}\n" + PRELUDE + p.code, p.id, "exec")
        assert "CORRALCANARY-" not in p.code, p.id


def test_issue_coverage_by_name() -> None:
    ids = {p.id for p in all_probes()}
    for needed in (
        "files-read-home",
        "files-read-ssh",
        "files-read-etc",
        "files-symlink-home",
        "files-hardlink-out",
        "files-proc-victim-root",
        "files-proc-victim-cwd",
        "files-proc-victim-fd",
        "files-dotdot-relative",
        "files-write-usr",
        "files-write-etc",
        "files-write-home",
        "files-write-ws-parent",
        "net-loopback-http",
        "net-unix-abstract",
        "net-unix-tmp",
        "net-raw-ip-tcp",
        "net-raw-ip-udp",
        "net-icmp-raw",
        "net-dns-udp",
        "net-loopback-ipv6",
        "net-metadata",
        "net-broker-connect",
        "net-broker-plain-http",
        "net-broker-rebinding",
        "net-broker-redirect",
        "net-broker-relay",
        "net-exfil-query",
        "secrets-proc-1-environ",
        "secrets-proc-scan-cmdline",
        "proc-setsid-daemon",
        "proc-double-fork",
        "proc-nohup",
        "proc-ignore-sigterm",
        "proc-fork-race",
        "proc-cgroup-escape",
        "proc-signal-kill",
        "hostint-git-hook-pre-commit",
        "hostint-git-fsmonitor",
        "hostint-git-diff-external",
        "hostint-git-filter-clean",
        "hostint-run-planted-traps",
        "hostint-tiocsti",
        "res-memory-hog",
        "res-memory-many-procs",
        "res-fork-bomb",
        "res-cpu-hog",
        "res-memory-tmpfs",
        "res-wall-clock",
        "priv-ptrace-child",
        "priv-process-vm-readv-child",
        "priv-io-uring",
        "priv-bpf-map",
        "priv-perf-event-open",
        "priv-userfaultfd",
        "priv-keyctl-add",
        "priv-mount-tmpfs",
        "priv-unshare-user",
        "priv-setns-net",
        "priv-setuid-passwd",
        "priv-socket-vsock",
        "priv-socket-packet",
        "priv-netlink-host-links",
        "priv-module-finit",
    ):
        assert needed in ids, needed


def test_selection_by_category_and_prefix() -> None:
    assert {p.category for p in select_probes(["network"])} == {"network"}
    assert all(p.id.startswith("proc-signal") for p in select_probes((), ["proc-signal"]))


def run(**kw: object) -> RunSpec:
    base: dict[str, object] = {"workspace": "/w", "limits": ProbeLimits()}
    base.update(kw)
    return RunSpec(**base)  # type: ignore[arg-type]


def test_corral_argv_carries_limits_allow_and_journal() -> None:
    argv = CorralBackend("namespace").argv(
        ["/usr/bin/python3", "-c", "x"],
        run(
            limits=ProbeLimits(memory="256M", pids=64, cpus=0.5, timeout_s=1.5),
            allow=("127.0.0.1:8",),
            journal="/j.sqlite",
        ),
    )
    assert argv[1:4] == ["-m", "corral", "exec"]
    i = argv.index("--")
    opts = argv[4:i]
    for pair in (
        ["--workspace", "/w"],
        ["--memory", "256M"],
        ["--pids", "64"],
        ["--cpus", "0.5"],
        ["--timeout", "1.5"],
        ["--allow", "127.0.0.1:8"],
        ["--journal", "/j.sqlite"],
    ):
        j = opts.index(pair[0])
        assert opts[j : j + 2] == pair
    assert "--json" in opts and "--backend" not in opts
    assert argv[i + 1 :] == ["/usr/bin/python3", "-c", "x"]
    assert "--backend" in CorralBackend("microvm").argv(["true"], run())


def test_baseline_and_peer_argv() -> None:
    none = NoneBackend().argv(["cmd", "a"], run())
    assert none[:2] == ["/bin/sh", "-c"] and none[-2:] == ["cmd", "a"]
    bw = BwrapBasicBackend().argv(["cmd"], run())
    assert bw[0] == "bwrap" and "WS" not in bw and bw.count("/w") == 3 and bw[-2:] == ["--", "cmd"]
    srt = SrtBackend()
    argv = srt.argv(["python3", "-c", "print('a b')"], run(settings_path="/s.json"))
    assert argv[1:3] == ["--settings", "/s.json"] and argv[3] == "-c"
    assert argv[4] == "python3 -c 'print('\"'\"'a b'\"'\"')'"


def test_srt_settings_follow_the_readme_recipe() -> None:
    s = srt_settings("/w", ("127.0.0.1:9",))
    assert s["network"]["allowedDomains"] == ["127.0.0.1:9"]
    assert s["filesystem"]["allowWrite"] == ["/w"] and s["filesystem"]["denyRead"] == ["~/.ssh"]


def test_parse_exec_report_splits_the_summary_off_stderr() -> None:
    err = 'warning: x\n{"exit": 124, "reason": "timeout", "wall_s": 1.0}\n'
    rep, rest = parse_exec_report(err)
    assert rep is not None and rep["reason"] == "timeout" and rest == "warning: x"
    assert parse_exec_report("no json here\n") == (None, "no json here\n")
    assert parse_exec_report('{"not": "a report"}\n')[0] is None


def test_corral_argv_carries_config_and_extra_options_before_the_command() -> None:
    argv = CorralBackend("namespace").argv(
        ["true"], run(config_path="/cfg/x.toml", exec_args=("--allow-degraded", "cgroup"))
    )
    i = argv.index("--")
    opts = argv[:i]
    j = opts.index("--config")
    assert opts[j : j + 2] == ["--config", "/cfg/x.toml"]
    assert opts[-2:] == ["--allow-degraded", "cgroup"]
    assert argv[i + 1 :] == ["true"]
    # Other backends have no corral options at all.
    assert "--config" not in NoneBackend().argv(["true"], run(config_path="/cfg/x.toml"))


def test_ro_cgroups_fault_wraps_any_command_in_a_private_mount_namespace() -> None:
    assert with_fault(None, ["true"]) == ["true"]
    argv = with_fault("ro-cgroups", ["corral", "exec", "--", "true"])
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert "remount,bind,ro" in argv[6]
    assert argv[-4:] == ["corral", "exec", "--", "true"]


def test_formerly_untestable_probes_now_run() -> None:
    by_id = {p.id: p for p in all_probes()}
    for pid in (
        "secrets-broker-injected-key",
        "failclosed-missing-layer",
        "failclosed-degraded-recorded",
        "failclosed-broker-dies",
        "use-mcp-gateway",
        "audit-mcp-denied-tool",
        "use-product-port",
        "hostint-verifier-checks-tamper",
        "hostint-verifier-results-forge",
        "hostint-verifier-check-hijack",
        "hostint-run-planted-traps",
    ):
        assert by_id[pid].skip is None, pid
    assert by_id["failclosed-broker-dies"].during == "kill-broker"
    assert "{http_a_host}" in (by_id["secrets-broker-injected-key"].broker_config or "")
    # Reasons for what still cannot run say what is missing, not "not built yet".
    for p in all_probes():
        assert p.skip is None or "yet" not in p.skip, p.id
