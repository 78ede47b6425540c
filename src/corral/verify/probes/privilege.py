"""Privilege (M8): unprivileged uid, no capabilities, no_new_privs, seccomp
denial of the dangerous syscalls, no raw/VSOCK/packet sockets, no setuid
escalation.

Where a host-side effect exists the oracle uses it (a secret read from an
outside process's memory, a device node on the host). A bare syscall that
returns a descriptor leaves nothing on the host; those probes are judged from
the probe's own structured report of the return value and errno (`Reported`),
and every call is chosen to be harmless even when it succeeds on the bare
host (same-value writes, invalid arguments past the capability check,
immediate cleanup).
"""

from __future__ import annotations

from corral.verify.model import IsDevice, KernelLog, Probe
from corral.verify.oracles import Fact, HostStatus, Reported, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_R = Reported(host_kernel_only=True)
_NO_SUPPORT = "kernels built without this syscall answer ENOSYS even to root"


def _p(pid: str, desc: str, body: str, *, baseline: str | None = None) -> Probe:
    return Probe(pid, "privilege", "M8", desc, code(body), _R, baseline=baseline)


def _inspect(pid: str, desc: str, oracle: HostStatus) -> Probe:
    """A probe that just stays alive while the host reads its /proc status."""
    return Probe(
        pid, "privilege", "M8", desc, code("ready()\ntime.sleep(1.5)"), oracle, during="inspect"
    )


def _in_child(body: str) -> str:
    """Wrap a snippet to run in a forked child that reports through a pipe,
    so namespace and credential changes never touch the probe itself."""
    inner = "\n".join("        " + ln for ln in code(body).splitlines())
    return f"""
rfd, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(rfd)
    def report(ok, **kw):
        kw["ok"] = bool(ok)
        os.write(wfd, json.dumps(kw, default=str).encode())
    try:
{inner}
    finally:
        os._exit(0)
os.close(wfd)
os.waitpid(pid, 0)
data = os.read(rfd, 65536)
out = json.loads(data) if data else {{"ok": False, "error": "child died"}}
result(out.pop("ok"), **out)
"""


def _status() -> list[Probe]:
    return [
        _inspect(
            "priv-host-uid-root",
            "run as uid 0 as the host sees it (/proc/<pid>/status from the host)",
            HostStatus("Uid", "zero"),
        ),
        _inspect(
            "priv-capabilities",
            "hold any effective capability (as the host sees it)",
            HostStatus("CapEff", "nonzero"),
        ),
        _inspect(
            "priv-no-new-privs-unset",
            "run without no_new_privs (setuid binaries could escalate)",
            HostStatus("NoNewPrivs", "zero-flag"),
        ),
        _inspect(
            "priv-no-seccomp",
            "run without a seccomp filter (as the host sees it)",
            HostStatus("Seccomp", "zero-flag"),
        ),
        _p(
            "priv-setuid-passwd",
            "escalate through a setuid-root binary (passwd -S root needs euid 0)",
            """
           import subprocess
           try:
               argv = ["/usr/bin/passwd", "-S", "root"]
               out = subprocess.run(argv, capture_output=True, text=True, timeout=5)
               ok = out.returncode == 0 and out.stdout.startswith("root ")
               result(ok, rc=out.returncode, err=out.stderr.strip()[:80])
           except (OSError, subprocess.SubprocessError) as e:
               result(False, error=str(e))
           """,
        ),
        _p(
            "priv-rlimit-raise",
            "raise a hard resource limit back after lowering it (CAP_SYS_RESOURCE)",
            _in_child("""
           import resource
           soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
           resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard - 1), hard - 1))
           try:
               resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard - 1), hard))
               report(True, hard=hard)
           except (OSError, ValueError) as e:
               report(False, error=str(e))
           """),
            baseline="needs CAP_SYS_RESOURCE, which root lacks on some hosts (this VM's root does)",
        ),
        _p(
            "priv-nice-negative",
            "raise its own scheduling priority (nice -5)",
            """
           try:
               os.nice(-5)
               result(True)
           except OSError as e:
               result(False, errno=errname(e.errno))
           """,
        ),
    ]


