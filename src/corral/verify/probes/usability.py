"""Usability (U1-U9): what must keep working inside the sandbox.

Each check makes a tool transform the host's nonce (reverse it, upper-case
it, serve it back) so the oracle knows the tool really ran; network checks
also need the host canary to have seen the request.
"""

from __future__ import annotations

from corral.verify.model import Need, PathExists, Probe, ProbeLimits, WriteFile
from corral.verify.oracles import (
    AllOf,
    Fact,
    HitLogged,
    MemoryAbove,
    NonceEcho,
    Oracle,
    ProcsAbove,
    Reported,
    SecretSeen,
)
from corral.verify.probes._dsl import MCP_CLIENT, MCP_ROUTE, code
from corral.verify.probes._mission import U9_PROBES

__all__ = ["PROBES"]

_PLAIN = NonceEcho("plain")
_REV = NonceEcho("rev")
_UPPER = NonceEcho("upper")
_A = AllOf((HitLogged(("http_a",)), SecretSeen(("http_a_token",))))
_ALLOW_A = ("{http_a_host}:{http_a_port}",)
_BROKER: frozenset[Need] = frozenset({"broker"})

_RUN = """
import subprocess
def run(argv, **kw):
    env = dict(os.environ, GIT_AUTHOR_NAME="v", GIT_AUTHOR_EMAIL="v@v", GIT_COMMITTER_NAME="v",
               GIT_COMMITTER_EMAIL="v@v")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env, **kw)
    print(p.stdout.strip())
    if p.returncode:
        print("rc", p.returncode, p.stderr.strip()[-300:])
    return p
"""


def _use(
    pid: str,
    req: str,
    desc: str,
    body: str,
    oracle: Oracle,
    *,
    limits: ProbeLimits | None = None,
    allow: tuple[str, ...] = (),
    needs: frozenset[Need] = frozenset(),
    serial: bool = False,
    sample: bool = False,
) -> Probe:
    return Probe(
        pid,
        "usability",
        req,
        desc,
        code(_RUN + code(body)),
        oracle,
        expected="allowed",
        limits=limits or ProbeLimits(),
        allow=allow,
        needs=needs,
        serial=serial,
        sample=sample,
        deadline_s=60.0,
    )


def _workspace() -> list[Probe]:
    return [
        Probe(
            "use-ws-write",
            "usability",
            "U1",
            "create a file in the workspace (seen on the host)",
            code("""
              with open(P["ws"] + "/u-" + MARKER, "w") as f:
                  f.write(P["nonce"])
              """),
            Fact("created", "the file appeared in the host's workspace"),
            expected="allowed",
            checks=(PathExists("created", "{ws}/u-{marker}"),),
        ),
        Probe(
            "use-ws-read",
            "usability",
            "U1",
            "read a file the host put in the workspace",
            code('print(read(P["ws"] + "/input.txt"))'),
            _PLAIN,
            expected="allowed",
            steps=(WriteFile("{ws}/input.txt", "{nonce}"),),
        ),
        _use(
            "use-ws-exec",
            "U1",
            "execute a script written into the workspace",
            """
             path = P["ws"] + "/run.sh"
             with open(path, "w") as f:
                 f.write("#!/bin/sh\\necho \\"$1\\" | tr a-f A-F\\n")
             os.chmod(path, 0o755)
             run([path, P["nonce"]])
             """,
            _UPPER,
        ),
        _use(
            "use-tmp",
            "U1",
            "write and read back a temporary file ($TMPDIR, else /tmp)",
            """
             import tempfile
             path = os.path.join(tempfile.gettempdir(), "u-" + MARKER)
             with open(path, "w") as f:
                 f.write(P["nonce"])
             print(read(path))
             os.unlink(path)
             """,
            _PLAIN,
        ),
        _use(
            "use-home",
            "U1",
            "write and read back a file in $HOME",
            """
             path = os.path.expanduser("~/u-" + MARKER)
             with open(path, "w") as f:
                 f.write(P["nonce"])
             print(read(path))
             os.unlink(path)
             """,
            _PLAIN,
        ),
        _use(
            "use-devices",
            "U1",
            "use /dev/null, /dev/zero and /dev/urandom",
            """
             with open("/dev/null", "w") as f:
                 f.write("x")
             assert open("/dev/zero", "rb").read(4) == b"\\0" * 4
             assert len(open("/dev/urandom", "rb").read(16)) == 16
             print(P["nonce"])
             """,
            _PLAIN,
        ),
    ]


