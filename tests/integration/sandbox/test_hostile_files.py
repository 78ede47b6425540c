"""M13: a sandbox cannot leave a setuid/setgid (or file-capability) file on the host.

Each test performs the attack through the real `corral exec` and judges by
what the host sees afterwards: the on-disk mode (lstat on the host), and for
the setuid copy of `id`, what it reports when another local user runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.broker.journal import read_rows

from .conftest import ExecFn, corral_argv

pytestmark = [pytest.mark.requires_sandbox]

SETID = stat.S_ISUID | stat.S_ISGID

# Every way a program asks for the bits: the chmod family (incl. fchmodat2 by
# number), the open family with O_CREAT/O_TMPFILE, mkdir, mknod, and the tools
# (cp -p of a setuid system binary, install -m, tar -p).
ATTACK = r"""
import ctypes, os, shutil, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
def sc(*a):
    r = libc.syscall(*a)
    return "OK" if r >= 0 else os.strerror(ctypes.get_errno())
def tried(name, fn):
    try:
        fn(); print(name, "OK")
    except OSError as e:
        print(name, e.strerror)
shutil.copy("/usr/bin/id", "chmod_suid")
tried("chmod", lambda: os.chmod("chmod_suid", 0o4755))
shutil.copy("/usr/bin/id", "fchmod_sgid")
fd = os.open("fchmod_sgid", os.O_RDONLY)
tried("fchmod", lambda: os.fchmod(fd, 0o2755))
shutil.copy("/usr/bin/id", "fchmodat2")
print("fchmodat2", sc(452, AT_FDCWD, b"fchmodat2", 0o4755, 0))
print("fchmodat_hi", sc(268, AT_FDCWD, b"chmod_suid", 0xFFFFFFFF00000000 | 0o4755, 0))
tried("open", lambda: os.close(os.open("open_suid", os.O_CREAT | os.O_WRONLY, 0o4755)))
tried("tmpfile", lambda: os.close(os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4700)))
print("creat", sc(85, b"creat_sgid", 0o2755))
tried("mkdir", lambda: os.mkdir("mkdir_sgid", 0o2755))
print("mknod", sc(133, b"mknod_suid", 0o104755, 0))
print("openat2", sc(437, AT_FDCWD, b"o2", ctypes.create_string_buffer(24), 24))
for cmd in ("cp -p /usr/bin/su cp_p_su", "install -m 4755 /usr/bin/id install_suid",
            "mkdir t && cp /usr/bin/id t/x && tar -cf t.tar t && rm -r t"):
    subprocess.run(["sh", "-c", cmd], stderr=subprocess.DEVNULL)