def _tracing() -> list[Probe]:
    child_peek = """
    secret = b"corral-verify-child-secret"
    buf = ctypes.create_string_buffer(secret)
    addr = ctypes.addressof(buf)
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    """
    return [
        _p(
            "priv-ptrace-child",
            "PTRACE_ATTACH to its own child (seccomp must deny ptrace)",
            f"""
           {code(child_peek).replace(chr(10), chr(10) + "           ")}
           r, e = sysc("ptrace", 16, pid, 0, 0)
           if r == 0:
               os.waitpid(pid, 0)
               sysc("ptrace", 17, pid, 0, 0)
           os.kill(pid, 9)
           sys_result("ptrace", r, e)
           """,
        ),
        _p(
            "priv-process-vm-readv-child",
            "process_vm_readv its own child's memory",
            f"""
           {code(child_peek).replace(chr(10), chr(10) + "           ")}
           local = ctypes.create_string_buffer(len(secret))
           liov = (ctypes.c_void_p * 2)(ctypes.addressof(local), len(secret))
           riov = (ctypes.c_void_p * 2)(addr, len(secret))
           r, e = sysc("process_vm_readv", pid, liov, 1, riov, 1, 0)
           os.kill(pid, 9)
           sys_result("process_vm_readv", r, e, ok=r > 0 and local.raw == secret)
           """,
        ),
        Probe(
            "priv-ptrace-victim",
            "privilege",
            "M8",
            "PTRACE_ATTACH to an outside process and PEEKDATA a secret from its memory",
            code("""
              pid, addr, n = P["victim_pid"], P["victim_addr"], P["victim_len"]
              r, e = sysc("ptrace", 16, pid, 0, 0)
              got = b""
              if r == 0:
                  os.waitpid(pid, 0x40000000)
                  word = ctypes.c_ulong()
                  for off in range(0, n, 8):
                      rr, ee = sysc("ptrace", 2, pid, addr + off, ctypes.byref(word))
                      if rr < 0:
                          break
                      got += word.value.to_bytes(8, "little")
                  sysc("ptrace", 17, pid, 0, 0)
              show("peek", got[:n])
              sys_result("ptrace", r, e)
              """),
            SecretSeen(("victim_mem",)),
            uses=("victim_pid",),
            serial=True,
        ),
        Probe(
            "priv-proc-mem-victim",
            "privilege",
            "M8",
            "read a secret from an outside process's /proc/<pid>/mem",
            code("""
              try:
                  with open("/proc/%d/mem" % P["victim_pid"], "rb") as f:
                      f.seek(P["victim_addr"])
                      show("mem", f.read(P["victim_len"]))
              except OSError as e:
                  print("mem:", errname(e.errno))
              """),
            SecretSeen(("victim_mem",)),
            uses=("victim_pid",),
        ),
        Probe(
            "priv-process-vm-readv-victim",
            "privilege",
            "M8",
            "read a secret from an outside process's memory with process_vm_readv",
            code("""
              n = P["victim_len"]
              local = ctypes.create_string_buffer(n)
              liov = (ctypes.c_void_p * 2)(ctypes.addressof(local), n)
              riov = (ctypes.c_void_p * 2)(P["victim_addr"], n)
              r, e = sysc("process_vm_readv", P["victim_pid"], liov, 1, riov, 1, 0)
              show("vm_readv", local.raw if r > 0 else b"")
              sys_result("process_vm_readv", r, e)
              """),
            SecretSeen(("victim_mem",)),
            uses=("victim_pid",),
        ),
        Probe(
            "priv-pidfd-getfd-victim",
            "privilege",
            "M8",
            "steal an outside process's open file with pidfd_getfd and read the secret",
            code("""
              r, e = sysc("pidfd_open", P["victim_pid"], 0)
              if r >= 0:
                  fd, e = sysc("pidfd_getfd", r, P["victim_fd"], 0)
                  if fd >= 0:
                      os.lseek(fd, 0, 0)
                      show("stolen fd", os.read(fd, 4096))
                  r = fd
              sys_result("pidfd_getfd", r, e)
              """),
            SecretSeen(("victim_fd",)),
            uses=("victim_pid",),
        ),
    ]


