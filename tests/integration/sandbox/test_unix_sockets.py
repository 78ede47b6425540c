"""M3: no host unix socket is reachable, wherever it lives in the sandbox's view.

A host process listens on a pathname socket inside the workspace, a `--ro`
tree and a `--rw` tree (a read-only bind does not stop `connect()`); the
sandbox attacks it by every spelling it can produce. The oracle is the host
listener's own accept/receive count. The sandbox's own sockets, bound in the
workspace, keep working (U8), and `--allow-unix` admits exactly one inode.
"""

from __future__ import annotations

import errno
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sandbox.namespace import NamespaceSandbox
from corral.sandbox.spec import SandboxSpec

from .conftest import ExecFn, wait_for

pytestmark = [pytest.mark.requires_sandbox]


class HostListener:
    """A host unix socket that counts every connection (stream) or datagram it gets."""

    def __init__(self, path: Path, kind: int = socket.SOCK_STREAM) -> None:
        self.path = path
        self.hits = 0
        self._sock = socket.socket(socket.AF_UNIX, kind)
        self._sock.bind(str(path))
        # Writable by anyone, so only corral stands between the sandbox and it.
        path.chmod(0o777)
        if kind == socket.SOCK_STREAM:
            self._sock.listen(64)
        self._sock.settimeout(0.05)
        self._kind = kind
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                if self._kind == socket.SOCK_STREAM:
                    conn, _ = self._sock.accept()
                    conn.close()
                else:
                    self._sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            self.hits += 1

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self._sock.close()


@pytest.fixture
def listeners() -> Iterator[list[HostListener]]:
    made: list[HostListener] = []
    yield made
    for lst in made:
        lst.close()


_ATTACK = r"""
import errno, json, os, socket, sys
out = {}
def tr(name, path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
target = sys.argv[1]
d = os.path.dirname(target)
tr("direct", target)
os.chdir(d)
tr("relative", os.path.basename(target))
tr("dotdot", "../" + os.path.basename(d) + "/" + os.path.basename(target))
tr("proc-cwd", "/proc/self/cwd/" + os.path.basename(target))
tr("proc-root", "/proc/self/root" + target)
ws = os.environ["WS"]
try:
    os.symlink(target, ws + "/link.sock")
except OSError:
    pass
tr("symlink", ws + "/link.sock")
try:
    os.link(target, ws + "/hard.sock")
    tr("hardlink", ws + "/hard.sock")
except OSError as e:
    out["hardlink"] = "link:" + errno.errorcode.get(e.errno, "?")
print(json.dumps(out))
"""


def _attack(corral_exec: ExecFn, workspace: Path, target: Path, *opts: str) -> dict[str, str]:
    out = corral_exec(
        "python3",
        "-c",
        _ATTACK,
        str(target),
        opts=(*opts, "--setenv", f"WS={workspace}"),
    )
    assert out.code == 0, out.stderr
    result: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("where", ["workspace", "ro", "rw"])
def test_host_listener_in_a_mounted_tree_is_unreachable(
    corral_exec: ExecFn,
    workspace: Path,
    tmp_path: Path,
    listeners: list[HostListener],
    where: str,
) -> None:
    opts: tuple[str, ...] = ()
    tree = workspace
    if where != "workspace":
        tree = tmp_path / where
        tree.mkdir()
        opts = (f"--{where}", str(tree))
    host = HostListener(tree / "app.sock")
    listeners.append(host)
    result = _attack(corral_exec, workspace, host.path, *opts)
    assert host.hits == 0, result
    assert "ok" not in result.values(), result
    assert result["direct"] == "EACCES"


def test_host_datagram_socket_receives_nothing(
    corral_exec: ExecFn, workspace: Path, listeners: list[HostListener]
) -> None:
    host = HostListener(workspace / "log.sock", socket.SOCK_DGRAM)
    listeners.append(host)
    code = r"""
import errno, json, socket, sys
out = {}
for name, kind in (("dgram", socket.SOCK_DGRAM), ("raw", socket.SOCK_RAW),
                   ("dgram-nb", socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)):
    try:
        s = socket.socket(socket.AF_UNIX, kind)
        s.sendto(b"x", sys.argv[1]); out[name] = "sent"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, "?")
    try:
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        a.sendto(b"x", sys.argv[1]); out["pair-" + name] = "sent"
    except OSError as e:
        out["pair-" + name] = errno.errorcode.get(e.errno, "?")
for name, kind in (("stream", socket.SOCK_STREAM), ("seqpacket", socket.SOCK_SEQPACKET)):
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.sendto(b"x", sys.argv[1]); out[name] = "sent"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, "?")
print(json.dumps(out))
"""
    out = corral_exec("python3", "-c", code, str(host.path))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    time.sleep(0.2)
    assert host.hits == 0, result
    assert "sent" not in result.values(), result
    assert result["dgram"] == "EPERM" and result["pair-raw"] == "EPERM"


