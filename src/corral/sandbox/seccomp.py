"""The seccomp filter of the namespace sandbox (docs/design.md M8).

A pure rule table (`SeccompRule`, `SeccompProfile`, `DEFAULT_PROFILE`) and a
thin shell around libseccomp:

- `build_bpf(profile)` compiles the table into classic BPF for the native
  architecture (libseccomp through `pyseccomp`, imported only here);
- `cached_bpf(profile, cache_dir)` compiles once per profile, libseccomp
  version and architecture, and afterwards only reads a file;
- `bpf_fd(data)` hands the program to bubblewrap as `--seccomp FD`;
- `evaluate(bpf, nr, args)` runs a compiled program on a synthetic syscall
  without loading it (a pure classic-BPF interpreter, for tests and probes).

Semantics of the compiled filter: every syscall not in the table is allowed;
a table hit returns its errno; a syscall from any other ABI than the native one
(i386 via `int 0x80`, x32 numbers on x86_64) kills the whole process.

The kernel audits SECCOMP_RET_ERRNO results only for filters loaded with
SECCOMP_FILTER_FLAG_LOG, a load-time flag that bubblewrap
(`prctl(PR_SET_SECCOMP)`) does not pass and the bytes cannot carry; the
compiled init therefore loads the same program a second time with that flag
(`init.c`, `--seccomp-log`). Kills (foreign ABIs) are always logged.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from corral.errors import LayerUnavailableError, SandboxStartError

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = [
    "AUDIT_ARCH_AARCH64",
    "AUDIT_ARCH_I386",
    "AUDIT_ARCH_X86_64",
    "DEFAULT_PROFILE",
    "RET_ALLOW",
    "RET_ERRNO",
    "RET_KILL_PROCESS",
    "VMM_SETID_PROFILE",
    "ArgCmp",
    "Cmp",
    "SeccompProfile",
    "SeccompRule",
    "bpf_fd",
    "build_bpf",
    "cache_key",
    "cache_path",
    "cached_bpf",
    "evaluate",
    "libseccomp_version",
    "native_audit_arch",
    "ret_errno",
    "validate_bpf",
]

# Bumped whenever build_bpf() changes how a table is compiled, so that stale
# cache files are never read back.
_FORMAT = 1

RET_KILL_PROCESS = 0x8000_0000
RET_ERRNO = 0x0005_0000
RET_ALLOW = 0x7FFF_0000
_RET_ACTION_MASK = 0xFFFF_0000
_RET_DATA_MASK = 0x0000_FFFF

AUDIT_ARCH_X86_64 = 0xC000_003E
AUDIT_ARCH_I386 = 0x4000_0003
AUDIT_ARCH_AARCH64 = 0xC000_00B7
_AUDIT_ARCHES = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}

_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
# Syscalls numbered from 424 on share one number on every architecture.
_FIRST_UNIFIED_NR = 424
# The kernel refuses programs longer than BPF_MAXINSNS.
_BPF_MAXINSNS = 4096


class Cmp(StrEnum):
    """How one syscall argument is compared (the subset of libseccomp's ops used)."""

    EQ = "eq"
    NE = "ne"
    MASKED_EQ = "masked_eq"


@dataclass(frozen=True, slots=True)
class ArgCmp:
    """`args[index] <op> value`, on all 64 bits; MASKED_EQ tests `arg & mask == value`.

    For a C `int` or `unsigned int` argument the kernel ignores the upper 32
    bits, so such an argument must be compared with MASKED_EQ and a mask within
    0xffffffff: an EQ on 64 bits is bypassed by setting any upper bit.
    """

    index: int
    op: Cmp
    value: int
    mask: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.index <= 5:
            raise ValueError(f"syscall argument index {self.index} is not in 0..5")
        if not 0 <= self.value <= _U64:
            raise ValueError(f"comparison value {self.value:#x} is not a u64")
        if (self.op is Cmp.MASKED_EQ) != (self.mask is not None):
            raise ValueError("a mask is required with MASKED_EQ and refused otherwise")
        if self.mask is not None and (not 0 < self.mask <= _U64 or self.value & ~self.mask):
            raise ValueError(f"mask {self.mask:#x} does not cover value {self.value:#x}")

    def canonical(self) -> list[object]:
        return [self.index, self.op.value, self.value, self.mask]


@dataclass(frozen=True, slots=True)
class SeccompRule:
    """Deny `syscall` (when every condition in `args` holds) with `errno`.

    `fallback_nr` is used when the installed libseccomp does not know the name
    (a syscall newer than the library); only numbers >= 424 are accepted there,
    because only those are the same on every architecture.
    """

    syscall: str
    errno: int
    reason: str
    args: tuple[ArgCmp, ...] = ()
    fallback_nr: int | None = None

    def __post_init__(self) -> None:
        if not self.syscall or not self.reason:
            raise ValueError("a seccomp rule needs a syscall name and a reason")
        if not 0 < self.errno < 4096:
            raise ValueError(f"errno {self.errno} is outside 1..4095")
        indexes = [a.index for a in self.args]
        if len(set(indexes)) != len(indexes):
            # libseccomp rejects two comparisons on one argument with EINVAL.
            raise ValueError(f"{self.syscall}: two conditions on one argument")
        if self.fallback_nr is not None and self.fallback_nr < _FIRST_UNIFIED_NR:
            raise ValueError(f"{self.syscall}: fallback number {self.fallback_nr} is arch-specific")

    def canonical(self) -> list[object]:
        return [self.syscall, self.errno, [a.canonical() for a in self.args], self.fallback_nr]


@dataclass(frozen=True, slots=True)
class SeccompProfile:
    """A named deny list; everything else is allowed, foreign ABIs are killed."""

    name: str
    rules: tuple[SeccompRule, ...]

    def canonical(self) -> str:
        """A stable text form of the table (the input of `cache_key`)."""
        body = {"name": self.name, "rules": [r.canonical() for r in self.rules]}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


# --- the default table -------------------------------------------------------

_CLONE_NS_FLAGS: tuple[tuple[str, int], ...] = (
    ("CLONE_NEWTIME", 0x0000_0080),
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
)
_AF_NETLINK = 16
_AF_PACKET = 17
_AF_VSOCK = 40
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
# personality(2) flags that switch off exploit mitigations (ASLR, NX, the
# page-zero guard) for the caller and everything it executes.
_PERSONALITY_DANGEROUS: tuple[tuple[str, int], ...] = (
    ("ADDR_NO_RANDOMIZE", 0x0004_0000),
    ("MMAP_PAGE_ZERO", 0x0010_0000),
    ("ADDR_COMPAT_LAYOUT", 0x0020_0000),
    ("READ_IMPLIES_EXEC", 0x0040_0000),
)
_PERSONALITY_QUERY_BIT = 0x8000_0000
_HINT = "apt-get install libseccomp2"


def _deny(name: str, reason: str, *, err: int = errno.EPERM, nr: int | None = None) -> SeccompRule:
    return SeccompRule(name, err, reason, (), nr)


def _low32(index: int, value: int) -> ArgCmp:
    return ArgCmp(index, Cmp.MASKED_EQ, value, _U32)


def _default_rules() -> tuple[SeccompRule, ...]:
    m8 = "M8: "
    rules: list[SeccompRule] = [
        _deny("ptrace", m8 + "no tracing or memory access of other processes"),
        _deny("process_vm_readv", m8 + "no reading another process's memory"),
        _deny("process_vm_writev", m8 + "no writing another process's memory"),
        _deny("pidfd_getfd", m8 + "no stealing file descriptors from another process"),
        _deny("kcmp", m8 + "no probing other processes' kernel objects"),
        _deny("io_uring_setup", m8 + "io_uring bypasses seccomp (e.g. IORING_OP_SOCKET)"),
        _deny("io_uring_enter", m8 + "io_uring bypasses seccomp (e.g. IORING_OP_SOCKET)"),
        _deny("io_uring_register", m8 + "io_uring bypasses seccomp (e.g. IORING_OP_SOCKET)"),
        _deny("bpf", m8 + "no eBPF programs or maps (kernel attack surface)"),
        _deny("perf_event_open", m8 + "no perf events (side channels, kernel attack surface)"),
        _deny("userfaultfd", m8 + "userfaultfd widens kernel race windows for exploits"),
        _deny("keyctl", m8 + "kernel keyrings are not namespaced"),
        _deny("add_key", m8 + "kernel keyrings are not namespaced"),
        _deny("request_key", m8 + "kernel keyrings are not namespaced"),
        _deny("mount", m8 + "no mounts inside the sandbox"),
        _deny("umount2", m8 + "no unmounting (would reveal what bwrap covered)"),
        _deny("pivot_root", m8 + "no changing the root"),
        _deny("chroot", m8 + "no changing the root"),
        _deny("move_mount", m8 + "new mount API"),
        _deny("open_tree", m8 + "new mount API (can clone mounts)"),
        _deny("open_tree_attr", m8 + "new mount API (Linux 6.15)", nr=467),
        _deny("fsopen", m8 + "new mount API"),
        _deny("fsmount", m8 + "new mount API"),
        _deny("fspick", m8 + "new mount API"),
        _deny("fsconfig", m8 + "new mount API"),
        _deny("mount_setattr", m8 + "new mount API (can clear read-only)"),
        _deny("init_module", m8 + "no kernel modules"),
        _deny("finit_module", m8 + "no kernel modules"),
        _deny("delete_module", m8 + "no kernel modules"),
        _deny("kexec_load", m8 + "no kexec"),
        _deny("kexec_file_load", m8 + "no kexec"),
        _deny("unshare", m8 + "no new namespaces (user namespaces expose kernel attack surface)"),
        _deny("setns", m8 + "no joining namespaces"),
        # glibc (2.34+) tries clone3 first and falls back to clone on ENOSYS;
        # clone3 passes its flags in memory, which seccomp cannot inspect.
        _deny("clone3", m8 + "clone3 flags are not inspectable", err=errno.ENOSYS),
    ]
    for flag_name, bit in _CLONE_NS_FLAGS:
        # Legacy clone() takes only the low 32 bits of its flags; the low byte
        # is the exit signal, so the CLONE_NEWTIME rule only refuses exit
        # signals >= 128, which are invalid anyway.
        rules.append(
            SeccompRule(
                "clone",
                errno.EPERM,
                f"{m8}no new namespaces via clone({flag_name})",
                (ArgCmp(0, Cmp.MASKED_EQ, bit, bit),),
            )
        )
    rules += [
        SeccompRule(
            "socket",
            errno.EAFNOSUPPORT,
            m8 + "no AF_VSOCK (reaches the hypervisor host)",
            (_low32(0, _AF_VSOCK),),
        ),
        SeccompRule(
            "socket",
            errno.EAFNOSUPPORT,
            m8 + "no AF_PACKET (raw link-layer access)",
            (_low32(0, _AF_PACKET),),
        ),
        # NETLINK_ROUTE (protocol 0) stays: glibc's getaddrinfo/getifaddrs use
        # it, and it only sees the sandbox's own network namespace. The
        # protocol is compared on all 64 bits, so garbage in the upper half
        # is refused rather than ignored.
        SeccompRule(
            "socket",
            errno.EPERM,
            m8 + "netlink only for NETLINK_ROUTE",
            (_low32(0, _AF_NETLINK), ArgCmp(2, Cmp.NE, 0)),
        ),
        SeccompRule(
            "ioctl",
            errno.EPERM,
            m8 + "no TIOCSTI: typing into the controlling terminal",
            (_low32(1, _TIOCSTI),),
        ),
        SeccompRule(
            "ioctl",
            errno.EPERM,
            m8 + "no TIOCLINUX: console selection/injection",
            (_low32(1, _TIOCLINUX),),
        ),
        _deny("open_by_handle_at", m8 + "file handles bypass path-based confinement"),
        _deny("name_to_handle_at", m8 + "file handles bypass path-based confinement"),
        _deny("swapon", m8 + "host administration"),
        _deny("swapoff", m8 + "host administration"),
        _deny("reboot", m8 + "host administration"),
        _deny("acct", m8 + "host administration"),
        _deny("quotactl", m8 + "host administration"),
        _deny("quotactl_fd", m8 + "host administration"),
        _deny("syslog", m8 + "no kernel log (leaks addresses and host activity)"),
        _deny("lookup_dcookie", m8 + "kernel profiling interface"),
        _deny("iopl", m8 + "no raw I/O port access"),
        _deny("ioperm", m8 + "no raw I/O port access"),
        _deny("settimeofday", m8 + "the clock is not namespaced"),
        _deny("clock_settime", m8 + "the clock is not namespaced"),
        _deny("clock_adjtime", m8 + "the clock is not namespaced"),
        _deny("adjtimex", m8 + "the clock is not namespaced"),
        _deny("vhangup", m8 + "no hanging up terminals"),
        _deny("fanotify_init", m8 + "filesystem-wide event monitoring"),
    ]
    rules += _mode_bit_rules(m8)
    # personality(2) takes an unsigned int. The query value 0xffffffff must stay
    # allowed and libseccomp allows only one comparison per argument, so
    # "dangerous flag set and not the query" is written as: (1) a dangerous
    # flag with bit 31 clear, and (2) bit 31 set with any other bit clear
    # (every such value except the query is garbage or dangerous).
    for flag_name, bit in _PERSONALITY_DANGEROUS:
        rules.append(
            SeccompRule(
                "personality",
                errno.EPERM,
                f"{m8}personality({flag_name}) weakens exploit mitigations",
                (ArgCmp(0, Cmp.MASKED_EQ, bit, bit | _PERSONALITY_QUERY_BIT),),
            )
        )
    for i in range(31):
        rules.append(
            SeccompRule(
                "personality",
                errno.EPERM,
                f"{m8}personality with bit 31 set is only allowed as the query",
                (
                    ArgCmp(
                        0, Cmp.MASKED_EQ, _PERSONALITY_QUERY_BIT, _PERSONALITY_QUERY_BIT | (1 << i)
                    ),
                ),
            )
        )
    return tuple(rules)


#: (syscall, index of its mode_t argument, fallback number) for every call that
#: sets a file's mode bits. mode_t is a C unsigned int, hence the 32-bit masks.
_MODE_SETTERS: tuple[tuple[str, int, int | None], ...] = (
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, 452),
    ("open", 2, None),
    ("openat", 3, None),
    ("creat", 1, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
)
_S_ISUID = 0o4000
_S_ISGID = 0o2000


def _mode_bit_rules(prefix: str) -> list[SeccompRule]:
    """No call may ask for S_ISUID or S_ISGID (M13).

    Through the idmapped workspace the sandbox's files belong to the caller on
    disk (root, when corral runs as root), and the sandbox owns them inside
    its user namespace, so the kernel lets it set the bits: a setuid-root
    binary for any local user. `nosuid` mounts only protect the sandbox side.
    The open family is refused whenever the bits are present, not only with
    O_CREAT/O_TMPFILE: no program passes them otherwise. mkdir/mkdirat are
    not listed: the kernel masks their mode with S_IRWXUGO|S_ISVTX (a new
    directory is setgid only by inheriting it, and only chmod can set it). openat2 carries its
    mode inside a struct seccomp cannot read, so it answers ENOSYS, which
    makes runtimes fall back to openat (glibc and CPython never call it).
    """
    rules: list[SeccompRule] = []
    for name, index, nr in _MODE_SETTERS:
        for bit_name, bit in (("S_ISUID", _S_ISUID), ("S_ISGID", _S_ISGID)):
            rules.append(
                SeccompRule(
                    name,
                    errno.EPERM,
                    f"{prefix}no {bit_name} via {name}: setuid files are live on the host",
                    (ArgCmp(index, Cmp.MASKED_EQ, bit, bit),),
                    nr,
                )
            )
    rules.append(
        _deny(
            "openat2",
            prefix + "openat2's mode is not inspectable (falls back to openat)",
            err=errno.ENOSYS,
            nr=437,
        )
    )
    return rules


DEFAULT_PROFILE = SeccompProfile("namespace-default", _default_rules())
#: For a VMM that writes a workspace on the guest's behalf (QEMU's 9p server
#: under `--backend microvm`): only the setuid/setgid mode rules.
VMM_SETID_PROFILE = SeccompProfile("vmm-setid", tuple(_mode_bit_rules("vmm: ")))


# --- compilation and cache ---------------------------------------------------


class _SeccompVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


@functools.cache
def libseccomp_version() -> str:
    """The installed libseccomp's version ("2.5.4"), without importing pyseccomp.

    Raises LayerUnavailableError when libseccomp cannot be loaded.
    """
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
        fn = lib.seccomp_version
    except (OSError, AttributeError) as exc:
        raise LayerUnavailableError("seccomp", f"libseccomp.so.2 unusable: {exc}", _HINT) from exc
    fn.restype = ctypes.POINTER(_SeccompVersion)
    fn.argtypes = ()
    v = fn().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def native_audit_arch() -> int:
    """AUDIT_ARCH_* of this machine's native ABI (what seccomp_data.arch holds)."""
    machine = os.uname().machine
    try:
        return _AUDIT_ARCHES[machine]
    except KeyError:
        raise LayerUnavailableError("seccomp", f"architecture {machine} is not supported") from None


def build_bpf(profile: SeccompProfile) -> bytes:
    """Compile `profile` for the native architecture into raw classic BPF.

    The result is a sequence of 8-byte `struct sock_filter`, ready for
    `bwrap --seccomp FD`. Raises LayerUnavailableError when libseccomp is
    missing and SandboxStartError when a rule cannot be compiled (never a
    partial filter).
    """
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError) as exc:
        raise LayerUnavailableError(
            "seccomp", f"libseccomp binding unusable: {exc}", _HINT
        ) from exc

    try:
        filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        filt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
        # A binary search over syscall numbers instead of a linear chain:
        # allowed syscalls are the common case and pay the lookup.
        filt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, 2)
    except OSError as exc:
        raise SandboxStartError(exc.errno, f"libseccomp refused filter attributes: {exc}") from exc
    for rule in profile.rules:
        nr = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, rule.syscall))
        if nr < 0:
            if rule.fallback_nr is None:
                msg = f"libseccomp {libseccomp_version()} does not know syscall {rule.syscall}"
                raise SandboxStartError(errno.ENOSYS, msg)
            nr = rule.fallback_nr
        conds = [
            pyseccomp.Arg(a.index, _PYSECCOMP_OPS[a.op], a.mask, a.value)
            if a.mask is not None
            else pyseccomp.Arg(a.index, _PYSECCOMP_OPS[a.op], a.value)
            for a in rule.args
        ]
        try:
            filt.add_rule(pyseccomp.ERRNO(rule.errno), nr, *conds)
        except OSError as exc:
            msg = f"seccomp rule for {rule.syscall} rejected: {exc}"
            raise SandboxStartError(exc.errno, msg) from exc

    fd = os.memfd_create("corral-seccomp-build", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as fh:
            filt.export_bpf(fh)
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
    except OSError as exc:
        raise SandboxStartError(exc.errno, f"exporting the seccomp filter failed: {exc}") from exc
    finally:
        os.close(fd)
    validate_bpf(data)
    return data


def _sha256(data: bytes = b"") -> _Hash:
    """SHA-256 from CPython's builtin module where there is one.

    Importing hashlib loads OpenSSL's libcrypto, the largest single native
    import of `corral exec` (~4 ms of -X importtime on a loaded host, against
    ~1 ms for the builtin). The digest is the same; hashlib is the fallback
    for an interpreter built without the builtin modules.
    """
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]  # 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            from hashlib import sha256
    h: _Hash = sha256(data)
    return h