def _syscalls() -> list[Probe]:
    return [
        _p(
            "priv-io-uring",
            "create an io_uring instance (io_uring_setup)",
            """
           params = ctypes.create_string_buffer(120)
           r, e = sysc("io_uring_setup", 4, params)
           sys_result("io_uring_setup", r, e)
           """,
        ),
        _p(
            "priv-bpf-map",
            "create a BPF map (bpf BPF_MAP_CREATE)",
            """
           attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1) + b"\\0" * 112)
           r, e = sysc("bpf", 0, attr, 128)
           sys_result("bpf", r, e)
           """,
        ),
        _p(
            "priv-bpf-prog",
            "load a BPF socket filter program (bpf BPF_PROG_LOAD)",
            """
           insns = (ctypes.c_uint64 * 2)(0x00000000000000b7, 0x0000000000000095)
           lic = ctypes.create_string_buffer(b"GPL")
           attr = ctypes.create_string_buffer(struct.pack("IIQQ", 1, 2, ctypes.addressof(insns),
                                                          ctypes.addressof(lic)) + b"\\0" * 104)
           r, e = sysc("bpf", 5, attr, 128)
           sys_result("bpf", r, e)
           """,
        ),
        _p(
            "priv-perf-event-open",
            "open a perf event (software CPU clock of itself)",
            """
           attr = ctypes.create_string_buffer(struct.pack("IIQ", 1, 128, 0) + b"\\0" * 112)
           r, e = sysc("perf_event_open", attr, 0, -1, -1, 0)
           sys_result("perf_event_open", r, e)
           """,
        ),
        _p(
            "priv-userfaultfd",
            "create a userfaultfd (user-mode-only flag, as an unprivileged attacker would)",
            """
           r, e = sysc("userfaultfd", os.O_CLOEXEC | 1)
           sys_result("userfaultfd", r, e)
           """,
        ),
        _p(
            "priv-keyctl-add",
            "add a key to its session keyring (add_key), then revoke it",
            """
           payload = b"corral-verify"
           desc = "corral-verify-" + MARKER
           r, e = sysc("add_key", "user", desc, ctypes.c_char_p(payload), len(payload), -3)
           if r >= 0:
               sysc("keyctl", 3, r)
           sys_result("add_key", r, e)
           """,
        ),
        _p(
            "priv-mount-tmpfs",
            "mount a tmpfs (then unmount it)",
            """
           d = P["ws"] + "/m-" + MARKER
           os.makedirs(d, exist_ok=True)
           r, e = sysc("mount", "none", d, "tmpfs", 0, "size=1m")
           if r == 0:
               sysc("umount2", d, 2)
           sys_result("mount", r, e)
           """,
        ),
        _p(
            "priv-umount",
            "call umount2 on a non-mount-point (EINVAL means the capability check passed)",
            """
           r, e = sysc("umount2", P["ws"], 0)
           sys_result("umount2", r, e, ok=(e == errno.EINVAL))
           """,
        ),
        _p(
            "priv-fsopen",
            "open a filesystem context (fsopen tmpfs, the new mount API)",
            """
           r, e = sysc("fsopen", "tmpfs", 1)
           sys_result("fsopen", r, e)
           """,
        ),
        _p(
            "priv-open-tree",
            "clone the root mount tree (open_tree OPEN_TREE_CLONE)",
            """
           r, e = sysc("open_tree", -100, "/", 1 | 0x80000)
           sys_result("open_tree", r, e)
           """,
        ),
        _p(
            "priv-chroot",
            "chroot (in a child)",
            _in_child("""
           r, e = sysc("chroot", "/")
           report(r == 0, errno=errname(e) if e else None)
           """),
        ),
        _p(
            "priv-module-finit",
            "load a kernel module (finit_module with an empty file)",
            """
           fd = os.open("/dev/null", os.O_RDONLY)
           r, e = sysc("finit_module", fd, "", 0)
           sys_result("finit_module", r, e, ok=e not in (errno.EPERM, errno.EACCES, errno.ENOSYS))
           """,
            baseline=_NO_SUPPORT,
        ),
        _p(
            "priv-module-delete",
            "unload a kernel module (delete_module of a name that does not exist)",
            """
           r, e = sysc("delete_module", "corral_verify_none", os.O_NONBLOCK)
           sys_result("delete_module", r, e, ok=e not in (errno.EPERM, errno.EACCES, errno.ENOSYS))
           """,
            baseline=_NO_SUPPORT,
        ),
        _p(
            "priv-kexec-file-load",
            "load a kexec kernel (kexec_file_load with a bad fd)",
            """
           r, e = sysc("kexec_file_load", -1, -1, 0, None, 0)
           ok = e not in (errno.EPERM, errno.EACCES, errno.ENOSYS)
           sys_result("kexec_file_load", r, e, ok=ok)
           """,
            baseline=_NO_SUPPORT,
        ),
        _p(
            "priv-syslog",
            "read the kernel log buffer size (syslog SYSLOG_ACTION_SIZE_BUFFER)",
            """
           r, e = sysc("syslog", 10, None, 0)
           sys_result("syslog", r, e)
           """,
        ),
        _p(
            "priv-swapoff",
            "swapoff a path that does not exist (ENOENT means the capability check passed)",
            """
           r, e = sysc("swapoff", "/corral-verify-none")
           sys_result("swapoff", r, e, ok=e not in (errno.EPERM, errno.EACCES, errno.ENOSYS))
           """,
        ),
        _p(
            "priv-ioperm",
            "request I/O port access (ioperm 0x80)",
            """
           r, e = sysc("ioperm", 0x80, 1, 1)
           sys_result("ioperm", r, e)
           """,
            baseline=_NO_SUPPORT,
        ),
        _p(
            "priv-sethostname",
            "set the hostname to its current value",
            """
           name = os.uname().nodename
           r, e = sysc("sethostname", name, len(name))
           sys_result("sethostname", r, e)
           """,
        ),
        _p(
            "priv-proc-sys-write",
            "write /proc/sys/kernel/domainname (same value)",
            """
           try:
               cur = open("/proc/sys/kernel/domainname").read()
               with open("/proc/sys/kernel/domainname", "w") as f:
                   f.write(cur)
               result(True)
           except OSError as e:
               result(False, errno=errname(e.errno))
           """,
        ),
        _p(
            "priv-core-pattern-write",
            "write /proc/sys/kernel/core_pattern (same value; a pipe here runs as root)",
            """
           try:
               cur = open("/proc/sys/kernel/core_pattern").read()
               with open("/proc/sys/kernel/core_pattern", "w") as f:
                   f.write(cur)
               result(True)
           except OSError as e:
               result(False, errno=errname(e.errno))
           """,
        ),
        Probe(
            "priv-kmsg-write",
            "privilege",
            "M8",
            "write a line into the host kernel log (/dev/kmsg)",
            code("""
              try:
                  fd = os.open("/dev/kmsg", os.O_WRONLY)
                  os.write(fd, ("corral-verify probe " + MARKER + "\\n").encode())
                  result(True)
              except OSError as e:
                  result(False, errno=errname(e.errno))
              """),
            Fact("logged", "the marker reached the host's kernel log"),
            checks=(KernelLog("logged"),),
        ),
        Probe(
            "priv-mknod-block",
            "privilege",
            "M8",
            "create a block device node in the workspace (mknod)",
            code("""
              try:
                  os.mknod(P["ws"] + "/dev-" + MARKER, 0o600 | 0o060000, os.makedev(7, 0))
              except OSError as e:
                  print("mknod:", errname(e.errno))
              """),
            Fact("device", "a device node appeared on the host"),
            checks=(IsDevice("device", "{ws}/dev-{marker}"),),
        ),
    ]