def test_sandbox_own_sockets_and_loopback_tcp_still_work(
    corral_exec: ExecFn, workspace: Path
) -> None:
    code = r"""
import errno, json, os, socket
out = {}
keep = []
for name, path, kind in (("ws-stream", "own.sock", socket.SOCK_STREAM),
                         ("tmp-seqpacket", "/tmp/own2.sock", socket.SOCK_SEQPACKET)):
    srv = socket.socket(socket.AF_UNIX, kind); srv.bind(path); srv.listen(4); keep.append(srv)
    c = socket.socket(socket.AF_UNIX, kind); c.connect(path)
    a, _ = srv.accept(); c.sendall(b"ping"); out[name] = a.recv(4).decode()
    nb = socket.socket(socket.AF_UNIX, kind); nb.setblocking(False)
    nb.connect(os.path.abspath(path)); out[name + "-nonblocking"] = "ok"
os.mkdir("sub"); os.chdir("sub")
c = socket.socket(socket.AF_UNIX); c.connect("../own.sock"); out["dotdot"] = "ok"
os.chdir("..")
a, b = socket.socketpair(); a.sendall(b"pair"); out["socketpair"] = b.recv(4).decode()
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen(1)
c = socket.create_connection(t.getsockname()); out["tcp"] = "ok"
n = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); n.connect((0, 0)); out["netlink"] = "ok"
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).connect((0, 1)); out["nl-groups"] = "ok"
except OSError as e:
    out["nl-groups"] = errno.errorcode[e.errno]
os.unlink("own.sock")
print(json.dumps(out))
"""
    out = corral_exec("python3", "-c", code)
    assert out.code == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "ws-stream": "ping",
        "ws-stream-nonblocking": "ok",
        "tmp-seqpacket": "ping",
        "tmp-seqpacket-nonblocking": "ok",
        "dotdot": "ok",
        "socketpair": "pair",
        "tcp": "ok",
        "netlink": "ok",
        "nl-groups": "EPERM",
    }


def test_allow_unix_admits_exactly_that_socket_and_journals_it(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path, listeners: list[HostListener]
) -> None:
    granted = HostListener(workspace / "granted.sock")
    other = HostListener(workspace / "other.sock")
    listeners += [granted, other]
    journal = tmp_path / "j.sqlite"
    code = r"""
import errno, socket, sys
for p in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p); print(p, "ok")
    except OSError as e:
        print(p, errno.errorcode[e.errno])
"""
    out = corral_exec(
        "python3",
        "-c",
        code,
        str(granted.path),
        str(other.path),
        opts=("--allow-unix", str(granted.path), "--journal", str(journal)),
    )
    assert out.code == 0, out.stderr
    assert f"{granted.path} ok" in out.stdout
    assert f"{other.path} EACCES" in out.stdout
    assert wait_for(lambda: granted.hits == 1, 5)
    assert other.hits == 0
    rows = sqlite3.connect(journal).execute(
        "SELECT target, decision, rule FROM observations WHERE kind = 'unix_connect'"
    )
    assert sorted(rows) == [
        (f"unix:{granted.path}", "allow", f"allow-unix {granted.path}"),
        (f"unix:{other.path}", "deny", "host-socket"),
    ]


def test_allow_unix_refuses_a_path_the_sandbox_cannot_see(
    corral_exec: ExecFn, tmp_path: Path, listeners: list[HostListener]
) -> None:
    outside = HostListener(tmp_path / "outside.sock")
    listeners.append(outside)
    out = corral_exec("true", opts=("--allow-unix", str(outside.path)))
    assert out.code == 2
    assert "not inside the workspace" in out.stderr


_RACE = r"""
import ctypes, errno, os, socket, struct, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
host, own = sys.argv[1].encode(), sys.argv[2].encode()
srv = socket.socket(socket.AF_UNIX); srv.bind(own); srv.listen(4096)
def addr(p):
    return struct.pack("<H", socket.AF_UNIX) + p + b"\0" * (108 - len(p))
A, B = addr(own), addr(host)
buf = ctypes.create_string_buffer(A, 110)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, B, 110)
        ctypes.memmove(buf, A, 110)
spare = [socket.socket(socket.AF_UNIX) for _ in range(2)]
def swap():
    while not stop:
        for s in spare:
            os.dup2(s.fileno(), 100)
threading.Thread(target=flip, daemon=True).start()
threading.Thread(target=swap, daemon=True).start()
ok = 0
for i in range(int(sys.argv[3])):
    s = socket.socket(socket.AF_UNIX)
    os.dup2(s.fileno(), 100)
    if libc.connect(100, buf, 110) == 0:
        ok += 1
        srv.accept()[0].close()
    s.close()
stop = True
ok1, ok = ok, 0
# Phase 2: the name itself flips between the sandbox's socket and a symlink to the host's.
stop = False
def rename():
    while not stop:
        for tmp, make, src in (("t1", os.symlink, host), ("t2", os.link, own)):
            try:
                make(src, tmp)
                os.replace(tmp, "flip.sock")
            except OSError:
                pass
threading.Thread(target=rename, daemon=True).start()
for i in range(int(sys.argv[3])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("flip.sock")
        ok += 1
        srv.accept()[0].close()
    except OSError:
        pass
    s.close()
stop = True
print("OK", ok1, ok)
"""


