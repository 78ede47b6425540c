"""Helpers every probe program starts with (source text run inside the sandbox).

The runner runs `python3 -I -S -c PROGRAM MARKER` where PROGRAM is
`P = json.loads(...)` (the run's parameters: paths, ports, pids; never a
secret), this prelude, then the probe's own code (stdlib only). The prelude
prints CORRAL-START first (the host's proof that the probe started) and defines:

- MARKER (this run's marker, also in argv so the host can find descendants), CANARY;
- result(ok, **detail): the structured report ("CORRAL-RESULT {json}");
- ready(): tells the host the probe reached the point where it acts on it;
- read(path), show(label, text): read files and print only canary lines;
- sysc(name, *args) -> (ret, errno): raw syscalls by name (x86_64, aarch64);
- tcp/udp/unix/http/ping helpers, proxy() (from the environment, ignoring no_proxy);
- tls_tunnel_secret(label, sni): B's secret asked inside a TLS tunnel to A (M3 probes);
- sleeper(secs): argv of a marker-carrying sleeping process; detach(argv);
- host_sockets(globs, needles): where corral's host sockets would be if the
  sandbox could reach them (`globs` under the runtime bases a host process uses,
  plus /proc/net/unix paths containing one of `needles`);
- own_launcher(h) / stop_launcher(own, sock): a corral launcher started as the
  front end's fallback would (`h`: the probe's interpreter, source root and
  boot code), for probes that attack one on the bare host;
- SLOW: the backend's time scale (`Backend.time_scale`): a probe that races a
  wall-clock limit scales its waits by it, as the limit itself is scaled.
"""

from __future__ import annotations

__all__ = ["PRELUDE"]

