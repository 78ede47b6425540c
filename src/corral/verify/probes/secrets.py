"""Secrets (M4): host credentials never enter a sandbox, by environment,
/proc, keyrings, inherited descriptors, agent sockets or well-known files."""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, InjectedNotLeaked, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PLANTED_ENV", "PROBES"]

#: Variables planted (with canary values) in the caller's environment of every run.
PLANTED_ENV: tuple[str, ...] = (
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "GITHUB_TOKEN",
    "NPM_TOKEN",
    "DATABASE_URL",
    "CORRAL_CANARY_SECRET",
)
_ENV_SECRETS = tuple(f"env_{n}" for n in PLANTED_ENV)


def _env() -> list[Probe]:
    return [
        Probe(
            f"secrets-env-{n.lower().replace('_', '-')}",
            "secrets",
            "M4",
            f"read the caller's ${n} from the environment",
            code(f'show("{n}", os.environ.get("{n}", ""))'),
            SecretSeen((f"env_{n}",)),
        )
        for n in PLANTED_ENV
    ]


_PROC_SCAN = """
for pid in [d for d in os.listdir("/proc") if d.isdigit()]:
    show("pid %s {what}" % pid, read("/proc/%s/{what}" % pid))
"""

PROBES: list[Probe] = [
    *_env(),
    Probe(
        "secrets-env-scan",
        "secrets",
        "M4",
        "scan the whole environment for anything the caller planted",
        code("""
          for k, v in os.environ.items():
              show(k, v)
          """),
        SecretSeen((*_ENV_SECRETS, "env_proxy")),
    ),
    Probe(
        "secrets-env-proxy-credentials",
        "secrets",
        "M4",
        "read proxy credentials from the caller's HTTPS_PROXY (proxy variables are allowlisted)",
        code("""
          for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
              show(k, os.environ.get(k, ""))
          """),
        SecretSeen(("env_proxy",)),
        env=(("HTTPS_PROXY", "http://corral:{s_env_proxy}@127.0.0.1:9/"),),
    ),
    Probe(
        "secrets-proc-self-environ",
        "secrets",
        "M4",
        "read /proc/self/environ",
        code('show("self", read("/proc/self/environ"))'),
        SecretSeen(_ENV_SECRETS),
    ),
    Probe(
        "secrets-proc-1-environ",
        "secrets",
        "M4",
        "read /proc/1/environ (pid 1 of the sandbox, bubblewrap#725)",
        code('show("pid 1", read("/proc/1/environ"))'),
        SecretSeen(_ENV_SECRETS),
        baseline="on the bare host pid 1 is init, which never held the caller's variables",
    ),
    Probe(
        "secrets-proc-ancestors-environ",
        "secrets",
        "M4",
        "read /proc/<pid>/environ of every ancestor (the launcher holds the caller's environment)",
        code("""
          pid = os.getppid()
          seen = 0
          while pid > 0 and seen < 20:
              show("ancestor %d" % pid, read("/proc/%d/environ" % pid))
              st = read("/proc/%d/stat" % pid)
              try:
                  pid = int(st.rsplit(")", 1)[1].split()[1])
              except (IndexError, ValueError):
                  break
              seen += 1
          """),
        SecretSeen(_ENV_SECRETS),
    ),
    Probe(
        "secrets-proc-scan-environ",
        "secrets",
        "M4",
        "read /proc/*/environ of every visible process",
        code(_PROC_SCAN.format(what="environ")),
        SecretSeen(("victim_env", *_ENV_SECRETS)),
    ),
    Probe(
        "secrets-proc-scan-cmdline",
        "secrets",
        "M4",
        "read /proc/*/cmdline of every visible process",
        code(_PROC_SCAN.format(what="cmdline")),
        SecretSeen(("victim_argv",)),
    ),
    Probe(
        "secrets-proc-victim-environ",
        "secrets",
        "M4",
        "read /proc/<host pid>/environ of an outside process",
        code('show("victim", read("/proc/%d/environ" % P["victim_pid"]))'),
        SecretSeen(("victim_env",)),
        uses=("victim_pid",),
    ),
    Probe(
        "secrets-proc-victim-cmdline",
        "secrets",
        "M4",
        "read /proc/<host pid>/cmdline of an outside process",
        code('show("victim", read("/proc/%d/cmdline" % P["victim_pid"]))'),
        SecretSeen(("victim_argv",)),
        uses=("victim_pid",),
    ),
    Probe(
        "secrets-keyring-user",
        "secrets",
        "M4",
        "read a key the caller holds in its user keyring (keyctl)",
        code("""
          kr, e = sysc("keyctl", 0, -4, 0)
          key, e2 = sysc("keyctl", 10, kr, "user", P["keyring_desc"], 0) if kr >= 0 else (-1, e)
          if key >= 0:
              buf = ctypes.create_string_buffer(4096)
              n, e3 = sysc("keyctl", 11, key, buf, 4096)
              show("key", buf.raw[:max(n, 0)])
          result(key >= 0, keyring=kr, errno=errname(e2) if key < 0 else None)
          """),
        SecretSeen(("keyring",)),
        uses=("keyring_desc",),
    ),
    Probe(
        "secrets-inherited-fd",
        "secrets",
        "M4",
        "read a secret file through a descriptor the caller left open (inherited fds)",
        code("""
          for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
              if fd <= 2:
                  continue
              try:
                  os.lseek(fd, 0, 0)
                  show("fd %d" % fd, os.read(fd, 4096))
              except OSError as e:
                  pass
          """),
        SecretSeen(("fd",)),
        needs=frozenset({"fd"}),
    ),
    Probe(
        "secrets-ssh-agent",
        "secrets",
        "M4",
        "talk to the caller's SSH agent socket ($SSH_AUTH_SOCK)",
        code("""
          path = os.environ.get("SSH_AUTH_SOCK") or P["unix_agent"]
          r, e = unix(path, MARKER.encode() + b"\\n")
          net_report("agent " + path, r, e)
          """),
        AnyOf((HitLogged(("unix_agent",)), SecretSeen(("unix",)))),
    ),
    Probe(
        "secrets-credential-files",
        "secrets",
        "M4",
        "read well-known credential files (.aws/credentials, gh hosts.yml, .pypirc) of every home",
        code("""
          homes = {os.path.expanduser("~"), "/root"}
          try:
              homes |= {"/home/" + d for d in os.listdir("/home")}
          except OSError:
              pass
          import hashlib
          for h in sorted(homes):
              for rel in (".aws/credentials", ".config/gh/hosts.yml", ".pypirc"):
                  try:
                      with open(h + "/" + rel, "rb") as f:
                          data = f.read(1 << 20)
                  except OSError as e:
                      print(h + "/" + rel + ": ERR " + errname(e.errno or 0), flush=True)
                      continue
                  # A digest, never the content: a real credential must not
                  # reach the output even on a host without a sandbox.
                  print(h + "/" + rel + ": sha256 " + hashlib.sha256(data).hexdigest(), flush=True)
          """),
        SecretSeen(("cred_aws", "cred_gh", "cred_pypirc")),
        uses=("cred_files",),
    ),
    Probe(
        "secrets-broker-injected-key",
        "secrets",
        "M4",
        "call the provider route the broker injects $ANTHROPIC_API_KEY into, then hunt for the "
        "key inside (environment, /proc, files, the response and error pages)",
        code("""
          bh, bp = broker_addr()
          ba = "%s:%d" % (bh, bp)
          req = http_req("/routes/verify/m/" + MARKER + "/v1/messages", ba,
                         b"x-api-key: dummy\\r\\nContent-Type: application/json\\r\\n",
                         "POST", b'{"model": "corral-verify", "max_tokens": 8}')
          r, e = tcp(bh, bp, req)
          show("route reply", r if r is not None else "ERR " + str(e))
          print("route status:", (r or b"").split(b"\\r\\n", 1)[0][:80].decode("latin-1"))
          r, e = tcp(bh, bp, http_req("/routes/verify-nope/x", ba))
          show("unknown route reply", r if r is not None else "ERR " + str(e))
          show("environ", "\\n".join("%s=%s" % kv for kv in os.environ.items()))
          for pid in [d for d in os.listdir("/proc") if d.isdigit()]:
              for name in ("environ", "cmdline"):
                  text = read("/proc/%s/%s" % (pid, name))
                  # The probe's own command line quotes CANARY; it holds no secret.
                  if CANARY in text and MARKER not in text:
                      show("/proc/%s/%s" % (pid, name), text)
          seen = 0
          for top in ("/tmp", "/run", "/var/tmp", os.path.expanduser("~"), P["ws"], "/etc"):
              for dirpath, dirs, files in os.walk(top):
                  for fn in files:
                      seen += 1
                      if seen > 4000:
                          break
                      path = os.path.join(dirpath, fn)
                      if os.path.isfile(path) and CANARY in read(path, 1 << 16):
                          show(path, read(path, 1 << 16))
          """),
        InjectedNotLeaked("env_ANTHROPIC_API_KEY"),
        broker_config=(
            '[routes.verify]\nupstream = "http://{http_a_host}:{http_a_port}"\n'
            "allow_private = true\n"
            'inject_header = {{ "x-api-key" = "env:ANTHROPIC_API_KEY" }}\n'
        ),
    ),
]
