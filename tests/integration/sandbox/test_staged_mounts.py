"""The mounts staged before bwrap (`sandbox/stage.py`, issue 13) hold the guarantees
bwrap's own binds gave, and more: they are locked read-only inside the sandbox.

The attacker here has what the sandbox never gets: every capability in the
sandbox's user namespace (a helper joins that namespace and its mount
namespace from the host). Read-only binds that bwrap makes itself can then be
remounted writable or unmounted; mounts that exist before bwrap unshares its
user namespace are copied into it with MNT_LOCK_READONLY and MNT_LOCKED, so
they cannot. Each outcome is judged on the host: the host's copy of the
host-executed placeholder, the sandbox's /etc as the host reads it through
/proc/PID/root, and the sandbox's mount table as the host reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.sandbox import bwrap as bw
from corral.sandbox.namespace import _group, _hosts, _passwd

from .conftest import ExecFn, corral_argv, processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox]

# Runs as root on the host; joins the sandbox's user and mount namespaces
# (all capabilities there), then attacks. Prints what each step returned.
_ATTACK = r"""
import ctypes, fcntl, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid, ws = sys.argv[1], sys.argv[2]
# The strongest position short of the host: every capability in the user
# namespace that owns the sandbox's mount namespace (NS_GET_USERNS; bwrap
# runs the command in a nested one). Join the mount namespace first, while
# still root of the host's user namespace.
mnt = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
owner = fcntl.ioctl(mnt, 0xB701)
for ns, fd, flag in (("mnt", mnt, 0x00020000), ("user", owner, 0x10000000)):
    if libc.setns(fd, flag) != 0:
        raise SystemExit(f"setns {ns}: {os.strerror(ctypes.get_errno())}")
out = {}
def remount_rw(path):
    # MS_REMOUNT|MS_BIND|MS_NOSUID|MS_NODEV|MS_RELATIME: only read-only dropped.
    r = libc.mount(None, path.encode(), None, 0x20 | 0x1000 | 0x2 | 0x4 | 0x200000, None)
    out["remount " + path] = "ok" if r == 0 else os.strerror(ctypes.get_errno())
def umount(path):
    r = libc.umount2(path.encode(), 2)  # MNT_DETACH
    out["umount " + path] = "ok" if r == 0 else os.strerror(ctypes.get_errno())
def write(path, data):
    try:
        with open(path, "wb") as fh:
            fh.write(data)
        out["write " + path] = "ok"
    except OSError as exc:
        out["write " + path] = exc.strerror
for path in ("/etc", "/etc/passwd", "/etc/ssl", f"{ws}/.git", f"{ws}/.bashrc"):
    remount_rw(path)
write("/etc/passwd", b"root::0:0::/:/bin/sh\n")
write(f"{ws}/.bashrc", b"echo pwned-by-remount\n")
try:
    os.mkdir(f"{ws}/.git/hooks")
    out["mkdir hooks"] = "ok"
except OSError as exc:
    out["mkdir hooks"] = exc.strerror
# Not /etc itself: the top of each of bwrap's binds (/, /usr, /etc, the
# workspace) is bwrap's own mount in this namespace, unlocked; below it is
# only bwrap's empty root tmpfs.
for path in (f"{ws}/.bashrc", f"{ws}/.git", "/etc/ssl"):
    umount(path)
