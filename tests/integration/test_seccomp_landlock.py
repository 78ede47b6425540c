"""Seccomp and Landlock, attacked for real, always in child processes.

Seccomp: the compiled filter is handed to a real `bwrap --seccomp FD` (as uid
65534 when root, so bwrap keeps no capabilities) and a probe script run by
Debian's `/usr/bin/python3 -I -S` attempts every denied family with ctypes.
Three runs prove three things:
- with the real profile, each attack fails with the rule's errno and has no
  effect (nothing copied, nothing injected);
- with a "marker" profile (every errno replaced by 4000, which the kernel
  never returns) each attack returns 4000, so the refusal comes from the
  filter and not from the kernel's own permission checks;
- with no filter, the same probes succeed where this kernel allows them, so
  the probes are real attacks.

Landlock: `landlock.py` is imported by `/usr/bin/python3 -I -S` exactly as the
in-sandbox init does, applied in that child, and the effect is checked on the
host (canary absent from the output, files unchanged, helper still alive).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import os
import platform
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.doctor import landlock_abi
from corral.sandbox import landlock, seccomp
from corral.sandbox.landlock import LandlockRules

SYS_PYTHON = "/usr/bin/python3"
BWRAP = "/usr/bin/bwrap"
LANDLOCK_PY = Path(landlock.__file__).resolve()
MARKER = 4000
UNPRIVILEGED = 65534
SECRET = "corral-canary-7f3a"

F = TypeVar("F", bound=Callable[..., object])

x86_64_only = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the probes use x86_64 syscall numbers"
)

# --- seccomp -----------------------------------------------------------------

PROBE_SCRIPT = r'''
import ctypes, json, mmap, os, struct, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
U64 = (1 << 64) - 1


def sc(nr, *args):
    ctypes.set_errno(0)
    cargs = [ctypes.c_ulong(a & U64) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(nr), *cargs)
    return r, (ctypes.get_errno() if r == -1 else 0)


def res(r, e, **kw):
    return {"ret": r, "errno": e, **kw}


def forked(fn):
    """fn() in a child: its result, or the signal that killed it."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            out = fn()
        except BaseException as exc:
            out = {"exc": repr(exc)}
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    data = b""
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return json.loads(data) if data else {"exc": "no result"}


def clone_like(nr, *args):
    # If the filter misses, the raw clone returns 0 in a copy of this process.
    r, e = sc(nr, *args)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0x40000000)  # __WALL: the child may have no exit signal
    return res(r, e)


def p_ptrace_traceme():
    return res(*sc(101, 0, 0, 0, 0))


def p_ptrace_attach():
    pid = os.fork()
    if pid == 0:
        import time
        time.sleep(5)
        os._exit(0)
    r, e = sc(101, 16, pid, 0, 0)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return res(r, e)


def p_process_vm_readv():
    src = ctypes.create_string_buffer(b"canary!", 8)
    dst = ctypes.create_string_buffer(8)
    lb = ctypes.create_string_buffer(struct.pack("QQ", ctypes.addressof(dst), 8), 16)
    rb = ctypes.create_string_buffer(struct.pack("QQ", ctypes.addressof(src), 8), 16)
    r, e = sc(310, os.getpid(), lb, 1, rb, 1, 0)
    return res(r, e, copied=dst.raw[:7].decode("latin-1"))


def p_io_uring_setup():
    return res(*sc(425, 1, ctypes.create_string_buffer(120)))


def p_bpf():
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1), 72)
    return res(*sc(321, 0, attr, 72))


def p_perf_event_open():
    attr = bytearray(128)
    struct.pack_into("IIQ", attr, 0, 1, 128, 0)
    struct.pack_into("Q", attr, 40, 1 | (1 << 5) | (1 << 6))
    return res(*sc(298, ctypes.create_string_buffer(bytes(attr), 128), 0, -1, -1, 0))


def p_userfaultfd():
    return res(*sc(323, os.O_CLOEXEC | 1))


def p_keyctl():
    return res(*sc(250, 0, -2, 1))


def p_add_key():
    return res(*sc(248, b"user", b"corral-probe", b"x", 1, -2))


def p_mount():
    return res(*sc(165, b"none", b"/tmp", b"tmpfs", 0, 0))