# pyseccomp's comparison operator numbers (libseccomp's enum scmp_compare).
_PYSECCOMP_OPS = {Cmp.NE: 1, Cmp.EQ: 4, Cmp.MASKED_EQ: 7}


#: `cache_key` of each profile object this process has hashed (profiles are frozen; held
#: here, so an identity match cannot be a new object at a reused address).
_KEYS: list[tuple[SeccompProfile, str]] = []
#: `cached_bpf`'s programs, by cache file: (what both files were when the program was
#: read or written, the program). A program here has passed `validate_bpf`.
_PROGRAMS: dict[str, tuple[tuple[tuple[int, ...] | None, ...], bytes]] = {}


def cache_key(profile: SeccompProfile) -> str:
    """Hash over the table, the compiler format, libseccomp's version and the arch."""
    for known, key in _KEYS:
        if known is profile:
            return key
    key = _cache_key(profile)
    if len(_KEYS) < 64:  # a process makes a few profiles; a test may make many
        _KEYS.append((profile, key))
    return key


def _cache_key(profile: SeccompProfile) -> str:
    h = _sha256()
    for part in (str(_FORMAT), profile.canonical(), libseccomp_version(), os.uname().machine):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def cache_path(profile: SeccompProfile, cache_dir: str | os.PathLike[str]) -> str:
    """Where `cached_bpf` keeps the compiled `profile`."""
    return os.path.join(os.fspath(cache_dir), f"seccomp-{cache_key(profile)}.bpf")


