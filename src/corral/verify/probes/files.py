"""Files: reads outside the read allowlist (M1) and writes outside the writable
mounts (M2), by every route the kernel offers: direct paths, `..`, symlinks
and hard links in the workspace, /proc/<pid>/root|cwd|fd of outside
processes, file handles, device nodes and mounts."""

from __future__ import annotations

from corral.verify.model import (
    FileChanged,
    MountedAt,
    PathExists,
    Probe,
    SameInode,
    Symlink,
)
from corral.verify.oracles import AnyOf, Fact, Reported, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

# (name, context key, secret name, where it lives) for canaries read by path.
_CANARY_FILES: tuple[tuple[str, str, str, str], ...] = (
    ("home", "f_home", "home", "the caller's $HOME (mode 0644)"),
    ("ssh", "f_ssh", "ssh", "/root/.ssh (a fake private key, mode 0600)"),
    ("etc", "f_etc", "etc", "/etc (root-only, mode 0600)"),
    ("home-dir", "f_home_dir", "home_dir", "/home/<user> (mode 0644)"),
    ("var-tmp", "f_var_tmp", "var_tmp", "/var/tmp (mode 0644)"),
    ("tmp", "f_tmp", "tmp", "the host's /tmp (mode 0644)"),
    ("run", "f_run", "run", "/run (mode 0644)"),
    ("srv", "f_srv", "srv", "/srv (mode 0644)"),
    ("mnt", "f_mnt", "mnt", "/mnt (mode 0644)"),
    ("media", "f_media", "media", "/media (mode 0644)"),
    ("opt", "f_opt", "opt", "/opt (mode 0644)"),
    ("outside", "f_outside", "outside", "the workspace's sibling directory (mode 0644)"),
    ("other-ws", "f_other_ws", "other_ws", "another sandbox's workspace (mode 0644)"),
)


def _direct_reads() -> list[Probe]:
    return [
        Probe(
            f"files-read-{name}",
            "files",
            "M1",
            f"read the canary file in {where} by absolute path",
            code(f'show("read", read(P["{key}"]))'),
            SecretSeen((secret,)),
            uses=(key,),
        )
        for name, key, secret, where in _CANARY_FILES
    ]


def _symlink_reads() -> list[Probe]:
    out = []
    for name, key, secret in (
        ("home", "f_home", "home"),
        ("ssh", "f_ssh", "ssh"),
        ("etc", "f_etc", "etc"),
        ("outside", "f_outside", "outside"),
        ("other-ws", "f_other_ws", "other_ws"),
    ):
        out.append(
            Probe(
                f"files-symlink-{name}",
                "files",
                "M1",
                f"read the {name} canary through a symlink planted in the workspace",
                code('show("via link", read(P["ws"] + "/planted-link"))'),
                SecretSeen((secret,)),
                steps=(Symlink("{ws}/planted-link", f"{{{key}}}"),),
                uses=(key,),
            )
        )
    return out