def test_racing_address_and_fd_swaps_never_reach_the_host(
    corral_exec: ExecFn, workspace: Path, listeners: list[HostListener]
) -> None:
    host = HostListener(workspace / "victim.sock")
    listeners.append(host)
    out = corral_exec(
        "python3", "-c", _RACE, str(host.path), str(workspace / "own.sock"), "1500", timeout=120
    )
    assert out.code == 0, out.stderr
    ok_address, ok_rename = map(int, out.stdout.split("OK", 1)[1].split())
    # The races really ran: some connects reached the sandbox's own listener.
    assert ok_address > 0 and ok_rename > 0, out.stdout
    time.sleep(0.2)
    assert host.hits == 0


def test_listener_fd_never_reaches_the_sandbox(corral_exec: ExecFn) -> None:
    code = (
        "import os\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    d = f'/proc/{pid}/fd'\n"
        "    for fd in os.listdir(d) if os.access(d, os.R_OK) else []:\n"
        "        try: print(pid, fd, os.readlink(f'{d}/{fd}'))\n"
        "        except OSError: pass\n"
    )
    out = corral_exec("python3", "-c", code)
    assert out.code == 0, out.stderr
    assert "seccomp" not in out.stdout
    assert out.stdout.strip()


def test_supervisor_gone_fails_connects_closed(workspace: Path, tmp_path: Path) -> None:
    host = HostListener(workspace / "app.sock")
    go = workspace / "go"
    code = (
        "import errno, os, socket, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "res = []\n"
        f"for p in ({str(host.path)!r}, 'own.sock'):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    if p == 'own.sock':\n"
        "        srv = socket.socket(socket.AF_UNIX); srv.bind(p); srv.listen(1)\n"
        "    try:\n"
        "        s.connect(p); res.append('ok')\n"
        "    except OSError as e:\n"
        "        res.append(errno.errorcode[e.errno])\n"
        "open('result', 'w').write(' '.join(res))\n"
    )
    spec = SandboxSpec(
        argv=("python3", "-c", code),
        workspace=str(workspace),
        env=(("PATH", "/usr/bin:/bin"),),
    )
    running = NamespaceSandbox(spec).start()
    try:
        assert running.unix_supervisor is not None
        running.unix_supervisor.close()
        go.write_text("")
        result = running.wait(60)
    finally:
        running.close()
        host.close()
    assert result.exit == 0
    got = (workspace / "result").read_text().split()
    assert got == [errno.errorcode[errno.ENOSYS]] * 2
    assert host.hits == 0


_BLOCKING = r"""
import os, socket, threading
NR_CONNECT = {"x86_64": 42, "aarch64": 203}[os.uname().machine]
full = socket.socket(socket.AF_UNIX); full.bind("full.sock"); full.listen(0)
first = socket.socket(socket.AF_UNIX); first.connect("full.sock")  # fills the backlog
other = socket.socket(socket.AF_UNIX); other.bind("other.sock"); other.listen(1)
res = {}
tid = []
def blocked():
    tid.append(threading.get_native_id())
    s = socket.socket(socket.AF_UNIX)
    s.connect("full.sock")  # blocks until the backlog drains
    res["blocked"] = "ok"
t = threading.Thread(target=blocked); t.start()
while not tid:
    pass
for _ in range(10**6):
    with open(f"/proc/self/task/{tid[0]}/syscall") as fh:
        if fh.read().split()[0] == str(NR_CONNECT):
            break
else:
    raise SystemExit("the thread never entered connect()")
c = socket.socket(socket.AF_UNIX); c.connect("other.sock")
res["other-while-blocked"] = "blocked" not in res
full.accept()
t.join(30)
print(res)
"""


def test_blocking_connect_in_a_thread_does_not_stall_other_connects(corral_exec: ExecFn) -> None:
    out = corral_exec("python3", "-c", _BLOCKING, timeout=60)
    assert out.code == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "{'other-while-blocked': True, 'blocked': 'ok'}"


