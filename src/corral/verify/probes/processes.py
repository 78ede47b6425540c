"""Processes (M5): when a task ends, every process it started is gone, and no
process inside can signal one outside.

Survival is judged from the host after the backend returned: any process
whose command line carries the probe's marker is a survivor (the host scans
/proc, including the threads of zombie thread-group leaders).
"""

from __future__ import annotations

from corral.verify.model import Probe, ProbeLimits, VictimKilled
from corral.verify.oracles import Fact, Survived
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_S = Survived()
_GRACE = 0.5


def _survivor(pid: str, desc: str, body: str, **kw: float) -> Probe:
    return Probe(
        pid,
        "processes",
        "M5",
        desc,
        code(body),
        _S,
        grace_s=_GRACE,
        deadline_s=kw.get("deadline_s", 20.0),
    )


_KILLED = Fact("victim_killed", "the outside process was killed")

PROBES: list[Probe] = [
    _survivor(
        "proc-setsid-daemon",
        "leave a setsid() daemon behind when the task ends",
        "detach(sleeper(30))",
    ),
    _survivor(
        "proc-double-fork",
        "leave a double-forked (reparented) process behind, same session",
        "detach(sleeper(30), new_session=False)",
    ),
    _survivor(
        "proc-nohup",
        "leave a nohup'd background process behind",
        """
              import subprocess
              quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              subprocess.Popen(["nohup", *sleeper(30)], **quiet)
              time.sleep(0.2)
              """,
    ),
    _survivor(
        "proc-shell-background",
        "leave a shell '&' job behind",
        """
              import subprocess
              subprocess.run(["/bin/sh", "-c", '"$@" >/dev/null 2>&1 &', "sh"] + sleeper(30))
              """,
    ),
    _survivor(
        "proc-ignore-sigterm",
        "leave a daemon that ignores SIGTERM and SIGHUP behind",
        """
              detach([PY, "-I", "-S", "-c",
                      "import signal,time,sys\\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                      "signal.signal(signal.SIGHUP, signal.SIG_IGN)\\n"
                      "time.sleep(30)", MARKER])
              """,
    ),
    _survivor(
        "proc-stopped-daemon",
        "leave a daemon in the stopped state (SIGSTOP) behind",
        """
              detach([PY, "-I", "-S", "-c",
                      "import os,signal,time\\n"
                      "os.kill(os.getpid(), signal.SIGSTOP)\\n"
                      "time.sleep(30)", MARKER])
              time.sleep(0.2)
              """,
    ),
    _survivor(
        "proc-fork-race",
        "leave a process that keeps re-forking (new pid every few ms) to outrun teardown",
        """
              detach([PY, "-I", "-S", "-c",
                      "import os,time,sys\\n"
                      "end = time.time() + 12\\n"
                      "while time.time() < end:\\n"
                      "    time.sleep(0.01)\\n"
                      "    if os.fork():\\n"
                      "        os._exit(0)\\n", MARKER])
              time.sleep(0.2)
              """,
    ),
    _survivor(
        "proc-zombie-leader",
        "leave a process whose leader thread exited while another thread runs",
        """
              import threading
              pid = os.fork()
              if pid == 0:
                  os.setsid()
                  t = threading.Thread(target=time.sleep, args=(30,))
                  t.start()
                  nr = 60 if os.uname().machine == "x86_64" else 93
                  _libc.syscall(ctypes.c_long(nr), ctypes.c_long(0))
              time.sleep(0.3)
              """,
    ),
    _survivor(
        "proc-pidns-daemon",
        "leave a daemon that is pid 1 of its own new PID namespace behind",
        """
              r, e = sysc("unshare", 0x20000000)
              print("unshare(CLONE_NEWPID):", r, errname(e) if e else "")
              if r == 0 and os.fork() == 0:
                  os.setsid()
                  fd = os.open("/dev/null", os.O_RDWR)
                  for n in (0, 1, 2):
                      os.dup2(fd, n)
                  os.execv(PY, sleeper(30))
              time.sleep(0.2)
              """,
    ),
    _survivor(
        "proc-cgroup-escape",
        "move itself out of its cgroup (write cgroup.procs at the root) then daemonize",
        """
              moved = []
              for d in os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else []:
                  for path in ("/sys/fs/cgroup/%s/cgroup.procs" % d, "/sys/fs/cgroup/cgroup.procs"):
                      try:
                          with open(path, "w") as f:
                              f.write(str(os.getpid()))
                          moved.append(path)
                      except OSError:
                          pass
              print("moved to", moved)
              detach(sleeper(30))
              """,
    ),
    _survivor(
        "proc-hold-stdout",
        "leave a child that keeps the task's stdout open after the main process exits",
        """
              import subprocess
              pid = os.fork()
              if pid == 0:
                  os.setsid()
                  os.execv(PY, sleeper(30))
              time.sleep(0.2)
              """,
    ),
    _survivor(
        "proc-many-children",
        "exit while twenty ordinary children are still running",
        """
              import subprocess
              for _ in range(20):
                  subprocess.Popen(sleeper(30), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
              time.sleep(0.3)
              """,
    ),
    Probe(
        "proc-timeout-daemon",
        "processes",
        "M5",
        "leave a setsid() daemon behind when the task is killed by its wall-clock limit",
        code("""
          detach(sleeper(30 * SLOW))
          time.sleep(4 * SLOW)
          """),
        _S,
        limits=ProbeLimits(timeout_s=1.5),
        grace_s=_GRACE,
        serial=True,
    ),
    Probe(
        "proc-launcher-killed",
        "processes",
        "M5",
        "leave a daemon behind when the sandbox launcher itself is SIGKILLed (corral crashes)",
        code("""
          detach(sleeper(30))
          ready()
          time.sleep(15)
          """),
        _S,
        during="kill-backend",
        grace_s=1.0,
        serial=True,
    ),
    Probe(
        "proc-launcher-terminated",
        "processes",
        "M5",
        "leave a daemon behind when the sandbox launcher gets SIGTERM (stop)",
        code("""
          detach(sleeper(30))
          ready()
          time.sleep(15)
          """),
        _S,
        during="term-backend",
        grace_s=1.0,
        serial=True,
    ),
    Probe(
        "proc-signal-kill",
        "processes",
        "M8",
        "SIGKILL a process outside the sandbox by its host pid",
        code("""
          try:
              os.kill(P["kill_victim_pid"], 9)
              result(True)
          except OSError as e:
              result(False, errno=errname(e.errno))
          """),
        _KILLED,
        needs=frozenset({"kill-victim"}),
        checks=(VictimKilled("victim_killed"),),
    ),
    Probe(
        "proc-signal-killpg",
        "processes",
        "M8",
        "SIGKILL an outside process group by its host pgid",
        code("""
          try:
              os.killpg(P["kill_victim_pid"], 9)
              result(True)
          except OSError as e:
              result(False, errno=errname(e.errno))
          """),
        _KILLED,
        needs=frozenset({"kill-victim"}),
        checks=(VictimKilled("victim_killed"),),
    ),
    Probe(
        "proc-signal-pidfd",
        "processes",
        "M8",
        "SIGKILL an outside process through pidfd_open + pidfd_send_signal",
        code("""
          try:
              fd = os.pidfd_open(P["kill_victim_pid"])
              import signal
              signal.pidfd_send_signal(fd, 9)
              result(True)
          except OSError as e:
              result(False, errno=errname(e.errno))
          """),
        _KILLED,
        needs=frozenset({"kill-victim"}),
        checks=(VictimKilled("victim_killed"),),
    ),
    Probe(
        "proc-signal-all",
        "processes",
        "M8",
        "kill(-1, SIGTERM) from a child: every process the sandbox can see",
        code("""
          pid = os.fork()
          if pid == 0:
              import signal
              signal.signal(signal.SIGTERM, signal.SIG_IGN)
              try:
                  os.kill(-1, 15)
              except OSError:
                  pass
              os._exit(0)
          os.waitpid(pid, 0)
          """),
        _KILLED,
        needs=frozenset({"kill-victim"}),
        checks=(VictimKilled("victim_killed"),),
        baseline="not run on the bare host: kill(-1) there would hit every process",
    ),
]