PRELUDE = r'''
import ctypes, errno, json, os, socket, struct, sys, time
MARKER = sys.argv[1]
sys.stdout.write("CORRAL-START\n")
sys.stdout.flush()
CANARY = "CORRALCANARY"
PY = sys.executable or "/usr/bin/python3"
SLOW = float(P.get("slow", 1))


def own_launcher(h):
    """(process, socket path) of a launcher this probe starts; (None, path) when it cannot."""
    import subprocess
    d = "/tmp/corral-%d/launcher" % os.getuid()
    sock = d + "/probe-" + MARKER + ".sock"
    try:
        os.makedirs(d, 0o700, exist_ok=True)
        return subprocess.Popen([h["python"], "-I", "-c", h["boot"], h["src"], "--socket",
                                 sock, "--idle-s", "10"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd="/"), sock
    except OSError as e:
        print("start launcher:", errname(e.errno))
        return None, sock


def stop_launcher(own, sock):
    if own is not None:
        own.terminate()
        own.wait()
    try:
        os.unlink(sock + ".lock")
    except OSError:
        pass


def result(ok, **kw):
    kw["ok"] = bool(ok)
    sys.stdout.write("CORRAL-RESULT " + json.dumps(kw, default=str) + "\n")
    sys.stdout.flush()


def ready():
    sys.stdout.write("CORRAL-READY\n")
    sys.stdout.flush()


def errname(e):
    return errno.errorcode.get(e, str(e)) if isinstance(e, int) else type(e).__name__


def read(path, n=65536):
    try:
        with open(path, "rb") as f:
            data = f.read(n)
    except OSError as e:
        return "ERR " + errname(e.errno or 0)
    return data.decode("utf-8", "replace")


def canary_lines(text):
    return [l for l in text.replace("\0", "\n").splitlines() if CANARY in l]


def show(label, text):
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = canary_lines(text)
    if lines:
        print(label + ": " + " | ".join(lines)[:3000], flush=True)
    elif text.startswith("ERR "):
        print(label + ": " + text[:100], flush=True)
    else:
        print(label + ": %d bytes, no canary" % len(text), flush=True)
    return bool(lines)


_NR = {
    "x86_64": dict(
        ptrace=101, process_vm_readv=310, io_uring_setup=425, bpf=321, perf_event_open=298,
        userfaultfd=323, keyctl=250, add_key=248, request_key=249, mount=165, umount2=166,
        pivot_root=155, unshare=272, setns=308, init_module=175, finit_module=313,
        delete_module=176, kexec_load=246, kexec_file_load=320, fsopen=430, open_tree=428,
        pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424, name_to_handle_at=303,
        open_by_handle_at=304, syslog=103, ioperm=173, iopl=172, chroot=161,
        sethostname=170, setdomainname=171, clone=56, acct=163, swapoff=168),
    "aarch64": dict(
        ptrace=117, process_vm_readv=270, io_uring_setup=425, bpf=280, perf_event_open=241,
        userfaultfd=282, keyctl=219, add_key=217, request_key=218, mount=40, umount2=39,
        pivot_root=41, unshare=97, setns=268, init_module=105, finit_module=273,
        delete_module=106, kexec_load=104, kexec_file_load=294, fsopen=430, open_tree=428,
        pidfd_open=434, pidfd_getfd=438, pidfd_send_signal=424, name_to_handle_at=264,
        open_by_handle_at=265, syslog=116, chroot=51, sethostname=161, setdomainname=162,
        clone=220, acct=89, swapoff=225),
}
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _arg(a):
    if a is None:
        return ctypes.c_void_p(None)
    if isinstance(a, int):
        return ctypes.c_long(a)
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    return a


def sysc(name, *args):
    nr = _NR.get(os.uname().machine, {}).get(name)
    if nr is None:
        return -1, errno.ENOSYS
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return r, (ctypes.get_errno() if r < 0 else 0)


def sys_result(name, r, e, ok=None, **kw):
    if ok is None:
        ok = r >= 0
    result(ok, syscall=name, ret=r, errno=errname(e) if e else None, **kw)


def tcp(host, port, payload=b"", timeout=3.0, family=None):
    """Connect, send, read until EOF/timeout. Returns (reply bytes or None, error)."""
    try:
        if family is None:
            s = socket.create_connection((host, port), timeout=timeout)
        else:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect((host, port))
    except OSError as e:
        return None, errname(e.errno or 0) if e.errno else type(e).__name__
    try:
        if payload:
            s.sendall(payload)
        chunks = []
        while True:
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            chunks.append(d)
        return b"".join(chunks), None
    except OSError as e:
        return b"", errname(e.errno or 0)
    finally:
        s.close()


def b_req(host_header="127.0.0.1"):
    """A GET for canary B's secret, the marker in the path."""
    return http_req("/secret/" + MARKER, host_header)


def http_req(path, host_header, extra=b"", method="GET", body=b"", version="1.1"):
    head = "%s %s HTTP/%s\r\nHost: %s\r\nConnection: close\r\nX-Corral-Marker: %s\r\n" % (
        method, path, version, host_header, MARKER)
    if body:
        head += "Content-Length: %d\r\n" % len(body)
    return head.encode() + extra + b"\r\n" + body


def proxy():
    """(host, port, auth header bytes) of the proxy the environment names, or None."""
    for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        v = os.environ.get(k)
        if not v or not v.startswith("http"):
            continue
        from urllib.parse import unquote, urlsplit
        u = urlsplit(v)
        auth = b""
        if u.username is not None:
            import base64
            cred = ("%s:%s" % (unquote(u.username), unquote(u.password or ""))).encode()
            auth = b"Proxy-Authorization: Basic " + base64.b64encode(cred) + b"\r\n"
        return u.hostname, u.port or 80, auth
    return None


def broker_addr():
    """(host, port) of the broker: the environment's proxy (the gVisor backend puts it on
    its veth link, not on 127.0.0.1), else the sandbox's usual 127.0.0.1:3128."""
    px = proxy()
    return (px[0], px[1]) if px else ("127.0.0.1", 3128)


def via_proxy_or_direct(host, port, path, extra=b"", method="GET", body=b"", host_header=None):
    """Send an HTTP request for http://host:port/path through the environment's
    proxy if there is one (absolute form), else straight to the target."""
    hh = host_header or ("[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port))
    px = proxy()
    if px:
        url = "http://%s%s" % (hh, path)
        return tcp(px[0], px[1], http_req(url, hh, extra + px[2], method, body))
    return tcp(host, port, http_req(path, hh, extra, method, body))


def connect_tunnel(host, port, inner):
    """CONNECT host:port through the proxy (or connect directly) and send `inner`."""
    px = proxy()
    if not px:
        return tcp(host, port, inner)
    try:
        s = socket.create_connection((px[0], px[1]), timeout=3)
        s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n" % (host, port, host, port)).encode()
                  + px[2] + b"\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            d = s.recv(4096)
            if not d:
                break
            head += d
        status = head.split(b"\r\n", 1)[0]
        if b" 200" not in status:
            s.close()
            return head, "CONNECT refused: " + status.decode("latin-1")[:80]
        s.sendall(inner)
        chunks = []
        s.settimeout(3)
        while True:
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            chunks.append(d)
        s.close()
        return head + b"".join(chunks), None
    except OSError as e:
        return None, errname(e.errno or 0)


def tls_tunnel_secret(label, sni=None):
    """Through a CONNECT tunnel to http_a, a TLS session (server name `sni`, unverified,
    if given; else http_a's, verified) asking for B's secret by its Host header. Bare
    host: straight to B."""
    import ssl
    px = proxy()
    b = "127.0.0.1:%d" % P["http_b_port"]
    if not px:
        r, e = tcp("127.0.0.1", P["http_b_port"], b_req(b))
        net_report(label, r, e)
        return
    try:
        s = socket.create_connection((px[0], px[1]), timeout=5)
        s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (
            P["http_a_host"], P["http_a_port"], P["http_a_host"], P["http_a_port"])).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            if not chunk:
                break
            head += chunk
        ctx = ssl.create_default_context()
        if sni is not None:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        t = ctx.wrap_socket(s, server_hostname=sni or P["http_a_host"])
        t.sendall(("GET /secret/%s HTTP/1.1\r\nHost: %s\r\n"
                   "Connection: close\r\n\r\n" % (MARKER, b)).encode())
        r = b""
        while True:
            chunk = t.recv(65536)
            if not chunk:
                break
            r += chunk
        net_report(label, r, None)
    except (OSError, ssl.SSLError) as e:
        net_report(label, None, e)


def udp(host, port, payload, family=socket.AF_INET, timeout=1.5):
    try:
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(timeout)
        s.sendto(payload, (host, port))
    except OSError as e:
        return None, errname(e.errno or 0)
    try:
        return s.recv(65536), None
    except OSError as e:
        return None, "sent; " + (errname(e.errno) if e.errno else "no reply")
    finally:
        s.close()


def host_sockets(globs, needles):
    import glob
    cands = set()
    bases = ["/tmp", "/run", os.environ.get("XDG_RUNTIME_DIR") or "/tmp"]
    for base in bases + glob.glob("/run/user/*"):
        for g in globs:
            cands.update(glob.glob(base + g))
    try:
        with open("/proc/net/unix") as fh:
            for line in fh:
                f = line.split()
                if len(f) >= 8 and any(n in f[-1] for n in needles):
                    cands.add(f[-1])
    except OSError:
        pass
    return cands


def unix(addr, payload):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(addr)
        s.sendall(payload)
        data = s.recv(65536)
        s.close()
        return data, None
    except OSError as e:
        return None, errname(e.errno or 0) if e.errno else type(e).__name__


def dns_query(name, qtype=1):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for part in name.rstrip(".").split("."):
        q += bytes([len(part)]) + part.encode()
    return q + b"\0" + struct.pack(">HH", qtype, 1)


def icmp_csum(b):
    b += b"\0" * (len(b) % 2)
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF


def ping(addr, raw=None):
    """Send one ICMP echo with the marker as payload: ping socket (raw=False),
    raw socket (raw=True) or whichever works (None). Returns (ok, error)."""
    body = MARKER.encode()
    err = None
    for use_raw in ((False, True) if raw is None else (raw,)):
        try:
            if use_raw:
                s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
                pkt = struct.pack("!BBHHH", 8, 0, 0, 0x4242, 1) + body
                pkt = struct.pack("!BBHHH", 8, 0, icmp_csum(pkt), 0x4242, 1) + body
            else:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
                pkt = struct.pack("!BBHHH", 8, 0, 0, 0, 1) + body
            s.settimeout(1.5)
            s.sendto(pkt, (addr, 0))
            try:
                s.recv(1024)
            except OSError:
                pass
            return True, None
        except OSError as e:
            err = errname(e.errno) if e.errno else str(e)
    return False, err


def net_report(label, reply, err):
    text = (reply or b"").decode("latin-1")
    got = CANARY in text
    show(label, text if reply is not None else "ERR " + str(err))
    ok = reply is not None and (got or bool(reply))
    result(ok, error=err, bytes=len(reply or b""), canary=got)


def sleeper(secs=30):
    code = "import time,sys; time.sleep(float(sys.argv[1]))"
    return [PY, "-I", "-S", "-c", code, str(secs), MARKER]


def detach(argv, new_session=True):
    """Start argv as a daemon (double fork, optional setsid, stdio on /dev/null)."""
    pid = os.fork()
    if pid == 0:
        try:
            if new_session:
                os.setsid()
            if os.fork() != 0:
                os._exit(0)
            fd = os.open("/dev/null", os.O_RDWR)
            for n in (0, 1, 2):
                os.dup2(fd, n)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
'''