def _tools() -> list[Probe]:
    return [
        _use(
            "use-python",
            "U2",
            "run python3 from PATH",
            """
             run(["python3", "-c", "import sys; print(sys.argv[1][::-1])", P["nonce"]])
             """,
            _REV,
        ),
        _use(
            "use-node",
            "U2",
            "run node",
            """
             js = "console.log(process.argv[1].split('').reverse().join(''))"
             run(["node", "-e", js, P["nonce"]])
             """,
            _REV,
        ),
        _use(
            "use-git",
            "U2",
            "init a repository, commit, read the log",
            """
             d = P["ws"] + "/repo"
             os.makedirs(d)
             run(["git", "init", "-q", d])
             open(d + "/f", "w").write("x")
             run(["git", "-C", d, "add", "f"])
             run(["git", "-C", d, "commit", "-q", "-m", P["nonce"].upper()])
             run(["git", "-C", d, "log", "-1", "--format=%s"])
             """,
            _UPPER,
        ),
        _use(
            "use-gcc",
            "U2",
            "compile and run a C program with gcc",
            """
             src = P["ws"] + "/rev.c"
             with open(src, "w") as f:
                 f.write('#include <stdio.h>\\n#include <string.h>\\n'
                         'int main(int c, char **v) { for (int i = strlen(v[1]); i > 0; i--) '
                         'putchar(v[1][i - 1]); putchar(10); return 0; }\\n')
             run(["gcc", "-o", P["ws"] + "/rev", src])
             run([P["ws"] + "/rev", P["nonce"]])
             """,
            _REV,
        ),
        _use(
            "use-make",
            "U2",
            "run make with a Makefile in the workspace",
            """
             with open(P["ws"] + "/Makefile", "w") as f:
                 f.write("all:\\n\\t@echo $(N) | tr a-f A-F\\n")
             run(["make", "-s", "-C", P["ws"], "N=" + P["nonce"]])
             """,
            _UPPER,
        ),
        _use(
            "use-sh-pipeline",
            "U2",
            "run a shell pipeline",
            """
             run(["sh", "-c", 'echo "$1" | tr a-f A-F | cat', "sh", P["nonce"]])
             """,
            _UPPER,
        ),
        _use(
            "use-threads",
            "U2",
            "run eight threads",
            """
             import threading
             out = []
             ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]
             [t.start() for t in ts]
             [t.join() for t in ts]
             if sorted(out) == list(range(8)):
                 print(P["nonce"])
             """,
            _PLAIN,
        ),
    ]