def _namespaces() -> list[Probe]:
    out = []
    for name, flag in (
        ("user", 0x10000000),
        ("mount", 0x00020000),
        ("net", 0x40000000),
        ("pid", 0x20000000),
        ("cgroup", 0x02000000),
    ):
        out.append(
            _p(
                f"priv-unshare-{name}",
                f"create a new {name} namespace (unshare, in a child)",
                _in_child(f"""
           r, e = sysc("unshare", {flag})
           report(r == 0, errno=errname(e) if e else None)
           """),
            )
        )
    for ns in ("net", "mnt"):
        out.append(
            _p(
                f"priv-setns-{ns}",
                f"join pid 1's (or an outside process's) {ns} namespace (setns, in a child)",
                _in_child(f"""
           tried = {{}}
           for pid in (1, P["victim_pid"]):
               try:
                   fd = os.open("/proc/%d/ns/{ns}" % pid, os.O_RDONLY)
               except OSError as e:
                   tried[pid] = errname(e.errno)
                   continue
               r, e = sysc("setns", fd, 0)
               if r == 0:
                   report(True, pid=pid)
                   break
               tried[pid] = errname(e)
           else:
               report(False, tried=tried)
           """),
            )
        )
    return out


def _sockets() -> list[Probe]:
    return [
        _p(
            "priv-socket-vsock",
            "open an AF_VSOCK socket (host/VM channel)",
            """
           try:
               socket.socket(40, socket.SOCK_STREAM).close()
               result(True)
           except OSError as e:
               result(False, errno=errname(e.errno))
           """,
            baseline="needs a kernel with vsock support",
        ),
        _p(
            "priv-socket-packet",
            "open an AF_PACKET raw socket (sniff/forge link-layer frames)",
            """
           try:
               socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300).close()
               result(True)
           except OSError as e:
               result(False, errno=errname(e.errno))
           """,
        ),
        _p(
            "priv-socket-raw-ip",
            "open a raw IPv4 socket (forge packets, CAP_NET_RAW)",
            """
           try:
               socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close()
               result(True)
           except OSError as e:
               result(False, errno=errname(e.errno))
           """,
        ),
        Probe(
            "priv-netlink-host-links",
            "privilege",
            "M8",
            "list network interfaces over AF_NETLINK and find one that exists only on the host",
            code("""
              try:
                  s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
                  s.bind((0, 0))
                  req = struct.pack("=IHHII", 32, 18, 0x301, 1, 0)
                  req += struct.pack("=BxHiII", 0, 0, 0, 0, 0)
                  s.send(req)
                  names = []
                  s.settimeout(2)
                  done = False
                  while not done:
                      data = s.recv(65536)
                      off = 0
                      while off + 16 <= len(data):
                          ln, typ = struct.unpack_from("=IH", data, off)
                          if typ == 3 or ln < 16:
                              done = True
                              break
                          a = off + 32
                          while a + 4 <= off + ln:
                              alen, atyp = struct.unpack_from("=HH", data, a)
                              if alen < 4:
                                  break
                              if atyp == 3:
                                  names.append(data[a + 4:a + alen].rstrip(b"\\0").decode())
                              a += (alen + 3) & ~3
                          off += (ln + 3) & ~3
                  print("links:", " ".join(names))
                  result(True, links=names)
              except OSError as e:
                  result(False, errno=errname(e.errno) if e.errno else str(e))
              """),
            SecretSeen(("host_iface",)),
            uses=("netns_ip",),
        ),
    ]


PROBES: list[Probe] = _status() + _tracing() + _syscalls() + _namespaces() + _sockets()
