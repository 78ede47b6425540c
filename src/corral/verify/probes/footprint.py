"""Footprint (M7): kernel buffers a sandbox fills count against its memory cap.

TCP and UDP queues on the sandbox's own loopback are judged from the host's
`/proc/net/sockstat` (a host-global count, whatever netns the sockets are in),
read by the host when the probe prints CORRAL-READY with its buffers full;
unix-socket and pipe buffers from the kernel's peak memory counter. Under
`--backend none` the queues grow past the cap; a corral sandbox's cgroup
charges them (v1: `memory.kmem.tcp`, split from the cap; docs/resources.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.verify.model import Evidence, Judgement, Probe, ProbeLimits
from corral.verify.oracles import MemoryAbove
from corral.verify.probes._dsl import code

__all__ = ["CAP", "PROBES", "SockGrownAbove"]

CAP = 64 * 2**20
_LIMITS = ProbeLimits(memory="64M", timeout_s=20)


@dataclass(frozen=True, slots=True)
class SockGrownAbove:
    """Allowed when host TCP+UDP buffer memory grew past `limit_bytes` during the run."""

    limit_bytes: int

    def judge(self, ev: Evidence) -> Judgement:
        grown = ev.facts.get("host_sock_grown_bytes")
        if not isinstance(grown, int):
            return Judgement("error", "host socket memory was not sampled (no CORRAL-READY?)")
        mib, cap = grown / 2**20, self.limit_bytes / 2**20
        if grown > self.limit_bytes:
            return Judgement("allowed", f"host socket memory grew {mib:.0f} MiB > cap {cap:.0f}")
        return Judgement("denied", f"host socket memory grew {mib:.0f} MiB within cap {cap:.0f}")


_HOLD = """
          print("queued MiB:", total >> 20, flush=True)
          print("CORRAL-READY", flush=True)
          time.sleep(3)
          """

_TCP = (
    """
          import socket
          keep, total = [], 0
          srv = socket.socket()
          srv.bind(("127.0.0.1", 0))
          srv.listen(256)
          for _ in range(48):
              try:
                  c = socket.socket()
                  c.connect(srv.getsockname())
                  a, _ = srv.accept()
              except OSError as e:
                  print("connect:", errname(e.errno))
                  break
              c.setblocking(False)
              keep += [c, a]
              try:
                  while True:
                      total += c.send(b"x" * 65536)
              except OSError:
                  pass
          """
    + _HOLD
)

_UDP = (
    """
          import socket
          keep, total = [], 0
          for _ in range(500):
              try:
                  r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                  r.bind(("127.0.0.1", 0))
                  s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
              except OSError as e:
                  print("socket:", errname(e.errno))
                  break
              s.setblocking(False)
              keep += [r, s]
              for _ in range(64):
                  try:
                      total += s.sendto(b"x" * 60000, r.getsockname())
                  except OSError:
                      break
          """
    + _HOLD
)

_UNIX = code("""
          import socket
          keep, total = [], 0
          for _ in range(600):
              try:
                  a, b = socket.socketpair()
              except OSError as e:
                  print("socketpair:", errname(e.errno))
                  break
              a.setblocking(False)
              keep += [a, b]
              try:
                  while True:
                      total += a.send(b"x" * 65536)
              except OSError:
                  pass
          print("queued MiB:", total >> 20, flush=True)
          time.sleep(0.3)
          """)

_PIPE = code("""
          import fcntl
          keep, total = [], 0
          for _ in range(128):
              try:
                  r, w = os.pipe()
              except OSError as e:
                  print("pipe:", errname(e.errno))
                  break
              os.set_blocking(w, False)
              keep += [r, w]
              try:
                  fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ to pipe-max-size
              except OSError:
                  pass
              try:
                  while True:
                      total += os.write(w, b"x" * 65536)
              except OSError:
                  pass
          print("queued MiB:", total >> 20, flush=True)
          time.sleep(0.3)
          """)

PROBES: list[Probe] = [
    Probe(
        "fp-tcp-buffers",
        "resources",
        "M7",
        "queue TCP buffers on its own loopback (48 stalled connections) under a 64 MiB cap",
        code(_TCP),
        SockGrownAbove(CAP),
        limits=_LIMITS,
        during="inspect",
        serial=True,
    ),
    Probe(
        "fp-udp-buffers",
        "resources",
        "M7",
        "fill 500 unread UDP receive queues on its own loopback under a 64 MiB cap",
        code(_UDP),
        SockGrownAbove(CAP),
        limits=_LIMITS,
        during="inspect",
        serial=True,
    ),
    Probe(
        "fp-unix-buffers",
        "resources",
        "M7",
        "fill 600 unix stream socketpairs' buffers under a 64 MiB cap",
        _UNIX,
        MemoryAbove(CAP),
        limits=_LIMITS,
        serial=True,
        sample=True,
    ),
    Probe(
        "fp-pipe-buffers",
        "resources",
        "M7",
        "fill 128 pipes grown to 1 MiB each under a 64 MiB cap",
        _PIPE,
        MemoryAbove(CAP),
        limits=_LIMITS,
        serial=True,
        sample=True,
    ),
]