_ROUTES: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    (
        "files-symlink-root-dir",
        "read the $HOME canary through a planted symlink to /",
        'show("via /", read(P["ws"] + "/rootlink" + P["f_home"]))',
        "home",
        (),
    ),
    (
        "files-symlink-dotdot",
        "read the sibling canary through a planted relative symlink ../..",
        'show("via ../..", read(P["ws"] + "/up/outside/secret.txt"))',
        "outside",
        (),
    ),
    (
        "files-dotdot-relative",
        "read the sibling canary with a relative ../ path from the workspace",
        'os.chdir(P["ws"]); show("../", read("../../outside/secret.txt"))',
        "outside",
        (),
    ),
    (
        "files-dotdot-absolute",
        "read the sibling canary with an un-normalised absolute ws/../.. path",
        'show("ws/../..", read(P["ws"] + "/../../outside/secret.txt"))',
        "outside",
        (),
    ),
    (
        "files-dotdot-deep",
        "read the $HOME canary with twenty ../ from the workspace",
        'show("deep", read(P["ws"] + "/" + "../" * 20 + P["f_home"].lstrip("/")))',
        "home",
        (),
    ),
    (
        "files-tilde-home",
        "read the $HOME canary by its name under ~ (the sandbox's own $HOME)",
        'show("~", read(os.path.expanduser("~/") + os.path.basename(P["f_home"])))',
        "home",
        (),
    ),
    (
        "files-proc-self-root",
        "read the $HOME canary through /proc/self/root",
        'show("/proc/self/root", read("/proc/self/root" + P["f_home"]))',
        "home",
        (),
    ),
    (
        "files-proc-self-cwd",
        "read the sibling canary through /proc/self/cwd/../..",
        'os.chdir(P["ws"]); show("cwd", read("/proc/self/cwd/../../outside/secret.txt"))',
        "outside",
        (),
    ),
    (
        "files-proc-1-root",
        "read the $HOME canary through /proc/1/root (pid 1's view of /)",
        'show("/proc/1/root", read("/proc/1/root" + P["f_home"]))',
        "home",
        (),
    ),
    (
        "files-proc-victim-root",
        "read the sibling canary through /proc/<host pid>/root of an outside process",
        'show("victim root", read("/proc/%d/root%s" % (P["victim_pid"], P["f_outside"])))',
        "outside",
        ("victim_pid",),
    ),
    (
        "files-proc-victim-cwd",
        "read a secret in an outside process's cwd through /proc/<host pid>/cwd",
        'show("victim cwd", read("/proc/%d/cwd/secret.txt" % P["victim_pid"]))',
        "victim_cwd",
        ("victim_pid",),
    ),
    (
        "files-proc-victim-fd",
        "read a file an outside process holds open through /proc/<host pid>/fd/N",
        'show("victim fd", read("/proc/%d/fd/%d" % (P["victim_pid"], P["victim_fd"])))',
        "victim_fd",
        ("victim_pid",),
    ),
)


def _routes() -> list[Probe]:
    out = []
    for pid, desc, body, secret, uses in _ROUTES:
        steps: tuple[Symlink, ...] = ()
        if pid == "files-symlink-root-dir":
            steps = (Symlink("{ws}/rootlink", "/"),)
        elif pid == "files-symlink-dotdot":
            steps = (Symlink("{ws}/up", "../.."),)
        baseline = None
        if pid == "files-proc-1-root":
            baseline = "hosts whose pid 1 is shielded (a VM agent, another userns) refuse even root"
        out.append(
            Probe(
                pid,
                "files",
                "M1",
                desc,
                code(body),
                SecretSeen((secret,)),
                steps=steps,
                uses=uses,
                baseline=baseline,
            )
        )
    return out