def cached_bpf(profile: SeccompProfile, cache_dir: str | os.PathLike[str]) -> bytes:
    """`build_bpf(profile)`, compiled once per machine and read back afterwards.

    The cache file is trusted only if it is a regular file owned by the
    effective uid, not writable by group or others, a structurally valid
    program, and matches the SHA-256 in its `.sha256` sidecar (held to the
    same checks); otherwise it is rebuilt and atomically replaced. A cache that
    cannot be written is not an error: the freshly built program is returned
    and the next call builds again.
    """
    path = cache_path(profile, cache_dir)
    # Both files as they are before this call reads them. Unchanged since the
    # program was read or written (same inode, size, mode, owner, mtime and
    # ctime, which every write, rename, chmod and chown moves, and no one can
    # set back), they still hold it, so the checks below would pass again.
    files = (_identity(path), _identity(path + ".sha256"))
    known = _PROGRAMS.get(path)
    if known is not None and None not in files and known[0] == files:
        return known[1]
    data = _read_trusted(path)
    # A structurally valid program can still be a prefix of the real one
    # (when the table ends in several returns), so its digest must match too.
    digest = _read_trusted(path + ".sha256", validate=False)
    if data is not None and digest == _sha256(data).hexdigest().encode():
        _PROGRAMS[path] = (files, data)
        return data
    data = build_bpf(profile)
    _write_atomic(os.fspath(cache_dir), path + ".sha256", _sha256(data).hexdigest().encode())
    _write_atomic(os.fspath(cache_dir), path, data)
    # Taken after the writes: a file swapped in meanwhile only differs from
    # them later, and the next call reads it and checks it.
    _PROGRAMS[path] = ((_identity(path), _identity(path + ".sha256")), data)
    return data


