"""Footprint (M7): pages a sandbox fills — shm, tmpfs, page cache — count against its cap.

Judged from the kernel's peak memory counter (`corral exec --json`
`peak_memory_bytes`, or the measuring memory cgroup the suite puts
`--backend none` in), never from the probe's exit. Each probe writes three
times the 64 MiB cap: shm and tmpfs pages cannot be reclaimed, so a corral
sandbox is killed at the cap (or gets ENOSPC with `--disk`); page cache can,
so the kernel reclaims it inside the cap instead of letting the host carry
it. Under `--backend none` the peak grows to what was written. Each probe
removes its file before it exits, so a peer without a private /tmp or
/dev/shm is left clean.
"""

from __future__ import annotations

from corral.verify.model import Probe, ProbeLimits
from corral.verify.oracles import MemoryAbove
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

CAP = 64 * 2**20
_LIMITS = ProbeLimits(memory="64M", timeout_s=30)

#: Write 192 MiB (3 x cap) to the file at `path` in 1 MiB chunks, read it back
#: once (page cache), then unlink it.
_FILL = """
          import os
          path = PATH + "/corral-fp-" + str(os.getpid())
          chunk, total = b"x" * (1 << 20), 0
          try:
              fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
              try:
                  for _ in range(192):
                      total += os.write(fd, chunk)
              finally:
                  os.close(fd)
              with open(path, "rb") as fh:
                  while fh.read(1 << 20):
                      pass
          except OSError as e:
              print("write:", errname(e.errno))
          finally:
              try:
                  os.unlink(path)
              except OSError:
                  pass
          print("written MiB:", total >> 20, flush=True)
          """


def _fill(path_expr: str) -> str:
    return code(_FILL.replace("PATH", path_expr))


PROBES: list[Probe] = [
    Probe(
        "fp-shm-pages",
        "resources",
        "M7",
        "fill /dev/shm with 192 MiB under a 64 MiB cap",
        _fill('"/dev/shm"'),
        MemoryAbove(CAP),
        limits=_LIMITS,
        serial=True,
        sample=True,
    ),
    Probe(
        "fp-tmpfs-pages",
        "resources",
        "M7",
        "fill /tmp (a tmpfs in a corral sandbox) with 192 MiB under a 64 MiB cap",
        _fill('"/tmp"'),
        MemoryAbove(CAP),
        limits=_LIMITS,
        serial=True,
        sample=True,
    ),
    Probe(
        "fp-page-cache",
        "resources",
        "M7",
        "write and read back a 192 MiB file in the workspace (page cache) under a 64 MiB cap",
        _fill("os.getcwd()"),
        MemoryAbove(CAP),
        limits=_LIMITS,
        serial=True,
        sample=True,
    ),
]