_SCANS = [
    Probe(
        "files-proc-scan-root",
        "files",
        "M1",
        "read the $HOME canary through /proc/<pid>/root of every visible process",
        code("""
        for pid in [d for d in os.listdir("/proc") if d.isdigit()]:
            show("pid " + pid, read("/proc/%s/root%s" % (pid, P["f_home"])))
        """),
        SecretSeen(("home",)),
    ),
    Probe(
        "files-walk-homes",
        "files",
        "M1",
        "enumerate /root and /home like a credential stealer, printing canary lines",
        code("""
        for top in ("/root", "/home", os.path.expanduser("~")):
            for d, dirs, files in os.walk(top):
                if d.count("/") - top.count("/") > 3:
                    dirs[:] = []
                for f in files:
                    show(os.path.join(d, f), read(os.path.join(d, f), 4096))
        """),
        SecretSeen(("home", "ssh", "home_dir")),
    ),
    Probe(
        "files-walk-data-dirs",
        "files",
        "M1",
        "enumerate host data directories (/etc /var/tmp /srv /mnt /media /opt /run /tmp)",
        code("""
        for top in ("/etc", "/var/tmp", "/srv", "/mnt", "/media", "/opt", "/run", "/tmp"):
            for d, dirs, files in os.walk(top):
                if d.count("/") - top.count("/") > 2:
                    dirs[:] = []
                for f in files:
                    if "corral-verify" in os.path.join(d, f):
                        show(os.path.join(d, f), read(os.path.join(d, f), 4096))
        """),
        SecretSeen(("etc", "var_tmp", "srv", "mnt", "media", "opt", "run", "tmp", "outside")),
    ),
    Probe(
        "files-open-by-handle",
        "files",
        "M1",
        "open the $HOME canary by a file handle (open_by_handle_at, the 'shocker' escape)",
        code("""
        h = bytes.fromhex(P["handle_hex"])
        buf = ctypes.create_string_buffer(struct.pack("iI", len(h), P["handle_type"]) + h)
        try:
            mfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            mfd = -1
        r, e = sysc("open_by_handle_at", mfd, buf, os.O_RDONLY)
        if r >= 0:
            show("by handle", os.read(r, 4096))
        sys_result("open_by_handle_at", r, e)
        """),
        SecretSeen(("home",)),
        uses=("handle_hex",),
    ),
    Probe(
        "files-hardlink-out",
        "files",
        "M1",
        "create a hard link in the workspace to the sibling canary and read it",
        code("""
        dst = P["ws"] + "/hl-" + MARKER
        try:
            os.link(P["f_outside"], dst)
        except OSError as e:
            print("link:", errname(e.errno))
        show("via hard link", read(dst))
        """),
        AnyOf(
            (
                SecretSeen(("outside",)),
                Fact("linked", "a hard link to the outside file exists in the workspace"),
            )
        ),
        checks=(SameInode("linked", "{ws}/hl-{marker}", "{f_outside}"),),
    ),
    Probe(
        "files-hardlink-etc",
        "files",
        "M1",
        "create a hard link in the workspace to the root-only /etc canary and read it",
        code("""
        dst = P["ws"] + "/hl-" + MARKER
        try:
            os.link(P["f_etc"], dst)
        except OSError as e:
            print("link:", errname(e.errno))
        show("via hard link", read(dst))
        """),
        AnyOf(
            (
                SecretSeen(("etc",)),
                Fact("linked", "a hard link to the /etc canary exists in the workspace"),
            )
        ),
        checks=(SameInode("linked", "{ws}/hl-{marker}", "{f_etc}"),),
    ),
    Probe(
        "files-read-shadow",
        "files",
        "M1",
        "read /etc/shadow (reports only whether it could; the content is never printed)",
        code("""
        t = read("/etc/shadow")
        result(t.startswith("root:"), detail=t[:12] if t.startswith("ERR") else "%d bytes" % len(t))
        """),
        Reported(),
    ),
    Probe(
        "files-read-block-device",
        "files",
        "M1",
        "read the first sector of a host block device (raw disk, bypassing every file permission)",
        code("""
        import stat as st
        got = None
        for d in sorted(os.listdir("/dev")):
            try:
                if not st.S_ISBLK(os.stat("/dev/" + d).st_mode):
                    continue
                with open("/dev/" + d, "rb") as f:
                    n = len(f.read(512))
                if n:
                    got = (d, n)
                    break
            except OSError as e:
                print(d, errname(e.errno))
        result(bool(got), device=got)
        """),
        Reported(),
        baseline="needs a readable block device node; some hosts (VMs, containers) expose none",
    ),
    Probe(
        "files-read-kmsg",
        "files",
        "M1",
        "read the host kernel log through /dev/kmsg",
        code("""
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            n = len(os.read(fd, 8192))
            result(n > 0, bytes=n)
        except OSError as e:
            result(False, errno=errname(e.errno))
        """),
        Reported(),
    ),
]


