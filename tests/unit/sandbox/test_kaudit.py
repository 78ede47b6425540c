"""The kernel-audit record parser and correlator (`sandbox/kaudit.py`), and the rows it yields."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from corral.broker.actions import Identity
from corral.broker.kernel_denials import denial_observation
from corral.sandbox import kaudit
from corral.sandbox.kaudit import (
    AUDIT_EOE,
    AUDIT_LANDLOCK_ACCESS,
    AUDIT_LANDLOCK_DOMAIN,
    AUDIT_SECCOMP,
    AUDIT_SYSCALL,
    Correlator,
    KernelDenial,
    parse_record,
    split_netlink,
)

# Records as this kernel (6.18, Landlock ABI 7) sent them for `ls /var` in a sandbox.
ACCESS = (
    b'audit(1796123265.379:46): domain=1f12518ce blockers=fs.read_dir path="/var" dev="tmpfs" ino=1'
)
DOMAIN = (
    b"audit(1796123265.379:46): domain=1f12518ce status=allocated mode=enforcing"
    b' pid=20245 uid=64003 exe="/run/corral/init" comm="init"'
)
SYSCALL = (
    b"audit(1796123265.379:46): arch=c000003e syscall=257 success=no exit=-13"
    b' ppid=20246 pid=20248 uid=64003 comm="ls" exe="/usr/bin/ls" key=(null)'
)
SECCOMP = (
    b"audit(1796123270.001:50): auid=4294967295 uid=64003 gid=64003 ses=4294967295"
    b' pid=777 comm="python3" exe="/usr/bin/python3.11" sig=0 arch=c000003e'
    b" syscall=250 compat=0 ip=0x7f code=0x50001"
)
EOE = b"audit(1796123265.379:46): "


def _nl(mtype: int, payload: bytes) -> bytes:
    msg = struct.pack("=IHHII", 16 + len(payload), mtype, 0, 0, 0) + payload
    return msg + b"\0" * (-len(msg) % 4)


def test_parses_a_landlock_access_record() -> None:
    rec = parse_record(AUDIT_LANDLOCK_ACCESS, ACCESS)
    assert rec is not None
    assert rec.serial == 46
    assert rec.fields["blockers"] == b"fs.read_dir"
    assert rec.fields["path"] == b"/var"


def test_hex_encoded_path_is_decoded_to_its_bytes() -> None:
    # The kernel hex-encodes a value holding a space, quote or control byte.
    raw = b'/tmp/a b"\n'
    rec = parse_record(
        AUDIT_LANDLOCK_ACCESS,
        b"audit(1.2:3): domain=1 blockers=fs.read_file path=" + raw.hex().upper().encode(),
    )
    assert rec is not None and rec.fields["path"] == raw


def test_digits_in_trusted_fields_are_not_hex_decoded() -> None:
    rec = parse_record(AUDIT_SYSCALL, SYSCALL)
    assert rec is not None and rec.int_field("pid") == 20248


def test_user_space_and_unknown_types_are_refused() -> None:
    forged = ACCESS
    for mtype in (kaudit.AUDIT_USER, 1100, 1107, 2100, 2999, 1400, 0, 65535):
        assert parse_record(mtype, forged) is None


def test_oversized_and_malformed_records_are_refused() -> None:
    assert parse_record(AUDIT_LANDLOCK_ACCESS, ACCESS + b" x=" + b"a" * kaudit.MAX_PAYLOAD) is None
    assert parse_record(AUDIT_LANDLOCK_ACCESS, b"domain=1 blockers=fs.read_dir") is None
    assert parse_record(AUDIT_LANDLOCK_ACCESS, b"audit(1.2:x): domain=1") is None


def test_the_first_occurrence_of_a_key_wins() -> None:
    rec = parse_record(AUDIT_LANDLOCK_ACCESS, ACCESS + b' path="/forged"')
    assert rec is not None and rec.fields["path"] == b"/var"


def test_split_netlink_reads_each_message_and_drops_a_bad_tail() -> None:
    buf = _nl(AUDIT_LANDLOCK_ACCESS, ACCESS) + _nl(AUDIT_EOE, EOE) + b"\xff" * 7
    msgs = split_netlink(buf)
    assert [m[0] for m in msgs] == [AUDIT_LANDLOCK_ACCESS, AUDIT_EOE]
    assert msgs[0][1] == ACCESS


def _records(*pairs: tuple[int, bytes]) -> list[kaudit.AuditRecord]:
    out = []
    for mtype, payload in pairs:
        rec = parse_record(mtype, payload)
        assert rec is not None
        out.append(rec)
    return out


def _feed(c: Correlator, recs: list[kaudit.AuditRecord]) -> list[tuple[KernelDenial, object]]:
    out: list[tuple[KernelDenial, object]] = []
    for r in recs:
        out += c.feed(r)
    return out


def test_denial_is_attributed_by_the_syscall_pid() -> None:
    cg = {20248: ("corral/sbx-1",), 20245: ("corral/sbx-1",)}
    c = Correlator(cg.get)
    found = _feed(
        c,
        _records(
            (AUDIT_LANDLOCK_ACCESS, ACCESS),
            (AUDIT_LANDLOCK_DOMAIN, DOMAIN),
            (AUDIT_SYSCALL, SYSCALL),
            (AUDIT_EOE, EOE),
        ),
    )
    assert len(found) == 1
    denial, paths = found[0]
    assert (denial.kind, denial.access, denial.target) == ("landlock", "fs.read_dir", b"/var")
    assert paths == ("corral/sbx-1",)


def test_denial_of_a_gone_process_is_attributed_by_its_domain() -> None:
    # `ls` exited before its SYSCALL record was read; the domain's creator
    # (the init) was alive when the domain was first reported.
    c = Correlator({20245: ("corral/sbx-1",)}.get)
    first = _feed(c, _records((AUDIT_LANDLOCK_DOMAIN, DOMAIN), (AUDIT_EOE, EOE)))
    assert first == []
    later = ACCESS.replace(b":46)", b":47)")
    found = _feed(
        c,
        _records(
            (AUDIT_LANDLOCK_ACCESS, later),
            (AUDIT_SYSCALL, SYSCALL.replace(b":46)", b":47)")),
        ),
    )
    found += c.flush()
    assert [(d.serial, p) for d, p in found] == [(47, ("corral/sbx-1",))]


def test_unattributable_denial_has_no_cgroup() -> None:
    c = Correlator(lambda pid: None)
    found = _feed(c, _records((AUDIT_LANDLOCK_ACCESS, ACCESS), (AUDIT_EOE, EOE)))
    assert [p for _, p in found] == [None]


def test_seccomp_record_yields_the_syscall() -> None:
    c = Correlator({777: ("corral/sbx-2",)}.get)
    found = _feed(c, _records((AUDIT_SECCOMP, SECCOMP))) + c.flush()
    assert [(d.kind, d.syscall, d.pid, p) for d, p in found] == [
        ("seccomp", 250, 777, ("corral/sbx-2",))
    ]


def test_in_cgroup_matches_the_tree_only() -> None:
    assert kaudit.in_cgroup(("corral/a",), "corral/a")
    assert kaudit.in_cgroup(("corral/a/inner",), "/corral/a/")
    assert not kaudit.in_cgroup(("corral/ab",), "corral/a")
    assert not kaudit.in_cgroup(("corral/a",), "")
    assert kaudit.cgroup_paths(b"0::/corral/a\n4:pids:/corral/a\nbad\n") == ("corral/a", "corral/a")


def test_the_row_sanitizes_the_sandbox_chosen_path() -> None:
    denial = KernelDenial("landlock", "fs.read_file", b"/x\x1b[2J\xff", 5, "1f", None, 9)
    obs = denial_observation(denial, Identity(run="r", session="s"))
    assert obs.kind == "landlock" and obs.decision == "deny"
    assert (obs.run, obs.session) == ("r", "s")
    assert "\x1b" not in obs.target and "\x1b" not in obs.reason
    assert obs.target.startswith("fs.read_file /x")


@given(st.integers(0, 0xFFFF), st.binary(max_size=10000))
def test_fuzz_parse_record_never_raises_and_stays_bounded(mtype: int, payload: bytes) -> None:
    rec = parse_record(mtype, payload)
    if rec is not None:
        assert rec.type in (
            AUDIT_SYSCALL,
            AUDIT_EOE,
            AUDIT_SECCOMP,
            AUDIT_LANDLOCK_ACCESS,
            AUDIT_LANDLOCK_DOMAIN,
        )
        assert len(rec.fields) <= 64
        assert sum(len(v) for v in rec.fields.values()) <= len(payload)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    AUDIT_SYSCALL,
                    AUDIT_EOE,
                    AUDIT_SECCOMP,
                    AUDIT_LANDLOCK_ACCESS,
                    AUDIT_LANDLOCK_DOMAIN,
                ]
            ),
            st.integers(0, 5),
            st.lists(
                st.tuples(
                    st.sampled_from(["pid", "domain", "blockers", "path", "status", "syscall"]),
                    st.text('0123456789abcdef"=/ ', max_size=12),
                ),
                max_size=6,
            ),
        ),
        max_size=40,
    )
)
def test_fuzz_correlator_never_raises(events: list[tuple[int, int, list[tuple[str, str]]]]) -> None:
    c = Correlator(lambda pid: ("corral/x",) if pid % 2 else None)
    total = 0
    for mtype, serial, kv in events:
        body = " ".join(f"{k}={v}" for k, v in kv)
        rec = parse_record(mtype, f"audit(1.0:{serial}): {body}".encode())
        if rec is not None:
            total += len(c.feed(rec))
    total += len(c.flush())
    assert total <= len(events)


@given(st.binary(max_size=4096))
def test_fuzz_split_netlink_never_raises(buf: bytes) -> None:
    for _mtype, payload in split_netlink(buf):
        assert len(payload) <= len(buf)


def test_compiled_init_is_asked_to_log_seccomp_and_landlock_after_exec() -> None:
    from corral.sandbox import landlock
    from corral.sandbox.namespace import init_command, landlock_rules_for
    from corral.sandbox.spec import SandboxSpec

    spec = SandboxSpec(argv=("true",), workspace="/w", env=())
    argv, _, _ = init_command(spec, binary="/b", abi=7, status_fd=3, seccomp_log_fd=11)
    assert argv[argv.index("--seccomp-log") + 1] == "11"
    assert argv.index("--seccomp-log") < argv.index("--")
    ll = argv.index("--ll")
    assert int(argv[ll + 5]) & landlock.LOG_NEW_EXEC_ON
    assert landlock_rules_for(spec)["log_new_exec"] is True
