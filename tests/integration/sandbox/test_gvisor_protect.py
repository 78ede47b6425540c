"""M6 on gVisor: the protection placeholders are read-only binds in the staged
workspace on the host (one gofer mount carries them all, not one each), and the
planted host-executed files still never reach the host.

The attack is test_protect's (the same plants, then the host runs plain git);
the control is the same attack with every name `--unprotect`ed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.sandbox.protect import PROTECTED_NAMES

from .conftest import ExecFn
from .test_protect import _attack, _host_uses, _repo, _snapshot

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]

_GV = ("--backend", "gvisor")


@pytest.fixture
def repos(workspace: Path) -> Path:
    """test_protect's: a repository, a nested one, one with a separate gitdir."""
    _repo(workspace)
    _repo(workspace / "sub")
    (workspace / "proj").mkdir()
    _repo(workspace / "proj", f"--separate-git-dir={workspace / 'store'}")
    return workspace


def test_planted_files_never_run_on_the_host_under_gvisor(
    corral_exec: ExecFn, repos: Path, tmp_path: Path
) -> None:
    hits = tmp_path / "hits"
    hits.mkdir()
    before = _snapshot(repos)
    attack = _attack(hits) + "\nmv .envrc e2; mv .git g2; rm -rf .git; mkdir .git/hooks2; true"
    out = corral_exec("sh", "-c", attack, opts=_GV, timeout=120)
    assert out.code == 0, out.stderr
    assert (repos / "work.txt").read_text() == "ordinary\n"  # ordinary work still lands
    _host_uses(repos)
    assert sorted(os.listdir(hits)) == []
    assert _snapshot(repos) == before
    for rel in (".envrc", ".vscode", ".bashrc", ".mcp.json", "e2", "g2", ".git/hooks2"):
        assert not os.path.lexists(repos / rel), rel
    for hooks in (repos / ".git", repos / "sub" / ".git", repos / "store"):
        assert not (hooks / "hooks" / "pre-commit").exists()
    assert (repos / ".git" / "HEAD").is_file()


def test_placeholders_are_one_mount_and_leave_nothing(corral_exec: ExecFn, workspace: Path) -> None:
    """Inside, every placeholder is there and read-only, on the workspace's own
    device (no mount of its own); after teardown the workspace is empty."""
    check = (
        "import os, sys\n"
        "dev = os.stat('.').st_dev\n"
        "for n in sys.argv[1:]:\n"
        "    assert os.stat(n).st_dev == dev, n\n"
        "    try:\n"
        "        open(n, 'a') if os.path.isfile(n) else open(os.path.join(n, 'x'), 'w')\n"
        "    except OSError:\n"
        "        continue\n"
        "    sys.exit('writable: ' + n)\n"
    )
    out = corral_exec("python3", "-I", "-c", check, *PROTECTED_NAMES, opts=_GV, timeout=120)
    assert out.code == 0, out.stderr
    assert os.listdir(workspace) == []


def test_control_unprotected_names_do_run_on_the_host_under_gvisor(
    corral_exec: ExecFn, repos: Path, tmp_path: Path
) -> None:
    """The same attack with every name unprotected reaches the host: the test
    above is not passing because the attack is broken."""
    hits = tmp_path / "hits"
    hits.mkdir()
    opts = (*_GV, *(a for n in PROTECTED_NAMES for a in ("--unprotect", n)))
    out = corral_exec("sh", "-c", _attack(hits), opts=opts, timeout=120)
    assert out.code == 0, out.stderr
    _host_uses(repos)
    assert {"pre-commit", "fsmonitor", "sub-pre-commit", "store-pre-commit"} <= set(
        os.listdir(hits)
    )
    assert (repos / ".envrc").read_text().startswith("touch")
