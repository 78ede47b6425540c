"""The resident launcher's socket, attacked from the sandbox (M2).

The compiled front end hands `corral exec` requests to a per-user launcher
over a host unix socket (README, "The fast path"). Whoever reaches it can ask
for a sandbox with any `--workspace`/`--rw` path: a write anywhere the user
can write. The probe looks for launcher sockets everywhere a sandboxed
process could (the host paths it would have, `/proc/net/unix`), and when it
finds none but can run corral's own interpreter (the bare host), starts one
there as the front end's fallback would. It then asks each for
`corral exec --workspace WS_PARENT -- touch WS_PARENT/pwned-MARKER`. Judged
on the host: that file exists after the run.
"""

from __future__ import annotations

import sys

from corral.exec import launcher
from corral.verify.model import PathExists, Probe
from corral.verify.oracles import Fact
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_HOST = {
    "python": sys.executable,
    "src": launcher.source_root(),
    "boot": launcher._BOOT,
    "build_id": launcher.BUILD_ID,
}

_CODE = f"H = {_HOST!r}\n" + code("""
    target = P["ws_parent"]
    argv = ["exec", "--workspace", target, "--", "touch", target + "/pwned-" + MARKER]
    fields = [H["build_id"], "22", "", str(len(argv))] + argv + ["PATH=/usr/bin:/bin"]
    body = b"".join(f.encode() + b"\\0" for f in fields)

    def ask(cand):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        try:
            s.connect(cand)
            cwd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
            fds = struct.pack("4i", 0, 1, 2, cwd)
            s.sendmsg([b"CRL1" + struct.pack("!I", len(body))],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            s.sendall(body)
            reply = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
            return reply[:40]
        except OSError as e:
            print("launcher", errname(e.errno))
            return None
        finally:
            s.close()

    cands = host_sockets(["/corral-*/launcher/*.sock"], ["/launcher/"])
    answered = [r for r in map(ask, sorted(cands)) if r]
    if not any(r.startswith(b"A") for r in answered) and os.access(H["python"], os.X_OK) \
            and os.path.isdir(H["src"]):
        # No launcher answered: start one as the front end's fallback would (the bare host).
        own, sock = own_launcher(H)
        try:
            for _ in range(600 if own is not None else 0):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            if own is not None:
                answered.append(ask(sock))
        finally:
            stop_launcher(own, sock)
    show("launcher replies", repr(answered))
    """)

PROBES: list[Probe] = [
    Probe(
        "files-launcher-request-from-sandbox",
        "files",
        "M2",
        "reach corral's resident launcher socket (host paths, /proc/net/unix) and ask it for "
        "a sandbox whose workspace is outside this one, to write a file there",
        _CODE,
        Fact("pwned", "a sandbox asked the launcher to write outside its workspace"),
        checks=(PathExists("pwned", "{ws_parent}/pwned-{marker}"),),
    ),
]