write(f"{ws}/.bashrc", b"echo pwned-by-umount\n")
print(json.dumps(out))
"""


def _mounts(pid: int) -> dict[str, tuple[str, str]]:
    """mount point -> (mount id, per-mount options) of the sandbox, read by the host
    (the topmost mount at each point)."""
    out: dict[str, tuple[str, str]] = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        f = line.split()
        out[f[4]] = (f[0], f[5])
    return out


def _sandboxed_sh(marker: str) -> int | None:
    for pid in processes_with(marker):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sh":
                return pid
        except OSError:
            continue
    return None


@pytest.mark.requires_root
def test_staged_mounts_resist_a_privileged_remount_and_unmount(
    workspace: Path, marker: str
) -> None:
    host_before = Path("/proc/self/mountinfo").read_text()
    argv = corral_argv("--workspace", str(workspace), "--", "sh", "-c", "sleep 60; :", marker)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: _sandboxed_sh(marker) is not None, 20)
        pid = _sandboxed_sh(marker)
        assert pid is not None
        ws = str(workspace)
        before = _mounts(pid)
        # /etc itself is a mount only when staged; /etc/ssl and the guards always are.
        held = {
            p: before[p] for p in ("/etc", "/etc/ssl", f"{ws}/.git", f"{ws}/.bashrc") if p in before
        }
        assert {"/etc/ssl", f"{ws}/.git", f"{ws}/.bashrc"} <= set(held), sorted(before)
        assert all("ro" in opts.split(",") for _, opts in held.values()), held
        # Nothing staged is visible in the host's mount namespace.
        assert "corral-etc" not in Path("/proc/self/mountinfo").read_text()
        assert Path("/proc/self/mountinfo").read_text() == host_before

        done = subprocess.run(
            [sys.executable, "-I", "-c", _ATTACK, str(pid), ws],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout)

        # The host-executed placeholders on the host are untouched ...
        assert (workspace / ".bashrc").read_bytes() == b"", said
        assert list((workspace / ".git").iterdir()) == [], said
        # ... the sandbox's /etc is what corral wrote ...
        assert Path(f"/proc/{pid}/root/etc/passwd").read_bytes() == _passwd("/home/corral"), said
        # ... and every staged mount is still there and read-only.
        after = _mounts(pid)
        for path, (mid, _) in held.items():
            assert path in after and after[path][0] == mid, (path, said)
            assert "ro" in after[path][1].split(","), (path, said)
        assert [k for k, v in said.items() if v == "ok"] == [], said
    finally:
        proc.terminate()
        proc.wait(30)
    assert Path("/proc/self/mountinfo").read_text() == host_before


def _digest(path: str) -> str:
    p = Path(path)
    if p.is_symlink():
        return "link:" + os.readlink(p)
    if p.is_dir():
        return "dir:" + ",".join(sorted(os.listdir(p)))
    return "file:" + hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def test_etc_is_exactly_the_allowlist_and_corrals_files(corral_exec: ExecFn) -> None:
    names = sorted(e for e in bw.ETC_ALLOWLIST if os.path.lexists(f"/etc/{e}"))
    script = (
        "cd /etc && for f in $(ls -A); do"
        ' if [ -L "$f" ]; then echo "$f link:$(readlink "$f")";'
        ' elif [ -d "$f" ]; then echo "$f dir:$(ls -A "$f" | sort | paste -sd, -)";'
        ' else echo "$f file:$(sha256sum < "$f" | cut -c1-16)"; fi; done;'
        " test -e /run/corral-stage && echo stage-visible || echo no-stage"
    )
    out = corral_exec("sh", "-c", script)
    assert out.code == 0, out.stderr
    *rows, run = out.stdout.strip().splitlines()
    seen = dict(r.split(" ", 1) for r in rows)
    synthesized = {"passwd": _passwd("/home/corral"), "group": _group(), "hosts": _hosts("corral")}
    assert sorted(seen) == sorted([*names, *synthesized])  # no shadow, nothing else
    for name in names:
        want = _digest(f"/etc/{name}")
        if want.startswith("link:"):  # recreated with its absolute target in /usr
            want = f"link:{bw.etc_link_target(want[5:])}"
        assert seen[name] == want, name
    for name, content in synthesized.items():
        assert seen[name] == "file:" + hashlib.sha256(content).hexdigest()[:16], name
    # The stage directory itself is not in the sandbox.
    assert run == "no-stage"


def test_no_stage_mount_survives_the_sandbox(corral_exec: ExecFn) -> None:
    host_before = Path("/proc/self/mountinfo").read_text()
    out = corral_exec("true")
    assert out.code == 0, out.stderr
    deadline = time.monotonic() + 5
    while Path("/proc/self/mountinfo").read_text() != host_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path("/proc/self/mountinfo").read_text() == host_before


# Runs in a child of its own (a private mount namespace): a workspace name
# swapped for a symlink after the scan must not redirect a guard's self-bind.
_SWAP = r"""
import os, sys
from corral.errors import SandboxStartError
from corral.sandbox import mounts, stage
mounts.make_private_mount_ns()
root = mounts.staged_path(0)
os.mkdir(root)
os.symlink("/etc", f"{root}/.git")
os.symlink("/etc", f"{root}/sub")
out = []
for rel in (".git", "sub/ssl"):
    try:
        stage.self_bind(root, rel, False)
        out.append("bound")
    except SandboxStartError as exc:
        out.append(f"refused {exc.errno}")
with open("/proc/self/mountinfo") as fh:
    table = fh.read()
