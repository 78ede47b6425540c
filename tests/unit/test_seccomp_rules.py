"""The seccomp rule table, and the compiled filter run through a BPF interpreter.

Nothing is loaded into a process here: `seccomp.evaluate` interprets the
exported program on synthetic syscalls, which lets every rule, every bypass
attempt (upper argument bits, flag combinations) and the foreign-ABI kill be
checked exhaustively and fast. The kernel's own enforcement is proved in
tests/integration/test_seccomp_landlock.py.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
from collections.abc import Sequence

import pytest

from corral.sandbox import seccomp
from corral.sandbox.seccomp import (
    DEFAULT_PROFILE,
    RET_ALLOW,
    RET_KILL_PROCESS,
    ArgCmp,
    Cmp,
    SeccompProfile,
    SeccompRule,
)

# DESIGN.md M8 and the host-administration calls: denied whatever the arguments.
UNCONDITIONAL = frozenset(
    [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "add_key",
        "request_key",
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "open_tree_attr",
        "fsopen",
        "fsmount",
        "fspick",
        "fsconfig",
        "mount_setattr",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "unshare",
        "setns",
        "clone3",
        "pidfd_getfd",
        "kcmp",
        "open_by_handle_at",
        "name_to_handle_at",
        "swapon",
        "swapoff",
        "reboot",
        "acct",
        "quotactl",
        "syslog",
        "lookup_dcookie",
        "iopl",
        "ioperm",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "vhangup",
        "fanotify_init",
        "chroot",
    ]
)
CLONE_NS = {
    "CLONE_NEWTIME": 0x80, "CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000,
}  # fmt: skip
AT_FDCWD = (1 << 64) - 100
U32 = 0xFFFF_FFFF

x86_64_only = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 syscall numbers")


# --- the table ------------------------------------------------------------------


def _unconditional() -> set[str]:
    return {r.syscall for r in DEFAULT_PROFILE.rules if not r.args}


def test_every_m8_family_is_denied_unconditionally() -> None:
    missing = UNCONDITIONAL - _unconditional()
    assert not missing


def test_clone3_answers_enosys_so_libc_falls_back_to_clone() -> None:
    (rule,) = [r for r in DEFAULT_PROFILE.rules if r.syscall == "clone3"]
    assert rule.errno == errno.ENOSYS and not rule.args


@pytest.mark.parametrize("flag", sorted(CLONE_NS))
def test_one_masked_clone_rule_per_namespace_flag(flag: str) -> None:
    bit = CLONE_NS[flag]
    hits = [r for r in DEFAULT_PROFILE.rules if r.syscall == "clone" and flag in r.reason]
    assert [r.args for r in hits] == [(ArgCmp(0, Cmp.MASKED_EQ, bit, bit),)]


def test_int_arguments_are_compared_on_their_low_32_bits_only() -> None:
    # ioctl's cmd and socket's family are C ints: the kernel drops the upper half,
    # so a 64-bit EQ would be bypassed by setting any upper bit.
    for r in DEFAULT_PROFILE.rules:
        for a in r.args:
            if (r.syscall, a.index) in {("ioctl", 1), ("socket", 0)}:
                assert a.op is Cmp.MASKED_EQ and a.mask == U32, r
            if r.syscall == "personality":
                assert a.op is Cmp.MASKED_EQ and a.mask is not None and a.mask <= U32, r


def test_every_rule_carries_an_m8_reason() -> None:
    assert all(r.reason.startswith("M8: ") for r in DEFAULT_PROFILE.rules)


def test_rule_validation() -> None:
    with pytest.raises(ValueError, match="index"):
        ArgCmp(6, Cmp.EQ, 0)
    with pytest.raises(ValueError, match="mask"):
        ArgCmp(0, Cmp.EQ, 1, 1)
    with pytest.raises(ValueError, match="mask"):
        ArgCmp(0, Cmp.MASKED_EQ, 1)
    with pytest.raises(ValueError, match="cover"):
        ArgCmp(0, Cmp.MASKED_EQ, 3, 1)
    with pytest.raises(ValueError, match="u64"):
        ArgCmp(0, Cmp.EQ, 1 << 64)
    with pytest.raises(ValueError, match="one argument"):
        SeccompRule("x", 1, "r", (ArgCmp(0, Cmp.EQ, 1), ArgCmp(0, Cmp.NE, 2)))
    with pytest.raises(ValueError, match="errno"):
        SeccompRule("x", 0, "r")
    with pytest.raises(ValueError, match="arch-specific"):
        SeccompRule("x", 1, "r", (), 101)
    with pytest.raises(ValueError, match="reason"):
        SeccompRule("x", 1, "")


def test_canonical_form_is_stable_and_sensitive() -> None:
    again = SeccompProfile(DEFAULT_PROFILE.name, tuple(DEFAULT_PROFILE.rules))
    assert again.canonical() == DEFAULT_PROFILE.canonical()
    rules = list(DEFAULT_PROFILE.rules)
    rules[0] = SeccompRule(rules[0].syscall, errno.EACCES, rules[0].reason)
    assert (
        SeccompProfile(DEFAULT_PROFILE.name, tuple(rules)).canonical()
        != DEFAULT_PROFILE.canonical()
    )


# --- the BPF interpreter on hand-written programs -------------------------------


def _prog(*insns: tuple[int, int, int, int]) -> bytes:
    return b"".join(struct.pack("<HBBI", *i) for i in insns)


def test_interpreter_on_a_hand_written_program() -> None:
    prog = _prog(
        (0x20, 0, 0, 0),  # A = nr
        (0x15, 0, 1, 7),  # nr == 7 ?
        (0x06, 0, 0, seccomp.RET_ERRNO | 13),
        (0x20, 0, 0, 16),  # A = args[0] low
        (0x45, 0, 1, 0x10),  # A & 0x10 ?
        (0x06, 0, 0, RET_KILL_PROCESS),
        (0x06, 0, 0, RET_ALLOW),
    )
    arch = seccomp.AUDIT_ARCH_X86_64
    assert seccomp.ret_errno(seccomp.evaluate(prog, 7, arch=arch)) == 13
    assert seccomp.evaluate(prog, 8, [0x10], arch=arch) == RET_KILL_PROCESS
    assert seccomp.evaluate(prog, 8, [0x0F], arch=arch) == RET_ALLOW
    assert seccomp.ret_errno(RET_ALLOW) is None


@pytest.mark.parametrize(
    ("bpf", "match"),
    [
        (b"", "instructions"),
        (b"\x06" * 12, "instructions"),
        (_prog((0x06, 0, 0, 0)) * 4097, "instructions"),
        (_prog((0xC4, 0, 0, 0), (0x06, 0, 0, 0)), "opcode"),
        (_prog((0x15, 5, 0, 0), (0x06, 0, 0, 0)), "jump"),
        (_prog((0x05, 0, 0, 9), (0x06, 0, 0, 0)), "jump"),
        (_prog((0x20, 0, 0, 64), (0x06, 0, 0, 0)), "seccomp_data"),
        (_prog((0x20, 0, 0, 0)), "return"),
    ],
)
def test_malformed_programs_are_rejected(bpf: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        seccomp.validate_bpf(bpf)


# --- the compiled default profile -----------------------------------------------


@functools.cache
def _bpf() -> bytes:
    return seccomp.build_bpf(DEFAULT_PROFILE)


def _nr(name: str) -> int:
    import pyseccomp

    nr = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))
    if nr < 0:
        fallback = {r.fallback_nr for r in DEFAULT_PROFILE.rules if r.syscall == name}
        (only,) = fallback
        assert only is not None
        return only
    return nr


def _eval(name: str, args: Sequence[int] = (), arch: int | None = None) -> int:
    return seccomp.evaluate(_bpf(), _nr(name), args, arch)


def _matching(rule: SeccompRule) -> list[int]:
    args = [0] * 6
    for a in rule.args:
        args[a.index] = a.value + 1 if a.op is Cmp.NE else a.value
    return args


@pytest.mark.requires_seccomp
def test_compilation_is_deterministic_and_well_formed() -> None:
    first = seccomp.build_bpf(DEFAULT_PROFILE)
    assert first == seccomp.build_bpf(DEFAULT_PROFILE)
    seccomp.validate_bpf(first)
    assert len(first) // 8 < 1024  # small enough for a fast per-syscall walk


@pytest.mark.requires_seccomp
@pytest.mark.parametrize("index", range(len(DEFAULT_PROFILE.rules)))
def test_each_rule_answers_its_errno(index: int) -> None:
    rule = DEFAULT_PROFILE.rules[index]
    assert seccomp.ret_errno(_eval(rule.syscall, _matching(rule))) == rule.errno


@pytest.mark.requires_seccomp
@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read", ()),
        ("openat", ()),
        ("execve", ()),
        ("landlock_restrict_self", ()),
        ("prctl", (38, 1)),
        ("clone", (0x01200011,)),  # glibc fork(): CHILD_SETTID|CHILD_CLEARTID|SIGCHLD
        ("clone", (0x003D0F00,)),  # pthread_create's thread flags
        ("socket", (2, 1, 0)),  # AF_INET
        ("socket", (10, 2, 0)),  # AF_INET6
        ("socket", (1, 1, 0)),  # AF_UNIX
        ("socket", (16, 3, 0)),  # AF_NETLINK, NETLINK_ROUTE (getaddrinfo)
        ("ioctl", (1, 0x5401)),  # TCGETS
        ("ioctl", (1, 0x5413)),  # TIOCGWINSZ
        ("personality", (0xFFFF_FFFF,)),  # the query
        ("personality", (0xFFFF_FFFF_FFFF_FFFF,)),  # the kernel truncates: still the query
        ("personality", (0,)),
        ("personality", (0x0008,)),  # PER_LINUX32
        ("personality", (0x0002_0000,)),  # UNAME26
        ("chmod", (0, 0o1777)),  # sticky and rwx bits stay allowed
        ("fchmodat", (AT_FDCWD, 0, 0o755, 0)),
        ("openat", (AT_FDCWD, 0, 0o1101, 0o666)),  # O_CREAT|O_TRUNC|O_WRONLY
        ("mkdirat", (AT_FDCWD, 0, 0o1777)),
        ("mkdir", (0, 0o2755)),  # the kernel masks S_ISGID/S_ISUID off mkdir
        ("mknodat", (AT_FDCWD, 0, 0o010644, 0)),  # a FIFO
    ],
)
def test_ordinary_calls_are_allowed(name: str, args: tuple[int, ...]) -> None:
    assert _eval(name, args) == RET_ALLOW


@pytest.mark.requires_seccomp
@pytest.mark.parametrize(
    ("name", "args", "err"),
    [
        ("ioctl", (1, 0xDEADBEEF_00005412), errno.EPERM),  # upper bits set, kernel sees TIOCSTI
        ("ioctl", (1, 0xFFFF_FFFF_0000_541C), errno.EPERM),  # TIOCLINUX likewise
        ("socket", (0x1_0000_0028, 1, 0), errno.EAFNOSUPPORT),  # AF_VSOCK with upper bits
        ("socket", (0xFFFF_FFFF_0000_0011, 3, 0), errno.EAFNOSUPPORT),  # AF_PACKET
        ("socket", (16, 3, 9), errno.EPERM),  # NETLINK_AUDIT
        ("socket", (16, 3, 0x1_0000_0000), errno.EPERM),  # garbage protocol bits: refused
        ("clone", (0x10000000 | 0x01200011,), errno.EPERM),  # NEWUSER inside a fork's flags
        ("clone", (0xFFFF_FFFF_0002_0011,), errno.EPERM),  # NEWNS with upper bits
        ("clone", (0x7E020080,), errno.EPERM),  # every namespace flag at once
        ("personality", (0x0040_0000,), errno.EPERM),  # READ_IMPLIES_EXEC
        ("personality", (0x0004_0000 | 0x0008,), errno.EPERM),  # ADDR_NO_RANDOMIZE | PER_LINUX32
        ("personality", (0x8040_0000,), errno.EPERM),  # bit 31 set to dodge the flag rules
        ("personality", (0xFFFF_FFFE,), errno.EPERM),  # almost the query
        ("personality", (0x1_0010_0000,), errno.EPERM),  # MMAP_PAGE_ZERO with upper bits
        ("chmod", (0, 0o4755), errno.EPERM),
        ("fchmod", (3, 0o2755), errno.EPERM),
        ("fchmodat", (AT_FDCWD, 0, 0o6755, 0), errno.EPERM),
        ("fchmodat2", (AT_FDCWD, 0, 0o4755, 0x100), errno.EPERM),  # AT_SYMLINK_NOFOLLOW
        ("fchmod", (3, 0xFFFF_FFFF_0000_0800), errno.EPERM),  # S_ISUID with upper bits
        ("open", (0, 0o100, 0o4755), errno.EPERM),
        ("openat", (AT_FDCWD, 0, 0o20200000 | 0o2, 0o4700), errno.EPERM),  # O_TMPFILE
        ("creat", (0, 0o2755), errno.EPERM),
        ("mknod", (0, 0o104755, 0), errno.EPERM),  # S_IFREG|S_ISUID
        ("mknodat", (AT_FDCWD, 0, 0o102755, 0), errno.EPERM),
        ("openat2", (AT_FDCWD, 0, 0, 24), errno.ENOSYS),  # its mode is in memory
    ],
)
def test_bypass_attempts_are_denied(name: str, args: tuple[int, ...], err: int) -> None:
    assert seccomp.ret_errno(_eval(name, args)) == err


@pytest.mark.requires_seccomp
@x86_64_only
def test_foreign_abis_are_killed() -> None:
    # i386 via int 0x80 carries AUDIT_ARCH_I386 (getpid is 20 there).
    assert seccomp.evaluate(_bpf(), 20, (), seccomp.AUDIT_ARCH_I386) == RET_KILL_PROCESS
    # Even an i386 number that is harmless natively.
    assert seccomp.evaluate(_bpf(), 39, (), seccomp.AUDIT_ARCH_I386) == RET_KILL_PROCESS
    # x32 shares AUDIT_ARCH_X86_64 but sets bit 30 in the number.
    assert seccomp.evaluate(_bpf(), 39 | 0x4000_0000) == RET_KILL_PROCESS
    assert seccomp.evaluate(_bpf(), 39) == RET_ALLOW


@pytest.mark.requires_seccomp
def test_libseccomp_version_is_readable() -> None:
    major, minor, micro = (int(p) for p in seccomp.libseccomp_version().split("."))
    assert (major, minor) >= (2, 5)
    assert micro >= 0