def p_unshare_user():
    return res(*sc(272, 0x10000000))


def p_setns():
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
    return res(*sc(308, fd, 0x04000000))


def p_clone_newns():
    return clone_like(56, 0x00020000 | 17, 0, 0, 0, 0)


def p_clone_newuser():
    return clone_like(56, 0x10000000 | 17, 0, 0, 0, 0)


def p_clone3():
    args = struct.pack("11Q", 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
    return clone_like(435, ctypes.create_string_buffer(args, 88), 88)


def p_socket_vsock():
    return res(*sc(41, 40, 1, 0))


def p_socket_packet():
    return res(*sc(41, 17, 3, 0))


def p_socket_netlink_audit():
    return res(*sc(41, 16, 3, 9))


def p_socket_netlink_route():
    return res(*sc(41, 16, 3, 0))


def tiocsti(cmd):
    import fcntl, termios
    os.setsid()
    master, slave = os.openpty()
    r, e = sc(16, slave, 0x540E, 0)  # TIOCSCTTY: TIOCSTI needs the controlling tty
    if r != 0:
        return {"exc": "TIOCSCTTY errno %d" % e}
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~(termios.ICANON | termios.ECHO)
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    ch = ctypes.c_char(b"Z")
    r, e = sc(16, slave, cmd, ctypes.byref(ch))
    fcntl.fcntl(slave, fcntl.F_SETFL, os.O_NONBLOCK)
    try:
        got = os.read(slave, 16).decode("latin-1")
    except BlockingIOError:
        got = ""
    return res(r, e, injected=got)


def p_tiocsti():
    return tiocsti(0x5412)


def p_tiocsti_high_bits():
    # The kernel truncates the command to 32 bits: a 64-bit compare is bypassed.
    return tiocsti(0xDEADBEEF00005412)


def p_personality_noaslr():
    return res(*sc(135, 0x0040000))


def p_personality_query():
    return res(*sc(135, 0xFFFFFFFF))


def p_int80_getpid():
    code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax,20; int 0x80; ret
    m = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    return res(fn(), 0, pid=os.getpid())


def p_x32_getpid():
    return res(*sc(39 | 0x40000000))


def p_fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, st = os.waitpid(pid, 0)
    return res(os.WEXITSTATUS(st), 0)


def p_thread():
    import threading
    box = []
    t = threading.Thread(target=lambda: box.append(1))
    t.start()
    t.join()
    return res(len(box), 0)


def p_sh():
    import subprocess
    out = subprocess.run(["/bin/sh", "-c", "echo sh-ok"], capture_output=True, text=True)
    return res(out.returncode, 0, out=out.stdout.strip())


def p_getaddrinfo():
    import socket
    return res(len(socket.getaddrinfo("localhost", 80)), 0)


results = {}
for name, fn in sorted(globals().items()):
    if name.startswith("p_"):
        results[name[2:]] = forked(fn)
generic = {}
for label, nr, args in json.loads(sys.argv[1]):
    generic[label] = forked(lambda nr=nr, args=args: clone_like(nr, *args))
results["generic"] = generic
print(json.dumps(results))
'''

# Attack probes and the errno the real profile must answer with.
DENIED: dict[str, int] = {
    "ptrace_traceme": errno.EPERM,
    "ptrace_attach": errno.EPERM,
    "process_vm_readv": errno.EPERM,
    "io_uring_setup": errno.EPERM,
    "bpf": errno.EPERM,
    "perf_event_open": errno.EPERM,
    "userfaultfd": errno.EPERM,
    "keyctl": errno.EPERM,
    "add_key": errno.EPERM,
    "mount": errno.EPERM,
    "unshare_user": errno.EPERM,
    "setns": errno.EPERM,
    "clone_newns": errno.EPERM,
    "clone_newuser": errno.EPERM,
    "clone3": errno.ENOSYS,
    "socket_vsock": errno.EAFNOSUPPORT,
    "socket_packet": errno.EAFNOSUPPORT,
    "socket_netlink_audit": errno.EPERM,
    "tiocsti": errno.EPERM,
    "tiocsti_high_bits": errno.EPERM,
    "personality_noaslr": errno.EPERM,
}


def _sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _matching_args(rule: seccomp.SeccompRule) -> list[int]:
    args = [0] * 6
    for cond in rule.args:
        if cond.op is seccomp.Cmp.NE:
            args[cond.index] = (cond.value + 1) & ((1 << 64) - 1)
        else:
            args[cond.index] = cond.value
    return args


def _rule_label(index: int) -> str:
    return f"{index}-{seccomp.DEFAULT_PROFILE.rules[index].syscall}"


def _generic_probes() -> list[list[Any]]:
    import pyseccomp

    out: list[list[Any]] = []
    for i, rule in enumerate(seccomp.DEFAULT_PROFILE.rules):
        nr = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, rule.syscall))
        if nr < 0:
            assert rule.fallback_nr is not None
            nr = rule.fallback_nr
        out.append([_rule_label(i), nr, _matching_args(rule)])
    return out


MARKER_PROFILE = seccomp.SeccompProfile(
    "marker",
    tuple(dataclasses.replace(r, errno=MARKER) for r in seccomp.DEFAULT_PROFILE.rules),
)


@functools.cache
def _probe_run(mode: str) -> dict[str, Any]:
    argv = [
        BWRAP,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    fds: list[int] = []
    if mode != "none":
        profile = seccomp.DEFAULT_PROFILE if mode == "real" else MARKER_PROFILE
        fds.append(seccomp.bpf_fd(seccomp.build_bpf(profile)))
        argv += ["--seccomp", str(fds[0])]
    argv += [SYS_PYTHON, "-I", "-S", "-c", PROBE_SCRIPT, json.dumps(_generic_probes())]
    drop: dict[str, Any] = {}
    if os.geteuid() == 0:
        drop = {"user": UNPRIVILEGED, "group": UNPRIVILEGED, "extra_groups": []}
    try:
        proc = subprocess.run(
            argv,
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **drop,
        )
    finally:
        for fd in fds:
            os.close(fd)
    assert proc.returncode == 0, f"probe run ({mode}) failed: {proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def in_bwrap(fn: F) -> F:
    """Markers of a test that runs the probe script under bwrap (and seccomp)."""
    for mark in (
        pytest.mark.requires_bwrap,
        pytest.mark.requires_userns,
        pytest.mark.requires_seccomp,
        x86_64_only,
    ):
        fn = mark(fn)
    return fn


@pytest.mark.parametrize("probe", sorted(DENIED))
@in_bwrap
def test_attack_denied_with_rule_errno(probe: str) -> None:
    got = _probe_run("real")[probe]
    assert got.get("errno") == DENIED[probe], got
    assert got["ret"] == -1


@pytest.mark.parametrize("probe", sorted(DENIED))
@in_bwrap
def test_denial_comes_from_the_filter(probe: str) -> None:
    assert _probe_run("marker")[probe].get("errno") == MARKER


@in_bwrap
def test_denied_attacks_have_no_effect() -> None:
    real = _probe_run("real")
    assert real["process_vm_readv"]["copied"] != "canary!"
    assert real["tiocsti"]["injected"] == ""
    assert real["tiocsti_high_bits"]["injected"] == ""


@pytest.mark.requires_bwrap
@pytest.mark.requires_userns
@x86_64_only
def test_probes_are_real_attacks_without_the_filter() -> None:
    ctl = _probe_run("none")
    expect_ok = [
        "ptrace_traceme",
        "ptrace_attach",
        "process_vm_readv",
        "keyctl",
        "add_key",
        "unshare_user",
        "clone_newuser",
        "clone3",
        "socket_netlink_audit",
        "userfaultfd",
        "personality_noaslr",
    ]
    if _sysctl("/proc/sys/kernel/io_uring_disabled") in (None, "0"):
        expect_ok.append("io_uring_setup")
    if int(_sysctl("/proc/sys/kernel/perf_event_paranoid") or "3") <= 2:
        expect_ok.append("perf_event_open")
    if _sysctl("/proc/sys/dev/tty/legacy_tiocsti") != "0":
        expect_ok += ["tiocsti", "tiocsti_high_bits"]
    failed = {
        p: ctl[p]
        for p in expect_ok
        if not (isinstance(ctl[p].get("ret"), int) and ctl[p]["ret"] >= 0)
    }
    assert not failed, failed
    assert ctl["process_vm_readv"]["copied"] == "canary!"
    if "tiocsti" in expect_ok:
        assert ctl["tiocsti_high_bits"]["injected"] == "Z"
    assert all("signal" not in v for k, v in ctl.items() if k != "generic")


@pytest.mark.parametrize("index", range(len(seccomp.DEFAULT_PROFILE.rules)), ids=_rule_label)
@in_bwrap
def test_every_rule_is_enforced_by_the_kernel(index: int) -> None:
    got = _probe_run("marker")["generic"][_rule_label(index)]
    assert got.get("errno") == MARKER, got


@pytest.mark.parametrize("probe", ["int80_getpid", "x32_getpid"])
@in_bwrap
def test_foreign_abi_syscalls_kill_the_process(probe: str) -> None:
    assert _probe_run("real")[probe] == {"signal": signal.SIGSYS}
    # Without the filter the same code is not killed: the kill is the filter's.
    assert "signal" not in _probe_run("none")[probe]


@in_bwrap
def test_normal_work_still_runs_under_the_filter() -> None:
    real = _probe_run("real")
    assert real["fork"]["ret"] == 7
    assert real["thread"]["ret"] == 1
    assert real["sh"] == {"ret": 0, "errno": 0, "out": "sh-ok"}
    assert real["getaddrinfo"]["ret"] >= 1
    assert real["socket_netlink_route"]["ret"] >= 0
    assert real["personality_query"]["ret"] >= 0


@pytest.mark.requires_seccomp
def test_bpf_fd_is_sealed_and_rewound() -> None:
    data = seccomp.build_bpf(seccomp.DEFAULT_PROFILE)
    fd = seccomp.bpf_fd(data)
    try:
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert os.pread(fd, len(data) + 8, 0) == data
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\0" * 8, 0)
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)


@pytest.mark.requires_seccomp
def test_cache_is_written_once_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path)
    path = Path(seccomp.cache_path(seccomp.DEFAULT_PROFILE, tmp_path))
    assert path.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".sha256"]

    def no_build(profile: seccomp.SeccompProfile) -> bytes:
        raise AssertionError("the cached program should have been used")

    monkeypatch.setattr(seccomp, "build_bpf", no_build)
    assert seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path) == first


@pytest.mark.requires_seccomp
def test_cache_key_follows_the_table(tmp_path: Path) -> None:
    changed = seccomp.SeccompProfile("x", seccomp.DEFAULT_PROFILE.rules[:-1])
    assert seccomp.cache_path(changed, tmp_path) != seccomp.cache_path(
        seccomp.DEFAULT_PROFILE, tmp_path
    )


@pytest.mark.parametrize("tamper", ["group-writable", "garbage", "truncated", "symlink"])
@pytest.mark.requires_seccomp
def test_untrusted_cache_file_is_rebuilt(tmp_path: Path, tamper: str) -> None:
    good = seccomp.build_bpf(seccomp.DEFAULT_PROFILE)
    path = Path(seccomp.cache_path(seccomp.DEFAULT_PROFILE, tmp_path))
    allow_all = bytes.fromhex("060000000000ff7f")  # RET ALLOW
    if tamper == "group-writable":
        path.write_bytes(allow_all)
        path.chmod(0o664)
    elif tamper == "garbage":
        path.write_bytes(b"\xff" * 64)
        path.chmod(0o644)
    elif tamper == "truncated":
        path.write_bytes(good[:-8])
        path.chmod(0o644)
    else:
        target = tmp_path / "elsewhere.bpf"
        target.write_bytes(allow_all)
        path.symlink_to(target)
    assert seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path) == good
    assert not path.is_symlink()
    assert path.read_bytes() == good


@pytest.mark.requires_seccomp
def test_unwritable_cache_still_returns_the_filter(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, not_a_dir) == seccomp.build_bpf(
        seccomp.DEFAULT_PROFILE
    )


# --- Landlock ----------------------------------------------------------------

PRELUDE = r"""
import errno, json, os, signal, socket, sys
sys.path.insert(0, sys.argv[1])
import landlock
ABI = None
if sys.argv[2] != "-":
    ABI = landlock.apply(landlock.LandlockRules.from_json(sys.argv[2]))


def attempt(fn):
    try:
        out = fn()
        return {"ok": True, "value": out}
    except OSError as exc:
        return {"ok": False, "errno": exc.errno}


def read(path):
    with open(path) as fh:
        return fh.read()


def write(path, text, mode="w"):
    with open(path, mode) as fh:
        fh.write(text)
    return True
"""

SYSTEM_RO = ("/usr", "/lib", "/lib64", "/bin")


def _landlocked(
    rules: LandlockRules | None, code: str, *args: str, user: int | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    argv = [
        SYS_PYTHON,
        "-I",
        "-S",
        "-c",
        PRELUDE + code,
        str(LANDLOCK_PY.parent),
        rules.to_json() if rules is not None else "-",
        *args,
    ]
    drop: dict[str, Any] = {}
    if user is not None:
        drop = {"user": user, "group": user, "extra_groups": []}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        **drop,
    )


def _json_out(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@dataclasses.dataclass(frozen=True)
class Tree:
    root: Path
    allowed: Path
    readonly: Path
    forbidden: Path
    canary: Path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    allowed, readonly, forbidden = (tmp_path / n for n in ("allowed", "readonly", "forbidden"))
    for d in (allowed, readonly, forbidden):
        d.mkdir()
    canary = forbidden / "secret.txt"
    canary.write_text(SECRET)
    (readonly / "orig.txt").write_text("orig")
    return Tree(tmp_path, allowed, readonly, forbidden, canary)


def _rules(t: Tree, **kw: Any) -> LandlockRules:
    ro = kw.pop("read_only", (*SYSTEM_RO, str(t.readonly)))
    rw = kw.pop("read_write", (str(t.allowed),))
    return LandlockRules(ro, rw, **kw)


landlock_required = pytest.mark.requires_landlock


@pytest.mark.parametrize("confined", [True, False])
@landlock_required
def test_read_outside_allowlist_is_denied(tree: Tree, confined: bool) -> None:
    rules = _rules(tree) if confined else _rules(tree, read_only=(*SYSTEM_RO, str(tree.forbidden)))
    proc = _landlocked(
        rules,
        "print(json.dumps({'r': attempt(lambda: read(sys.argv[3])),"
        " 'ls': attempt(lambda: os.listdir(os.path.dirname(sys.argv[3])))}))",
        str(tree.canary),
    )
    out = _json_out(proc)
    if confined:
        assert out["r"] == {"ok": False, "errno": errno.EACCES}
        assert out["ls"] == {"ok": False, "errno": errno.EACCES}
        assert SECRET not in proc.stdout
    else:  # the same probe without the restriction reads the canary
        assert out["r"]["value"] == SECRET


@landlock_required
def test_writes_to_read_only_paths_are_denied(tree: Tree) -> None:
    ro = tree.readonly
    code = """
d = sys.argv[3]
print(json.dumps({
  "overwrite": attempt(lambda: write(d + "/orig.txt", "pwned")),
  "append": attempt(lambda: write(d + "/orig.txt", "pwned", "a")),
  "create": attempt(lambda: write(d + "/new.txt", "pwned")),
  "mkdir": attempt(lambda: os.mkdir(d + "/sub")),
  "unlink": attempt(lambda: os.unlink(d + "/orig.txt")),
  "truncate": attempt(lambda: os.truncate(d + "/orig.txt", 0)),
  "read": attempt(lambda: read(d + "/orig.txt")),
}))
"""
    out = _json_out(_landlocked(_rules(tree), code, str(ro)))
    for op in ("overwrite", "append", "create", "mkdir", "unlink", "truncate"):
        assert out[op] == {"ok": False, "errno": errno.EACCES}, op
    assert out["read"]["value"] == "orig"
    assert (ro / "orig.txt").read_text() == "orig"
    assert sorted(p.name for p in ro.iterdir()) == ["orig.txt"]


@landlock_required
def test_reads_and_writes_in_allowed_paths_work(tree: Tree) -> None:
    code = """
d = sys.argv[3]
write(d + "/a.txt", "hello")
os.mkdir(d + "/sub")
os.rename(d + "/a.txt", d + "/sub/b.txt")
write(d + "/sub/b.txt", " world", "a")
os.symlink("b.txt", d + "/sub/link")
write(d + "/gone", "x"); os.unlink(d + "/gone")
print(json.dumps({"read": read(d + "/sub/link"), "abi": ABI}))
"""
    out = _json_out(_landlocked(_rules(tree), code, str(tree.allowed)))
    assert out["read"] == "hello world"
    assert (tree.allowed / "sub" / "b.txt").read_text() == "hello world"
    assert not (tree.allowed / "gone").exists()
    assert out["abi"] == min(landlock_abi(), landlock.ABI_MAX)


@landlock_required
def test_symlink_in_allowed_dir_to_forbidden_file_is_denied(tree: Tree) -> None:
    planted = tree.allowed / "planted"
    planted.symlink_to(tree.canary)
    code = """
d, target = sys.argv[3], sys.argv[4]
os.symlink(target, d + "/own")
print(json.dumps({"planted": attempt(lambda: read(d + "/planted")),
                  "own": attempt(lambda: read(d + "/own")),
                  "proc": attempt(lambda: read("/proc/self/root" + target))}))
"""
    proc = _landlocked(
        _rules(tree, read_write=(str(tree.allowed), "/proc")),
        code,
        str(tree.allowed),
        str(tree.canary),
    )
    out = _json_out(proc)
    for route in ("planted", "own", "proc"):
        assert out[route] == {"ok": False, "errno": errno.EACCES}, route
    assert SECRET not in proc.stdout


@pytest.mark.parametrize("confined", [True, False])
@landlock_required
def test_hard_link_or_rename_of_forbidden_file_is_denied(tree: Tree, confined: bool) -> None:
    code = """
d, target = sys.argv[3], sys.argv[4]
print(json.dumps({"link": attempt(lambda: os.link(target, d + "/hl")),
                  "rename": attempt(lambda: os.rename(target, d + "/moved"))}))
"""
    rules = _rules(tree) if confined else None
    out = _json_out(_landlocked(rules, code, str(tree.allowed), str(tree.canary)))
    if confined:
        # REFER (ABI 2+) answers EXDEV; below it every cross-dir link is EXDEV too.
        assert out["link"]["ok"] is False and out["link"]["errno"] in (errno.EXDEV, errno.EACCES)
        assert out["rename"]["ok"] is False and out["rename"]["errno"] in (
            errno.EXDEV,
            errno.EACCES,
        )
        assert not (tree.allowed / "hl").exists()
        assert not (tree.allowed / "moved").exists()
        assert tree.canary.read_text() == SECRET
    else:
        assert out["link"]["ok"] is True
        assert (tree.allowed / "hl").read_text() == SECRET


@pytest.fixture
def abstract_listener() -> Iterator[tuple[socket.socket, str]]:
    name = f"corral-test-{os.getpid()}-{time.monotonic_ns()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind("\0" + name)
        srv.listen(4)
        srv.setblocking(False)
        yield srv, name
    finally:
        srv.close()


def _pending(srv: socket.socket) -> bool:
    ready, _, _ = select.select([srv], [], [], 0.2)
    if not ready:
        return False
    conn, _ = srv.accept()
    conn.close()
    return True


def _need_abi(n: int) -> None:
    if landlock_abi() < n:
        pytest.skip(f"needs Landlock ABI {n}, kernel has {landlock_abi()}")


@pytest.mark.parametrize("scoped", [True, False])
@landlock_required
def test_abstract_unix_socket_outside_domain_is_unreachable(
    tree: Tree, abstract_listener: tuple[socket.socket, str], scoped: bool
) -> None:
    _need_abi(6)
    srv, name = abstract_listener
    code = """
def go():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\\0" + sys.argv[3])
    finally:
        s.close()
print(json.dumps({"connect": attempt(go)}))
"""
    out = _json_out(_landlocked(_rules(tree, scope_abstract_unix=scoped), code, name))
    if scoped:
        assert out["connect"] == {"ok": False, "errno": errno.EPERM}
        assert not _pending(srv)
    else:
        assert out["connect"]["ok"] is True
        assert _pending(srv)


@pytest.mark.parametrize("scoped", [True, False])
@landlock_required
def test_signal_to_process_outside_domain_is_denied(tree: Tree, scoped: bool) -> None:
    _need_abi(6)
    helper = subprocess.Popen(["/bin/sleep", "30"])
    try:
        code = (
            "pid = int(sys.argv[3])\nprint(json.dumps({'kill': attempt(lambda: os.kill(pid, 15))}))"
        )
        out = _json_out(_landlocked(_rules(tree, scope_signal=scoped), code, str(helper.pid)))
        if scoped:
            assert out["kill"] == {"ok": False, "errno": errno.EPERM}
            time.sleep(0.1)
            assert helper.poll() is None, "the helper outside the domain was killed"
        else:
            assert out["kill"]["ok"] is True
            assert helper.wait(timeout=5) == -signal.SIGTERM
    finally:
        helper.kill()
        helper.wait(timeout=5)


@landlock_required
def test_signals_inside_the_domain_still_work(tree: Tree) -> None:
    _need_abi(6)
    code = """
import subprocess
p = subprocess.Popen(["/bin/sleep", "30"])
os.kill(p.pid, signal.SIGTERM)
print(json.dumps({"rc": p.wait()}))
"""
    assert _json_out(_landlocked(_rules(tree), code))["rc"] == -signal.SIGTERM


@landlock_required
def test_tcp_connect_restricted_when_asked(tree: Tree) -> None:
    _need_abi(4)
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        ok_port, other_port = (s.getsockname()[1] for s in servers)
        code = """
def go(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.close()
print(json.dumps({"ok": attempt(lambda: go(int(sys.argv[3]))),
                  "other": attempt(lambda: go(int(sys.argv[4])))}))
"""
        rules = _rules(tree, tcp_connect=(ok_port,))
        out = _json_out(_landlocked(rules, code, str(ok_port), str(other_port)))
        assert out["ok"]["ok"] is True
        assert out["other"] == {"ok": False, "errno": errno.EACCES}
    finally:
        for s in servers:
            s.close()


@landlock_required
def test_single_file_rule_gets_file_rights_only(tree: Tree) -> None:
    lone = tree.forbidden / "lone.txt"
    lone.write_text("before")
    code = """
print(json.dumps({"write": attempt(lambda: write(sys.argv[3], "after")),
                  "sibling": attempt(lambda: read(sys.argv[4]))}))
"""
    rules = _rules(tree, read_write=(str(tree.allowed), str(lone), "/dev/null"))
    out = _json_out(_landlocked(rules, code, str(lone), str(tree.canary)))
    assert out["write"]["ok"] is True
    assert lone.read_text() == "after"
    assert out["sibling"] == {"ok": False, "errno": errno.EACCES}


@landlock_required
def test_missing_paths_are_skipped(tree: Tree) -> None:
    rules = _rules(tree, read_only=(*SYSTEM_RO, "/nonexistent/corral", "/etc/hostname/not-a-dir"))
    out = _json_out(_landlocked(rules, "print(json.dumps({'abi': ABI}))"))
    assert out["abi"] == min(landlock_abi(), landlock.ABI_MAX)


def _main_argv(rules_json: str, *cmd: str) -> list[str]:
    return [SYS_PYTHON, "-I", "-S", str(LANDLOCK_PY), rules_json, *cmd]


@landlock_required
def test_unopenable_path_fails_closed(tree: Tree) -> None:
    loop = tree.root / "loop"
    loop.symlink_to(loop)
    rules = _rules(tree, read_write=(str(tree.allowed), str(loop)))
    proc = subprocess.run(
        _main_argv(rules.to_json(), "/bin/echo", "COMMAND-RAN"),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == landlock.EXIT_REFUSED
    assert "COMMAND-RAN" not in proc.stdout
    assert "Too many levels of symbolic links" in proc.stderr


@pytest.mark.requires_root
@landlock_required
def test_path_the_caller_cannot_open_fails_closed(tree: Tree) -> None:
    private = tree.root / "private"
    (private / "inner").mkdir(parents=True)
    private.chmod(0o700)
    tree.root.chmod(0o755)
    rules = LandlockRules(SYSTEM_RO, (str(private / "inner"),))
    proc = subprocess.run(
        _main_argv(rules.to_json(), "/bin/echo", "COMMAND-RAN"),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        user=UNPRIVILEGED,
        group=UNPRIVILEGED,
        extra_groups=[],
    )
    assert proc.returncode == landlock.EXIT_REFUSED, proc.stderr
    assert "COMMAND-RAN" not in proc.stdout
    assert "Permission denied" in proc.stderr


@landlock_required
def test_malformed_rules_fail_closed() -> None:
    proc = subprocess.run(
        _main_argv('{"read_only": ["relative"], "read_write": []}', "/bin/echo", "RAN"),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == landlock.EXIT_REFUSED
    assert "RAN" not in proc.stdout


@landlock_required
def test_domain_survives_exec(tree: Tree) -> None:
    rules = _rules(tree, read_write=(str(tree.allowed), "/dev/null"))
    proc = subprocess.run(
        _main_argv(rules.to_json(), "/bin/cat", str(tree.canary)),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode != 0
    assert SECRET not in proc.stdout
    assert "Permission denied" in proc.stderr


@landlock_required
def test_no_new_privs_is_set(tree: Tree) -> None:
    code = """
status = read("/proc/self/status")
print(json.dumps({"nnp": [l for l in status.splitlines() if l.startswith("NoNewPrivs")][0]}))
"""
    out = _json_out(_landlocked(_rules(tree, read_only=(*SYSTEM_RO, "/proc")), code))
    assert out["nnp"].split() == ["NoNewPrivs:", "1"]


@landlock_required
def test_audit_log_flag_is_accepted(tree: Tree) -> None:
    _need_abi(7)
    out = _json_out(_landlocked(_rules(tree, log_new_exec=True), "print(json.dumps({'abi': ABI}))"))
    assert out["abi"] == 7


@landlock_required
def test_module_imports_fast_and_stdlib_only() -> None:
    code = (
        # CPU time, not wall time: a loaded host delays the import without
        # making it do more work.
        "import sys, time; t = time.process_time(); sys.path.insert(0, sys.argv[1]); "
        "import landlock; dt = time.process_time() - t; "
        "heavy = ('json', 're', 'typing', 'dataclasses', 'corral'); "
        "print(dt, ' '.join(m for m in heavy if m in sys.modules))"
    )
    proc = subprocess.run(
        [SYS_PYTHON, "-I", "-S", "-c", code, str(LANDLOCK_PY.parent)],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    seconds, *heavy = proc.stdout.split()
    assert heavy == []
    assert float(seconds) < 0.1  # ~4 ms of CPU measured


def _tamper_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """Rewrite `path` in place with `data` (same length), mtime put back."""
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("tamper", ["in-place", "replaced", "chmod", "sidecar"])
@pytest.mark.requires_seccomp
def test_changed_cache_file_is_checked_again(tmp_path: Path, tamper: str) -> None:
    """The process keeps the program it read; a change to either file after that
    (even one that keeps size and mtime) sends the next call back to the checks."""
    good = seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path)
    path = Path(seccomp.cache_path(seccomp.DEFAULT_PROFILE, tmp_path))
    sidecar = Path(str(path) + ".sha256")
    # A different, valid program of the same length: its first instruction a RET ALLOW.
    forged = bytes.fromhex("060000000000ff7f") + good[8:]
    if tamper == "in-place":
        path.chmod(0o664)
        _tamper_keeping_size_and_mtime(path, forged)
    elif tamper == "replaced":
        other = tmp_path / "other"
        other.write_bytes(good[:-8] + bytes.fromhex("060000000000ff7f"))
        other.chmod(0o664)
        os.replace(other, path)
    elif tamper == "chmod":
        path.chmod(0o666)
    else:
        _tamper_keeping_size_and_mtime(sidecar, b"0" * len(sidecar.read_bytes()))
    assert seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path) == good
    assert path.read_bytes() == good
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert sidecar.read_bytes() == hashlib.sha256(good).hexdigest().encode()


@pytest.mark.requires_seccomp
def test_unchanged_cache_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path)

    def no_read(path: str, *, validate: bool = True) -> bytes | None:
        raise AssertionError("an unchanged cache file was read and checked again")

    monkeypatch.setattr(seccomp, "_read_trusted", no_read)
    monkeypatch.setattr(seccomp, "validate_bpf", no_read)
    again = seccomp.cached_bpf(seccomp.DEFAULT_PROFILE, tmp_path)
    assert again is first
    os.close(seccomp.bpf_fd(again))