out.append("mounted" if f" {root}/" in table else "not-mounted")
print(" ".join(out))
"""


@pytest.mark.requires_root
def test_a_guard_swapped_for_a_symlink_is_refused_not_followed() -> None:
    import errno

    done = subprocess.run(
        [sys.executable, "-c", _SWAP], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "refused",
        str(errno.ELOOP),
        "refused",
        str(errno.ELOOP),
        "not-mounted",
    ]


@pytest.mark.requires_root
def test_dry_run_shows_what_is_staged_and_the_unprivileged_argv_is_unchanged(
    workspace: Path,
) -> None:
    from corral.exec.cli import build_spec, parse_args
    from corral.sandbox.namespace import preview_argv

    proc = subprocess.run(
        corral_argv("--workspace", str(workspace), "--dry-run", "--", "true"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    argv, *staged = proc.stdout.splitlines()
    assert "--ro-bind /run/corral-stage/etc /etc" in argv
    assert "--ro-bind-data" not in argv and " /etc/" not in argv
    assert f"# staged: ro-self-bind /run/corral-stage/0/.git {workspace}/.git" in staged
    assert "# staged: file '(68 bytes)' /run/corral-stage/etc/hosts" in staged
    assert os.listdir(workspace) == []  # a dry run creates nothing
    # Without root there is no namespace to stage in: bwrap makes every bind.
    ns, cmd = parse_args(["--workspace", str(workspace), "--", "true"])
    plain = preview_argv(build_spec(ns, cmd, {}), root=False)
    assert "/run/corral-stage/etc" not in plain
    assert plain[plain.index("/etc/passwd") - 2] == "--ro-bind-data"
    assert f"{workspace}/.git" in plain


def test_dev_is_what_bwraps_dev_builds(corral_exec: ExecFn) -> None:
    """As root /dev is staged (`stage.stage_dev`) and bound with one --dev-bind;
    the sandbox must get what bwrap's --dev gives: the same names, nodes,
    links, options, a working pty from its own devpts, a writable /dev/shm."""
    script = (
        "cd /dev && for f in $(ls -A); do"
        ' if [ -L "$f" ]; then echo "$f link $(readlink "$f")";'
        ' elif [ -c "$f" ]; then echo "$f char $(stat -c "%a %t:%T" "$f")";'
        ' else echo "$f dir $(stat -c "%a %u" "$f")"; fi; done;'
        ' awk \'$5 ~ "^/dev" {print "mount", $5, $6, $9}\' /proc/self/mountinfo;'
        " echo x > /dev/shm/probe && echo shm writable;"
        ' python3 -c "import os, pty; m, s = pty.openpty(); os.write(s, b\\"ok\\");'
        ' print(\\"pty\\", os.read(m, 2).decode(), os.stat(os.ttyname(s)).st_uid)"'
    )
    out = corral_exec("sh", "-c", script)
    assert out.code == 0, out.stderr
    got = set(out.stdout.strip().splitlines())
    want = {
        "core link /proc/kcore",
        "fd link /proc/self/fd",
        "full char 666 1:7",
        "null char 666 1:3",
        "ptmx link pts/ptmx",
        "pts dir 755 " + next(r.split()[-1] for r in got if r.startswith("pts dir")),
        "random char 666 1:8",
        "shm dir 755 1000",
        "stderr link /proc/self/fd/2",
        "stdin link /proc/self/fd/0",
        "stdout link /proc/self/fd/1",
        "tty char 666 5:0",
        "urandom char 666 1:9",
        "zero char 666 1:5",
        "mount /dev rw,nosuid,nodev,relatime tmpfs",
        *(f"mount /dev/{n} rw,nosuid,relatime devtmpfs" for n in ("null", "zero", "full")),
        *(f"mount /dev/{n} rw,nosuid,relatime devtmpfs" for n in ("random", "urandom", "tty")),
        "mount /dev/pts rw,nosuid,noexec,relatime devpts",
        "shm writable",
        "pty ok 1000",
    }
    assert got == want


def test_a_grant_under_etc_gets_its_mountpoint(corral_exec: ExecFn) -> None:
    """`--ro /etc/ssh` lands outside every allowlisted entry: the staged /etc
    is read-only by then, so its mountpoint is made while it is staged."""
    if not os.path.isdir("/etc/ssh"):
        pytest.skip("no /etc/ssh on this host")
    out = corral_exec("sh", "-c", "ls -A /etc/ssh; echo ---; ls -A /etc", opts=("--ro", "/etc/ssh"))
    assert out.code == 0, out.stderr
    inside, listing = out.stdout.split("---\n")
    assert sorted(inside.split()) == sorted(os.listdir("/etc/ssh"))
    names = {e for e in bw.ETC_ALLOWLIST if os.path.lexists(f"/etc/{e}")}
    assert set(listing.split()) == names | {"passwd", "group", "hosts", "ssh"}
