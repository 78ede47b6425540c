"""Resources (M7): memory (tmpfs and many small processes included), pids,
CPU and wall-clock limits hold.

Judged from the host: the kernel's peak memory counter (the backend's
`peak_memory_bytes`, or a measuring cgroup the suite puts the backend in),
the host's own sampling of marker processes (count, RSS, CPU time), host
paths the task creates and the backend's own timeout record. These probes
run one at a time, after the others.
"""

from __future__ import annotations

from corral.verify.model import PathExists, Probe, ProbeLimits
from corral.verify.oracles import (
    AnyOf,
    CpuRateAbove,
    Fact,
    MemoryAbove,
    OutlivedLimit,
    ProcsAbove,
    Reported,
)
from corral.verify.probes._dsl import code

__all__ = ["MEM_LIMIT", "PROBES"]

MEM_LIMIT = 256 * 2**20
_MEM = ProbeLimits(memory="256M")


def _fill_512_mib(directory: str) -> str:
    """Probe body: write 512 MiB into a memory-backed directory, then remove it."""
    return f"""
          path = "{directory}/corral-verify-" + MARKER
          blob = b"\\1" * (8 << 20)
          n = 0
          try:
              with open(path, "wb") as f:
                  for i in range(64):
                      f.write(blob)
                      n += 1
              print("wrote MiB:", 8 * n, flush=True)
          except OSError as e:
              print("stopped at MiB:", 8 * n, errname(e.errno))
          time.sleep(0.3)
          os.unlink(path)
          """


PROBES: list[Probe] = [
    Probe(
        "res-memory-hog",
        "resources",
        "M7",
        "allocate and touch 768 MiB under a 256 MiB limit",
        code("""
          chunks = []
          for i in range(48):
              b = bytearray(16 << 20)
              for j in range(0, len(b), 4096):
                  b[j] = 1
              chunks.append(b)
          print("held MiB:", 16 * len(chunks), flush=True)
          time.sleep(0.5)
          """),
        MemoryAbove(MEM_LIMIT),
        limits=_MEM,
        serial=True,
        sample=True,
    ),
    Probe(
        "res-memory-many-procs",
        "resources",
        "M7",
        "six processes of 128 MiB each, every one under a 256 MiB RLIMIT_AS (not a memory limit)",
        code("""
          import resource
          kids = []
          for i in range(6):
              pid = os.fork()
              if pid == 0:
                  resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
                  b = bytearray(128 << 20)
                  for j in range(0, len(b), 4096):
                      b[j] = 1
                  time.sleep(1.5)
                  os._exit(0)
              kids.append(pid)
          for k in kids:
              os.waitpid(k, 0)
          """),
        MemoryAbove(MEM_LIMIT),
        limits=_MEM,
        serial=True,
        sample=True,
    ),
    Probe(
        "res-memory-tmpfs",
        "resources",
        "M7",
        "write 512 MiB into /tmp under a 256 MiB memory limit",
        code(_fill_512_mib("/tmp")),
        AnyOf((MemoryAbove(MEM_LIMIT), Fact("big", "a 512 MiB file reached the host's /tmp"))),
        limits=_MEM,
        serial=True,
        sample=True,
        checks=(PathExists("big", "/tmp/corral-verify-{marker}"),),
    ),
    Probe(
        "res-memory-shm",
        "resources",
        "M7",
        "write 512 MiB into /dev/shm under a 256 MiB memory limit",
        code(_fill_512_mib("/dev/shm")),
        MemoryAbove(MEM_LIMIT),
        limits=_MEM,
        serial=True,
        sample=True,
    ),
    Probe(
        "res-fork-bomb",
        "resources",
        "M7",
        "fork 400 sleeping processes under a 64-process limit",
        code("""
          n = 0
          for i in range(400):
              try:
                  pid = os.fork()
              except OSError as e:
                  print("fork failed after", n, errname(e.errno))
                  break
              if pid == 0:
                  time.sleep(3)
                  os._exit(0)
              n += 1
          print("forked", n, flush=True)
          time.sleep(1.5)
          """),
        ProcsAbove(80),
        limits=ProbeLimits(pids=64),
        serial=True,
        sample=True,
    ),
    Probe(
        "res-cpu-hog",
        "resources",
        "M7",
        "four busy processes under a 0.25 CPU quota: the CPU rate (CPU-s per wall-s) stays at "
        "the quota",
        # Judged by rate, not by an amount in a window, so a loaded host does not
        # flip the baseline: unsandboxed, four busy loops get several times the
        # quota's rate even when the host gives each a small share; a 0.25 quota
        # holds the whole sandbox at 0.25 however idle the host is.
        code("""
          kids = []
          for i in range(4):
              pid = os.fork()
              if pid == 0:
                  end = time.time() + 3.0
                  while time.process_time() < 1.0 and time.time() < end:
                      pass
                  os._exit(0)
              kids.append(pid)
          for k in kids:
              os.waitpid(k, 0)
          """),
        CpuRateAbove(0.5),
        limits=ProbeLimits(cpus=0.25),
        serial=True,
        sample=True,
    ),
    Probe(
        "res-wall-clock",
        "resources",
        "M7",
        "sleep 5 s under a 1.5 s wall-clock limit",
        code("""
          open(P["ws"] + "/started-" + MARKER, "w").close()
          time.sleep(5 * SLOW)
          open(P["ws"] + "/finished-" + MARKER, "w").close()
          print("slept 5 s")
          """),
        OutlivedLimit("started", "finished"),
        limits=ProbeLimits(timeout_s=1.5),
        checks=(
            PathExists("started", "{ws}/started-{marker}"),
            PathExists("finished", "{ws}/finished-{marker}"),
        ),
        serial=True,
    ),
    Probe(
        "res-cgroup-limit-write",
        "resources",
        "M7",
        "rewrite its own cgroup memory limit (same value) through /sys/fs/cgroup",
        code("""
          done = []
          for line in read("/proc/self/cgroup").splitlines():
              parts = line.split(":", 2)
              if len(parts) != 3:
                  continue
              ctrls, path = parts[1], parts[2]
              cands = []
              if "memory" in ctrls.split(","):
                  cands.append("/sys/fs/cgroup/memory%s/memory.limit_in_bytes" % path)
              if ctrls == "":
                  cands.append("/sys/fs/cgroup%s/memory.max" % path)
                  cands.append("/sys/fs/cgroup/unified%s/memory.max" % path)
              for c in cands:
                  try:
                      cur = open(c).read()
                      with open(c, "w") as f:
                          f.write(cur)
                      done.append(c)
                  except OSError as e:
                      print(c, errname(e.errno))
          result(bool(done), written=done)
          """),
        Reported(),
    ),
]