def _writes() -> list[Probe]:
    targets: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
        ("usr", "/usr/corral-verify-{marker}", "create a file in /usr", ()),
        (
            "usr-local-bin",
            "/usr/local/bin/corral-verify-{marker}",
            "plant an executable in /usr/local/bin (PATH)",
            (),
        ),
        ("etc", "/etc/corral-verify-{marker}", "create a file in /etc", ()),
        ("home", "{home}/corral-verify-{marker}", "create a file in the caller's $HOME", ()),
        ("ssh", "{ssh_dir}/corral-verify-{marker}", "create a file in /root/.ssh", ("ssh_dir",)),
        (
            "ws-parent",
            "{ws_parent}/corral-verify-{marker}",
            "create a file in the workspace's parent",
            (),
        ),
        (
            "outside-dir",
            "{outside_dir}/corral-verify-{marker}",
            "create a file in the workspace's sibling",
            (),
        ),
        (
            "other-ws",
            "{other_ws}/corral-verify-{marker}",
            "create a file in another sandbox's workspace",
            (),
        ),
        ("tmp", "/tmp/corral-verify-{marker}", "create a file in the host's /tmp", ()),
        ("var-tmp", "/var/tmp/corral-verify-{marker}", "create a file in the host's /var/tmp", ()),
        ("dev-shm", "/dev/shm/corral-verify-{marker}", "create a file in the host's /dev/shm", ()),
        ("run", "/run/corral-verify-{marker}", "create a file in the host's /run", ()),
    )
    out = [
        Probe(
            f"files-write-{name}",
            "files",
            "M2",
            desc,
            code(
                """
              path = TEMPLATE.format(**P)
              try:
                  with open(path, "w") as f:
                      f.write("corral-verify " + MARKER)
                  print("wrote", path)
              except OSError as e:
                  print("write:", errname(e.errno))
              """.replace("TEMPLATE", repr(tmpl))
            ),
            Fact("created", f"{tmpl} was created on the host"),
            checks=(PathExists("created", tmpl),),
            uses=uses,
        )
        for name, tmpl, desc, uses in targets
    ]
    out += [
        Probe(
            "files-write-dotdot",
            "files",
            "M2",
            "create a file at workspace/../ (an un-normalised path)",
            code("""
              try:
                  open(P["ws"] + "/../corral-verify-" + MARKER, "w").close()
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("created", "the file appeared in the workspace's parent"),
            checks=(PathExists("created", "{ws_parent}/corral-verify-{marker}"),),
        ),
        Probe(
            "files-write-symlink-parent",
            "files",
            "M2",
            "create a file through a planted symlink to the workspace's parent",
            code("""
              try:
                  open(P["ws"] + "/up/corral-verify-" + MARKER, "w").close()
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("created", "the file appeared in the workspace's parent"),
            steps=(Symlink("{ws}/up", ".."),),
            checks=(PathExists("created", "{ws_parent}/corral-verify-{marker}"),),
        ),
        Probe(
            "files-write-symlink-etc",
            "files",
            "M2",
            "create a file through a planted symlink to /etc",
            code("""
              try:
                  open(P["ws"] + "/etcdir/corral-verify-" + MARKER, "w").close()
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("created", "the file appeared in /etc"),
            steps=(Symlink("{ws}/etcdir", "/etc"),),
            checks=(PathExists("created", "/etc/corral-verify-{marker}"),),
        ),
        Probe(
            "files-write-dangling-symlink",
            "files",
            "M2",
            "open(O_CREAT) a planted dangling symlink whose target is outside the workspace",
            code("""
              try:
                  open(P["ws"] + "/dangle", "w").close()
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("created", "the symlink's outside target was created"),
            steps=(Symlink("{ws}/dangle", "{ws_parent}/corral-verify-{marker}"),),
            checks=(PathExists("created", "{ws_parent}/corral-verify-{marker}"),),
        ),
        Probe(
            "files-modify-outside",
            "files",
            "M2",
            "overwrite a world-writable file outside the workspace",
            code("""
              try:
                  with open(P["f_writable"], "a") as f:
                      f.write("corral-verify " + MARKER + "\\n")
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("changed", "the outside file changed"),
            checks=(FileChanged("changed", "{f_writable}"),),
        ),
        Probe(
            "files-chmod-outside",
            "files",
            "M2",
            "chmod a world-writable file outside the workspace",
            code("""
              try:
                  os.chmod(P["f_writable"], 0o777)
              except OSError as e:
                  print("chmod:", errname(e.errno))
              """),
            Fact("changed", "the outside file's mode changed"),
            checks=(FileChanged("changed", "{f_writable}"),),
        ),
        Probe(
            "files-write-proc-victim-cwd",
            "files",
            "M2",
            "overwrite a file in an outside process's cwd through /proc/<host pid>/cwd",
            code("""
              try:
                  with open("/proc/%d/cwd/writable.txt" % P["victim_pid"], "a") as f:
                      f.write("corral-verify " + MARKER + "\\n")
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("changed", "the file in the victim's cwd changed"),
            checks=(FileChanged("changed", "{victim_cwd}/writable.txt"),),
            uses=("victim_pid",),
        ),
        Probe(
            "files-rename-out",
            "files",
            "M2",
            "rename a workspace file to the workspace's parent",
            code("""
              src = P["ws"] + "/movable"
              open(src, "w").close()
              try:
                  os.rename(src, P["ws_parent"] + "/corral-verify-" + MARKER)
              except OSError as e:
                  print("rename:", errname(e.errno))
              """),
            Fact("created", "the file appeared in the workspace's parent"),
            checks=(PathExists("created", "{ws_parent}/corral-verify-{marker}"),),
        ),
        Probe(
            "files-hardlink-write",
            "files",
            "M2",
            "hard-link a world-writable outside file into the workspace and write through it",
            code("""
              dst = P["ws"] + "/hlw"
              try:
                  os.link(P["f_writable"], dst)
                  with open(dst, "a") as f:
                      f.write("corral-verify " + MARKER + "\\n")
              except OSError as e:
                  print("link/write:", errname(e.errno))
              """),
            Fact("changed", "the outside file changed"),
            checks=(FileChanged("changed", "{f_writable}"),),
        ),
        Probe(
            "files-mount-over-workspace",
            "files",
            "M2",
            "mount a tmpfs inside the workspace and leave it mounted (host mount table)",
            code("""
              d = P["ws"] + "/mnt-" + MARKER
              os.makedirs(d, exist_ok=True)
              r, e = sysc("mount", "none", d, "tmpfs", 0, "size=1m")
              sys_result("mount", r, e)
              """),
            Fact("mounted", "a mount appeared in the host's mount table"),
            checks=(MountedAt("mounted", "{ws}/mnt-{marker}"),),
        ),
        Probe(
            "files-workspace-is-root",
            "files",
            "M2",
            "ask for a workspace that is a symlink to / and write to /etc through it",
            code("""
              name = "/etc/corral-verify-" + MARKER
              for path in (name, P["workspace"] + name):
                  try:
                      open(path, "w").close()
                  except OSError as e:
                      print("write:", errname(e.errno))
              """),
            Fact("created", "the file appeared in /etc"),
            workspace="{ws}/rootlink",
            refusal_ok=True,
            steps=(Symlink("{ws}/rootlink", "/"),),
            checks=(PathExists("created", "/etc/corral-verify-{marker}"),),
        ),
        Probe(
            "files-workspace-is-home",
            "files",
            "M2",
            "ask for the caller's $HOME as the workspace and write into it",
            code("""
              try:
                  open(P["home"] + "/corral-verify-" + MARKER, "w").close()
              except OSError as e:
                  print("write:", errname(e.errno))
              """),
            Fact("created", "the file appeared in $HOME"),
            workspace="{home}",
            refusal_ok=True,
            checks=(PathExists("created", "{home}/corral-verify-{marker}"),),
        ),
    ]
    return out


PROBES: list[Probe] = _direct_reads() + _symlink_reads() + _routes() + _SCANS + _writes()