def _identity(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_trusted(path: str, *, validate: bool = True) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & 0o022
            or not 0 < st.st_size <= 8 * _BPF_MAXINSNS
        ):
            return None
        data = os.pread(fd, st.st_size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if validate:
            validate_bpf(data)
    except ValueError:
        return None
    return data


def _write_atomic(directory: str, path: str, data: bytes) -> None:
    tmp = os.path.join(directory, f".seccomp-{os.urandom(8).hex()}.tmp")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
    except OSError:
        return
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        # Readers see the old file or the complete new one, never a prefix.
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def bpf_fd(data: bytes) -> int:
    """A sealed memfd holding `data`, positioned at 0, for `bwrap --seccomp FD`.

    The descriptor is close-on-exec; `subprocess`'s `pass_fds` makes it
    inheritable in the child only. bubblewrap reads it to EOF, so one
    descriptor serves one launch. The caller closes it after the spawn.
    """
    # The very object `cached_bpf` validated (bytes are immutable) is not walked
    # again. tuple() copies the values in one C call: another thread's
    # `cached_bpf` may add an entry meanwhile.
    if not any(data is program for _, program in tuple(_PROGRAMS.values())):
        validate_bpf(data)
    fd = os.memfd_create("corral-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        # Sealed, so nothing holding the descriptor can swap the program.
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- a classic-BPF interpreter for seccomp programs ---------------------------

_LD_W_ABS = 0x20
_LD_MEM = 0x60
_LDX_MEM = 0x61
_ST = 0x02
_STX = 0x03
_ALU_AND_K = 0x54
_ALU_OR_K = 0x44
_JA = 0x05
_JEQ_K = 0x15
_JGT_K = 0x25
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_A = 0x16
_TAX = 0x07
_TXA = 0x87
_LD_IMM = 0x00
_LDX_IMM = 0x01
_KNOWN_OPS = frozenset(
    {
        _LD_W_ABS,
        _LD_MEM,
        _LDX_MEM,
        _ST,
        _STX,
        _ALU_AND_K,
        _ALU_OR_K,
        _JA,
        _JEQ_K,
        _JGT_K,
        _JGE_K,
        _JSET_K,
        _RET_K,
        _RET_A,
        _TAX,
        _TXA,
        _LD_IMM,
        _LDX_IMM,
    }
)
_COND_JUMPS = frozenset({_JEQ_K, _JGT_K, _JGE_K, _JSET_K})
_SECCOMP_DATA_SIZE = 64
_BPF_MEMWORDS = 16


def _insns(bpf: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack_from("<HBBI", bpf, off) for off in range(0, len(bpf), 8)]


def validate_bpf(bpf: bytes) -> None:
    """Raise ValueError unless `bpf` is a well-formed seccomp program.

    Checks what the kernel's verifier checks for the instructions libseccomp
    emits: length, known opcodes, in-range forward jumps and loads, and that
    every path ends in a return.
    """
    if not bpf or len(bpf) % 8 or len(bpf) > 8 * _BPF_MAXINSNS:
        raise ValueError(
            f"a seccomp program is 1..{_BPF_MAXINSNS} 8-byte instructions, not {len(bpf)}B"
        )
    insns = _insns(bpf)
    n = len(insns)
    for pc, (code, jt, jf, k) in enumerate(insns):
        if code not in _KNOWN_OPS:
            raise ValueError(f"instruction {pc}: unexpected opcode {code:#x}")
        if code == _JA and pc + 1 + k >= n:
            raise ValueError(f"instruction {pc}: jump out of the program")
        if code in _COND_JUMPS and (pc + 1 + jt >= n or pc + 1 + jf >= n):
            raise ValueError(f"instruction {pc}: jump out of the program")
        if code == _LD_W_ABS and (k % 4 or k >= _SECCOMP_DATA_SIZE):
            raise ValueError(f"instruction {pc}: load outside seccomp_data")
        if code in (_LD_MEM, _LDX_MEM, _ST, _STX) and k >= _BPF_MEMWORDS:
            raise ValueError(f"instruction {pc}: scratch memory index {k}")
    if insns[-1][0] not in (_RET_K, _RET_A):
        raise ValueError("the last instruction is not a return")


def evaluate(bpf: bytes, nr: int, args: Sequence[int] = (), arch: int | None = None) -> int:
    """Run the seccomp program on a synthetic syscall and return its SECCOMP_RET_* value.

    `nr` is the syscall number as the kernel sees it (an x32 call carries
    0x40000000), `args` up to six u64 arguments (missing ones are 0), `arch`
    the AUDIT_ARCH_* (default: native). Pure: nothing is loaded.
    """
    validate_bpf(bpf)
    full = [a & _U64 for a in args] + [0] * (6 - len(args))
    audit_arch = native_audit_arch() if arch is None else arch
    data = struct.pack("<iIQ6Q", _as_s32(nr), audit_arch, 0, *full[:6])
    insns = _insns(bpf)
    a = x = 0
    mem = [0] * _BPF_MEMWORDS
    pc = 0
    # Programs are loop-free (forward jumps only), so this terminates.
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == _LD_W_ABS:
            a = struct.unpack_from("<I", data, k)[0]
        elif code == _LD_IMM:
            a = k
        elif code == _LDX_IMM:
            x = k
        elif code == _LD_MEM:
            a = mem[k]
        elif code == _LDX_MEM:
            x = mem[k]
        elif code == _ST:
            mem[k] = a
        elif code == _STX:
            mem[k] = x
        elif code == _ALU_AND_K:
            a &= k
        elif code == _ALU_OR_K:
            a |= k
        elif code == _TAX:
            x = a
        elif code == _TXA:
            a = x
        elif code == _JA:
            pc += k
        elif code in _COND_JUMPS:
            if code == _JEQ_K:
                hit = a == k
            elif code == _JGT_K:
                hit = a > k
            elif code == _JGE_K:
                hit = a >= k
            else:
                hit = bool(a & k)
            pc += jt if hit else jf
        elif code == _RET_K:
            return k
        else:  # _RET_A
            return a


def _as_s32(nr: int) -> int:
    nr &= _U32
    return nr - (1 << 32) if nr & 0x8000_0000 else nr


def ret_errno(ret: int) -> int | None:
    """The errno of a SECCOMP_RET_ERRNO result, else None."""
    return ret & _RET_DATA_MASK if ret & _RET_ACTION_MASK == RET_ERRNO else None