def test_missing_supervisor_refuses_unless_degraded(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.errors import LayerUnavailableError
    from corral.sandbox import unix_supervisor

    monkeypatch.setattr(unix_supervisor, "unavailable_reason", lambda: "no user notification")
    spec = SandboxSpec(argv=("true",), workspace=str(workspace), env=(("PATH", "/usr/bin"),))
    with pytest.raises(LayerUnavailableError) as info:
        NamespaceSandbox(spec).start()
    assert info.value.layer == "unix"
    degraded = SandboxSpec(
        argv=("true",),
        workspace=str(workspace),
        env=(("PATH", "/usr/bin"),),
        allow_degraded=frozenset({"unix"}),
    )
    running = NamespaceSandbox(degraded).start()
    try:
        result = running.wait(60)
    finally:
        running.close()
    assert result.exit == 0
    assert str(result.layers["unix"]).startswith("degraded")
    assert running.unix_supervisor is None


_OWN_LISTENER = r"""
import ctypes, errno, os, socket, struct, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": (317, 42), "aarch64": (277, 203)}[os.uname().machine]
prog = b"".join(struct.pack("<HBBI", *i) for i in (
    (0x20, 0, 0, 0), (0x15, 0, 1, NR[1]), (0x06, 0, 0, 0x7FC00000), (0x06, 0, 0, 0x7FFF0000)))
buf = ctypes.create_string_buffer(prog, len(prog))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fp = Fprog(len(prog) // 8, ctypes.addressof(buf))
fd = libc.syscall(ctypes.c_long(NR[0]), ctypes.c_long(1), ctypes.c_long(8),
                  ctypes.c_void_p(ctypes.addressof(fp)))
print("install", "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()])
if fd >= 0:
    def answer():
        # Answer every notification with SECCOMP_USER_NOTIF_FLAG_CONTINUE.
        while True:
            n = ctypes.create_string_buffer(80)
            if libc.ioctl(fd, ctypes.c_ulong(0xC0502100), n) != 0:
                continue
            nid = struct.unpack_from("<Q", n.raw)[0]
            resp = ctypes.create_string_buffer(struct.pack("<QqiI", nid, 0, 0, 1), 24)
            libc.ioctl(fd, ctypes.c_ulong(0xC0182101), resp)
    threading.Thread(target=answer, daemon=True).start()
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1]); print("connect ok")
except OSError as e:
    print("connect", errno.errorcode[e.errno])
"""


def test_sandbox_cannot_install_its_own_listener_to_pass_connects(
    corral_exec: ExecFn, workspace: Path, listeners: list[HostListener]
) -> None:
    host = HostListener(workspace / "app.sock")
    listeners.append(host)
    out = corral_exec("python3", "-c", _OWN_LISTENER, str(host.path))
    assert out.code == 0, out.stderr
    assert "install EBUSY" in out.stdout
    assert "connect EACCES" in out.stdout
    time.sleep(0.2)
    assert host.hits == 0


def test_grant_is_pinned_to_the_inode_seen_at_start(workspace: Path) -> None:
    path = workspace / "svc.sock"
    first = HostListener(path)
    go, ready = workspace / "go", workspace / "ready"
    code = (
        "import errno, os, socket, time\n"
        "def tr():\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        f"        s.connect({str(path)!r}); return 'ok'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        "before = tr()\n"
        f"open({str(ready)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "open('result', 'w').write(before + ' ' + tr())\n"
    )
    spec = SandboxSpec(
        argv=("python3", "-c", code),
        workspace=str(workspace),
        env=(("PATH", "/usr/bin:/bin"),),
        allow_unix=(str(path),),
    )
    running = NamespaceSandbox(spec).start()
    second: HostListener | None = None
    try:
        assert wait_for(ready.exists, 30)
        # The service restarts: same path, new inode.
        first.close()
        path.unlink()
        second = HostListener(path)
        go.write_text("")
        result = running.wait(60)
    finally:
        running.close()
        first.close()
        if second is not None:
            second.close()
    assert result.exit == 0
    assert (workspace / "result").read_text() == "ok EACCES"
    assert first.hits == 1
    assert second is not None and second.hits == 0


def test_own_socket_with_a_hostile_name_works_and_is_journaled(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    code = (
        "import errno, os, socket\n"
        f"p = os.fsencode({str(workspace)!r}) + b'/\\xff\\x1b[31mx.sock'\n"
        "l = socket.socket(socket.AF_UNIX); l.bind(p); l.listen(1)\n"
        "c = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    c.connect(p); print('ok')\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
    )
    out = corral_exec("python3", "-c", code, opts=("--journal", str(journal)))
    assert out.stdout.strip() == "ok", out.stderr
    rows = list(
        sqlite3.connect(journal).execute(
            "SELECT target, decision, rule FROM observations WHERE kind = 'unix_connect'"
        )
    )
    assert rows == [(f"unix:{workspace}/\\xff\x1b[31mx.sock", "allow", "inside")]