def _network() -> list[Probe]:
    return [
        _use(
            "use-allowlisted-http",
            "U3",
            "GET the allowlisted destination with a standard client (urllib, env proxies)",
            """
             import urllib.request
             req = urllib.request.Request("http://%s:%d/ok" % (P["http_a_host"], P["http_a_port"]),
                                          headers={"X-Corral-Marker": MARKER})
             print(urllib.request.urlopen(req, timeout=10).read().decode())
             """,
            _A,
            allow=_ALLOW_A,
            needs=_BROKER,
        ),
        _use(
            "use-provider-post",
            "U3",
            "POST a provider-style request (/v1/messages) to the allowlisted destination",
            """
             import urllib.request
             url = "http://%s:%d/v1/messages" % (P["http_a_host"], P["http_a_port"])
             req = urllib.request.Request(url,
                                          data=b'{"model": "x", "messages": []}',
                                          headers={"content-type": "application/json",
                                                   "X-Corral-Marker": MARKER})
             print(urllib.request.urlopen(req, timeout=10).read().decode())
             """,
            _A,
            allow=_ALLOW_A,
            needs=_BROKER,
        ),
        _use(
            "use-allowlisted-connect",
            "U3",
            "open a CONNECT tunnel to the allowlisted destination",
            """
             a = P["http_a_host"]
             r, e = connect_tunnel(a, P["http_a_port"], http_req("/ok", a))
             print((r or b"").decode("latin-1"), e)
             """,
            _A,
            allow=_ALLOW_A,
            needs=_BROKER,
        ),
        _use(
            "use-pip-install",
            "U4",
            "pip install a package from an allowlisted index",
            """
             run([sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir",
                  "--disable-pip-version-check",
                  "--trusted-host", P["http_a_host"], "--index-url",
                  "http://%s:%d/m/%s/simple/" % (P["http_a_host"], P["http_a_port"], MARKER),
                  "--target", P["ws"] + "/pip-target", "corral-verify-probe"])
             run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                  "import corral_verify_probe as m; print(m.TOKEN)", P["ws"] + "/pip-target"])
             """,
            _A,
            allow=_ALLOW_A,
            needs=_BROKER,
        ),
        _use(
            "use-npm-install",
            "U4",
            "npm install a package tarball from an allowlisted registry",
            """
             os.makedirs(P["ws"] + "/npm-target")
             run(["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=0",
                  "--fetch-timeout=15000",
                  "--prefix", P["ws"] + "/npm-target",
                  "http://%s:%d/m/%s/npm/corral-verify-probe-1.0.0.tgz"
                  % (P["http_a_host"], P["http_a_port"], MARKER)])
             run(["node", "-e", "console.log(require(process.argv[1]).token)",
                  P["ws"] + "/npm-target/node_modules/corral-verify-probe"])
             """,
            _A,
            allow=_ALLOW_A,
            needs=_BROKER,
        ),
        _use(
            "use-loopback-tcp",
            "U8",
            "listen and connect on the sandbox's own 127.0.0.1",
            """
             srv = socket.socket()
             srv.bind(("127.0.0.1", 0))
             srv.listen(1)
             c = socket.create_connection(srv.getsockname(), timeout=3)
             s, _ = srv.accept()
             c.sendall(P["nonce"].encode())
             print(s.recv(100).decode()[::-1])
             """,
            _REV,
        ),
        _use(
            "use-loopback-udp",
            "U8",
            "exchange a UDP datagram on the sandbox's own 127.0.0.1",
            """
             a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
             a.bind(("127.0.0.1", 0))
             b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
             b.sendto(P["nonce"].encode(), a.getsockname())
             a.settimeout(3)
             print(a.recv(100).decode())
             """,
            _PLAIN,
        ),
        _use(
            "use-loopback-ipv6",
            "U8",
            "listen and connect on the sandbox's own ::1",
            """
             srv = socket.socket(socket.AF_INET6)
             srv.bind(("::1", 0))
             srv.listen(1)
             c = socket.create_connection(srv.getsockname()[:2], timeout=3)
             s, _ = srv.accept()
             c.sendall(P["nonce"].encode())
             print(s.recv(100).decode())
             """,
            _PLAIN,
        ),
        _use(
            "use-unix-socket",
            "U8",
            "listen and connect on a unix socket in the workspace",
            """
             path = P["ws"] + "/u.sock"
             srv = socket.socket(socket.AF_UNIX)
             srv.bind(path)
             srv.listen(1)
             c = socket.socket(socket.AF_UNIX)
             c.connect(path)
             s, _ = srv.accept()
             c.sendall(P["nonce"].encode())
             print(s.recv(100).decode())
             """,
            _PLAIN,
        ),
    ]


def _limits() -> list[Probe]:
    return [
        _use(
            "use-pids",
            "U6",
            "run 40 processes at once under a 64-process limit",
            """
             # The children live until all 40 exist (a pipe, not a clock: forks
             # are slow on a loaded host or under gVisor's ptrace platform).
             r, w = os.pipe()
             kids = []
             for i in range(40):
                 pid = os.fork()
                 if pid == 0:
                     os.close(w)
                     os.read(r, 1)
                     os._exit(0)
                 kids.append(pid)
             time.sleep(1.5)
             os.close(w)
             for k in kids:
                 os.waitpid(k, 0)
             """,
            ProcsAbove(39),
            limits=ProbeLimits(pids=64),
            serial=True,
            sample=True,
        ),
        _use(
            "use-memory",
            "U7",
            "hold 160 MiB under a 256 MiB memory limit",
            """
             b = bytearray(160 << 20)
             for j in range(0, len(b), 4096):
                 b[j] = 1
             time.sleep(0.5)
             result(True, held_mib=160)
             """,
            AllOf((Reported(), MemoryAbove(120 * 2**20))),
            limits=ProbeLimits(memory="256M"),
            serial=True,
            sample=True,
        ),
        Probe(
            "use-mcp-gateway",
            "usability",
            "U5",
            "call an allowed MCP tool (demo write_marker) through the broker route and the gateway",
            MCP_CLIENT
            + code("""
              mcp_call("write_marker", {"name": MARKER, "text": P["nonce"]})
              """),
            Fact("written", "the demo MCP server wrote the probe's marker file"),
            expected="allowed",
            broker_config=MCP_ROUTE,
            checks=(PathExists("written", "{mcp_ws}/{marker}"),),
            deadline_s=40,
        ),
        *U9_PROBES,
    ]


PROBES: list[Probe] = _workspace() + _tools() + _network() + _limits()