"""


def _setid_files(root: Path) -> list[str]:
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            if os.lstat(p).st_mode & SETID:
                bad.append(os.path.relpath(p, root))
    return bad


def _results(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        name, _, verdict = line.partition(" ")
        out[name] = verdict
    return out


def test_no_call_leaves_a_setid_file_on_the_host(corral_exec: ExecFn, workspace: Path) -> None:
    (workspace / "attack.py").write_text(ATTACK)
    out = corral_exec("python3", "attack.py")
    assert out.code == 0, out.stderr
    res = _results(out.stdout)
    for name in ("chmod", "fchmod", "fchmodat2", "fchmodat_hi", "open", "tmpfile", "creat"):
        assert res[name] == "Operation not permitted", (name, res)
    assert res["mknod"] == "Operation not permitted"
    assert res["mkdir"] == "OK"  # allowed: the kernel drops S_ISGID from mkdir's mode
    assert res["openat2"] == "Function not implemented"
    assert (workspace / "cp_p_su").is_file()  # cp -p itself runs, without the bits
    assert _setid_files(workspace) == []


@pytest.fixture
def public_workspace() -> Iterator[Path]:
    """A workspace another local user can reach (pytest's tmp_path is 0700)."""
    ws = Path(tempfile.mkdtemp(prefix="corral-m13-", dir="/tmp"))
    ws.chmod(0o755)
    try:
        yield ws
    finally:
        shutil.rmtree(ws, ignore_errors=True)


@pytest.mark.requires_root
def test_setuid_copy_of_id_does_not_run_as_root_for_another_user(
    corral_exec: ExecFn, public_workspace: Path
) -> None:
    out = corral_exec(
        "sh", "-c", "cp /usr/bin/id suid; chmod 4755 suid; chmod u+s suid", ws=public_workspace
    )
    assert out.code != 0  # chmod refused
    suid = public_workspace / "suid"
    assert suid.stat().st_uid == 0  # the idmap hands the caller (root) the file
    ran = subprocess.run(
        ["runuser", "-u", "nobody", "--", str(suid)],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("uid=65534") and "euid=0" not in ran.stdout, ran.stdout


def test_file_capabilities_cannot_be_set(corral_exec: ExecFn, workspace: Path) -> None:
    # The sandbox holds no CAP_SETFCAP in its user namespace, so the kernel
    # refuses security.capability (v2 and the namespaced v3 form) itself.
    script = (
        "import os, shutil, struct\n"
        "shutil.copy('/usr/bin/id', 'capf')\n"
        "for blob in (struct.pack('<5I', 0x02000001, 1 << 7, 1 << 7, 0, 0),\n"
        "             struct.pack('<6I', 0x03000001, 1 << 7, 1 << 7, 0, 0, 0)):\n"
        "    try:\n"
        "        os.setxattr('capf', 'security.capability', blob); print('OK')\n"
        "    except OSError as e:\n"
        "        print(e.strerror)\n"
    )
    out = corral_exec("python3", "-c", script)
    assert out.stdout.split("\n")[:2] == ["Operation not permitted"] * 2, out
    assert "security.capability" not in os.listxattr(workspace / "capf")


def test_hard_link_to_a_host_setuid_binary_is_refused(corral_exec: ExecFn, workspace: Path) -> None:
    out = corral_exec("sh", "-c", "ln /usr/bin/su su; ln /usr/bin/passwd pw; ls")
    assert not (workspace / "su").exists() and not (workspace / "pw").exists(), out.stdout
    assert _setid_files(workspace) == []


def test_setid_bits_already_in_the_workspace_are_cleared_after_the_run(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    deep = workspace / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "pre").write_bytes(b"#!/bin/sh\n")
    (deep / "pre").chmod(0o6755)
    (workspace / "a").chmod(0o2755)
    (workspace / "link").symlink_to("/usr/bin/su")
    journal = tmp_path / "j.sqlite"
    out = corral_exec("true", opts=("--journal", str(journal)))
    assert out.code == 0, out.stderr
    rows = [r.to_json_dict() for r in read_rows(journal)]
    stripped = [r for r in rows if "setid_stripped" in json.dumps(r)]
    assert len(stripped) == 1 and stripped[0]["decision"] == "deny", rows
    assert _setid_files(workspace) == []
    assert stat.S_IMODE((deep / "pre").stat().st_mode) == 0o755
    # The walk never follows a symlink out of the tree.
    assert os.stat("/usr/bin/su").st_mode & stat.S_ISUID


# --- grants through planted symlinks ---------------------------------------------


@pytest.mark.parametrize("flag", ["--ro", "--rw"])
def test_a_grant_through_a_symlink_the_sandbox_planted_is_refused(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path, flag: str
) -> None:
    sibling = tmp_path / "sibling"
    sibling.mkdir()
    (sibling / "secret").write_text("host-secret-5e1f")
    # Run 1 plants the link; the target is a host directory outside the workspace.
    planted = corral_exec("ln", "-s", str(sibling), "docs")
    assert planted.code == 0 and (workspace / "docs").is_symlink(), planted.stderr
    # Run 2 asks for the planted name, and tries to read and write through it.
    docs = str(workspace / "docs")
    out = corral_exec(
        "sh",
        "-c",
        f"cat {docs}/secret; echo pwned > {docs}/dropped",
        opts=(flag, docs),
    )
    assert out.code == 2, out
    assert "goes through the symlink" in out.stderr and docs in out.stderr
    assert "host-secret-5e1f" not in out.stdout
    assert sorted(os.listdir(sibling)) == ["secret"]


def test_a_grant_below_a_planted_symlink_is_refused(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    sibling = tmp_path / "sibling"
    (sibling / "deeper").mkdir(parents=True)
    (workspace / "link").symlink_to(sibling)
    out = corral_exec("true", opts=("--rw", str(workspace / "link" / "deeper")))
    assert out.code == 2 and "symlink" in out.stderr, out


# --- corral's own state out of the sandbox's reach ---------------------------------


def test_a_journal_inside_the_workspace_is_refused(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    # From the project directory, `--journal j.sqlite` lands in the workspace.
    attack = "sqlite3 j.sqlite 'DROP TRIGGER IF EXISTS no_update' ; rm -f j.sqlite; true"
    proc = subprocess.run(
        [*corral_argv("--journal", "j.sqlite", "--", "sh", "-c", attack)],
        cwd=workspace,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--journal j.sqlite is inside the workspace" in proc.stderr
    assert not (workspace / "j.sqlite").exists()
    # The same directory reached through a symlink is the same directory.
    (tmp_path / "alias").symlink_to(workspace)
    out = corral_exec("true", opts=("--journal", str(tmp_path / "alias" / "j.sqlite")))
    assert out.code == 2 and "inside the workspace" in out.stderr, out
    # A journal in a --rw tree is writable by the sandbox as well.
    rw = tmp_path / "rw"
    rw.mkdir()
    out = corral_exec("true", opts=("--rw", str(rw), "--journal", str(rw / "j.sqlite")))
    assert out.code == 2 and f"writable path {rw}" in out.stderr, out
    # Outside every writable tree it works.
    out = corral_exec("true", opts=("--journal", str(tmp_path / "j.sqlite")))
    assert out.code == 0 and (tmp_path / "j.sqlite").is_file(), out


def test_a_workspace_holding_corral_runs_is_refused(corral_exec: ExecFn, workspace: Path) -> None:
    run = workspace / ".corral" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "journal.sqlite").write_bytes(b"precious")
    out = corral_exec("sh", "-c", "rm -rf .corral")
    assert out.code == 2 and ".corral/runs" in out.stderr, out
    assert (run / "journal.sqlite").read_bytes() == b"precious"


@pytest.mark.requires_root
def test_through_a_bind_mount(tmp_path: Path) -> None:
    import subprocess

    ws = tmp_path / "ws"
    ws.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    # A private mount namespace for the bind, in a child: nothing leaks to the host.
    code = (
        "import os, sys; from corral.sandbox.placement import writable_tree_of; "
        f"os.system('mount --bind {ws} {other}'); "
        f"sys.exit(0 if writable_tree_of('{other}/j.sqlite', ['{ws}']) == '{ws}' else 3)"
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        executable="/usr/bin/unshare",
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.requires_root
def test_staging_rechecks_the_grant_after_a_swap(tmp_path: Path) -> None:
    # `corral exec` checked WS/docs when it was a directory; by the time the
    # launcher stages the bind, a concurrent sandbox has swapped in a symlink.
    # The staging step opens the path again under the same rule and refuses.
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "docs").symlink_to("/etc")
    code = (
        "import os, sys\n"
        "from corral.errors import UsageError\n"
        "from corral.sandbox import mounts\n"
        "fd = mounts.make_userns_fd(0, 0, 64000, 64000)\n"
        "mounts.make_private_mount_ns()\n"
        "try:\n"
        f"    mounts.stage_bind(0, {str(ws / 'docs')!r}, False, fd)\n"
        "except UsageError as exc:\n"
        "    print('refused:', exc); sys.exit(0)\n"
        "print('staged', sorted(os.listdir(mounts.staged_path(0)))[:3]); sys.exit(1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=30
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "goes through the symlink" in proc.stdout


def test_a_tree_too_deep_to_check_fails_closed(corral_exec: ExecFn, workspace: Path) -> None:
    # The sandbox builds a tree deeper than the walk's bound: corral cannot
    # vouch for what lies below it, so the run is not reported as clean.
    script = "import os\nfor _ in range(300):\n    os.mkdir('d'); os.chdir('d')\nprint('deep')\n"
    out = corral_exec("python3", "-c", script)
    assert "deep" in out.stdout
    assert out.code == 125, out
    assert "cannot clear setuid/setgid bits" in out.stderr
    assert out.summary.get("exit") == 125


@pytest.mark.requires_root
@pytest.mark.parametrize("flag", ["--workspace", "--rw"])
def test_corral_cache_cannot_be_handed_to_a_sandbox(workspace: Path, flag: str) -> None:
    # /var/cache/corral holds the compiled init and seccomp filter the next
    # sandbox starts with; a sandbox that can write it disarms every later one.
    cache = Path("/var/cache/corral")
    cache.mkdir(parents=True, exist_ok=True)
    target = str(cache) if flag == "--workspace" else "/var/cache"
    planted = f"{target}/planted-by-sandbox-{os.getpid()}"
    proc = subprocess.run(
        corral_argv(
            *((flag, target) if flag == "--rw" else ()),
            "--workspace",
            target if flag == "--workspace" else str(workspace),
            "--",
            "touch",
            planted,
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    landed = os.path.lexists(planted)
    if landed:
        os.unlink(planted)
    assert proc.returncode == 2, proc.stderr
    assert "overlaps corral's cache" in proc.stderr
    assert not landed


def test_writable_trees_are_nosuid_inside(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    # Defence in depth for the sandbox side only: the host's own mount of the
    # same tree still honours the bits, which is why they are refused and cleared.
    rw = tmp_path / "rw"
    rw.mkdir()
    out = corral_exec("cat", "/proc/self/mountinfo", opts=("--rw", str(rw)))
    assert out.code == 0, out.stderr
    for tree in (str(workspace), str(rw), "/tmp"):
        (line,) = [ln for ln in out.stdout.splitlines() if ln.split()[4] == tree]
        assert "nosuid" in line.split()[5].split(","), line


def test_a_setid_rw_file_is_cleared(corral_exec: ExecFn, tmp_path: Path) -> None:
    f = tmp_path / "tool"
    f.write_bytes(b"#!/bin/sh\n")
    f.chmod(0o4755)
    out = corral_exec("true", opts=("--rw", str(f)))
    assert out.code == 0, out.stderr
    assert stat.S_IMODE(f.stat().st_mode) == 0o755
