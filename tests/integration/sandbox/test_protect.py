"""M6 under `corral exec`: workspace files the host executes stay out of reach.

The sandbox plants git hooks, git config commands, `.envrc`, editor and agent
configuration and shell rc files, in the workspace's repository, a nested
repository and a repository whose gitdir is a separate directory; then the
*host* runs plain git over them. A planted command that runs touches a file
in a host directory the sandbox cannot see. The same attack with every name
`--unprotect`ed is the control: there the host runs the planted commands.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from corral.broker.journal import read_rows
from corral.sandbox.protect import PROTECTED_NAMES

from .conftest import ExecFn, corral_argv, processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox]

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **_GIT_ENV, "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(
        ["git", "-C", str(cwd), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _repo(path: Path, *init: str) -> None:
    path.mkdir(exist_ok=True)
    assert _git(path, "init", "-q", *init).returncode == 0
    (path / "README").write_text("x\n")
    assert _git(path, "add", "README").returncode == 0
    assert _git(path, "commit", "-q", "-m", "init").returncode == 0


@pytest.fixture
def repos(workspace: Path) -> Path:
    """The workspace as a repository, with a nested one and one whose gitdir
    is a separate directory in the workspace (the worktree/separate-gitdir case)."""
    _repo(workspace)
    _repo(workspace / "sub")
    (workspace / "proj").mkdir()
    _repo(workspace / "proj", f"--separate-git-dir={workspace / 'store'}")
    assert (workspace / "proj" / ".git").is_file()
    return workspace


def _attack(hits: Path) -> str:
    plant = f'plant() {{ printf \'#!/bin/sh\\ntouch {hits}/%s\\n\' "$2" > "$1"; chmod +x "$1"; }}\n'
    return plant + "\n".join(
        [
            "plant .git/hooks/pre-commit pre-commit",
            "plant fsm.sh fsmonitor",
            'printf "[core]\\n\\tfsmonitor = $PWD/fsm.sh\\n" >> .git/config',
            f"echo 'touch {hits}/envrc' > .envrc",
            f'mkdir -p .vscode && echo \'{{"cmd": "touch {hits}/vscode"}}\' > .vscode/tasks.json',
            f"echo 'touch {hits}/bashrc' >> .bashrc",
            f'echo \'{{"cmd": "touch {hits}/mcp"}}\' > .mcp.json',
            "plant sub/.git/hooks/pre-commit sub-pre-commit",
            "plant store/hooks/pre-commit store-pre-commit",
            "echo ordinary > work.txt",
            "true",
        ]
    )


def _host_uses(ws: Path) -> None:
    """What the user does next on the host: commit in each repository."""
    for repo in (ws, ws / "sub", ws / "proj"):
        _git(repo, "status")
        _git(repo, "commit", "-q", "--allow-empty", "-m", "after the agent")


def _snapshot(ws: Path) -> dict[str, bytes]:
    files = [ws / ".git" / "config", ws / "sub" / ".git" / "config", ws / "store" / "config"]
    return {str(f): f.read_bytes() for f in files}


def test_planted_host_executed_files_never_run_on_the_host(
    corral_exec: ExecFn, repos: Path, tmp_path: Path
) -> None:
    hits = tmp_path / "hits"
    hits.mkdir()
    before = _snapshot(repos)
    out = corral_exec("sh", "-c", _attack(hits))
    assert out.code == 0, out.stderr
    assert (repos / "work.txt").read_text() == "ordinary\n"  # ordinary work still lands
    _host_uses(repos)
    assert sorted(os.listdir(hits)) == []
    assert _snapshot(repos) == before
    for rel in (".envrc", ".vscode", ".bashrc", ".mcp.json"):
        assert not os.path.lexists(repos / rel), rel
    for hooks in (repos / ".git", repos / "sub" / ".git", repos / "store"):
        assert not (hooks / "hooks" / "pre-commit").exists()
    layers = out.summary["layers"]
    assert isinstance(layers, dict)
    assert layers["protect"]["unprotected"] == []


def test_control_unprotected_names_do_run_on_the_host(
    corral_exec: ExecFn, repos: Path, tmp_path: Path
) -> None:
    """The same attack with every name unprotected reaches the host: the
    test above is not passing because the attack is broken."""
    hits = tmp_path / "hits"
    hits.mkdir()
    opts = tuple(a for n in PROTECTED_NAMES for a in ("--unprotect", n))
    out = corral_exec("sh", "-c", _attack(hits), opts=opts)
    assert out.code == 0, out.stderr
    _host_uses(repos)
    ran = set(os.listdir(hits))
    assert {"pre-commit", "fsmonitor", "sub-pre-commit", "store-pre-commit"} <= ran
    assert (repos / ".envrc").read_text().startswith("touch")
    assert (repos / ".vscode" / "tasks.json").exists()


def test_no_names_in_workspace_leaves_nothing_behind(corral_exec: ExecFn, workspace: Path) -> None:
    out = corral_exec("sh", "-c", "test -d .vscode && test -f .envrc && ! touch .envrc 2>/dev/null")
    assert out.code == 0, out.stderr  # the placeholders were there and read-only inside
    assert os.listdir(workspace) == []


def test_ordinary_work_and_git_inside(corral_exec: ExecFn, repos: Path) -> None:
    out = corral_exec(
        "sh", "-c", "mkdir -p src/a && echo hi > src/a/f.py && git status --porcelain src"
    )
    assert out.code == 0, out.stderr
    assert "src/" in out.stdout
    assert (repos / "src" / "a" / "f.py").read_text() == "hi\n"


def test_unprotect_git_lets_the_sandbox_commit(
    corral_exec: ExecFn, repos: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    ident = "-c user.name=a -c user.email=a@example.invalid"
    out = corral_exec(
        "sh",
        "-c",
        f"echo v > v.txt && git add v.txt && git {ident} commit -q -m agent && echo ok",
        opts=("--unprotect", ".git", "--journal", str(journal)),
    )
    assert out.code == 0, out.stderr
    assert "agent" in _git(repos, "log", "--format=%s", "-1").stdout
    rows = [r for r in read_rows(journal) if "host-executed" in r.reason]
    assert len(rows) == 1
    assert "unprotected by request: .git" in rows[0].reason
    assert rows[0].detail["unprotected"] == [".git"]


def test_symlinked_protected_name_is_refused(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "real-envrc"
    target.write_text("")
    (workspace / ".envrc").symlink_to(target)
    out = corral_exec("sh", "-c", f"echo 'touch {tmp_path}/hit' > .envrc")
    assert out.code == 125
    assert "protect" in out.stderr and ".envrc" in out.stderr
    assert target.read_text() == ""


def test_unknown_unprotect_name_is_bad_input(corral_exec: ExecFn) -> None:
    out = corral_exec("true", opts=("--unprotect", "README"))
    assert out.code == 2
    assert out.stderr.count("\n") == 1 and "--unprotect" in out.stderr


def test_dry_run_shows_protection(workspace: Path) -> None:
    argv = corral_argv("--workspace", str(workspace), "--unprotect", ".envrc", "--dry-run", "true")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"{workspace}/.bashrc" in proc.stdout
    assert f"{workspace}/.envrc" not in proc.stdout
    assert "unprotected: .envrc" in proc.stderr
    assert os.listdir(workspace) == []  # a dry run creates nothing


def _sandboxed_sh(marker: str) -> bool:
    for pid in processes_with(marker):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sh":
                return True
        except OSError:
            continue
    return False


def test_placeholders_of_a_killed_corral_are_swept(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path, marker: str
) -> None:
    argv = corral_argv("--workspace", str(workspace), "--", "sh", "-c", "sleep 60", marker)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: _sandboxed_sh(marker), 20)  # the command is running
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (workspace / ".envrc").exists()  # left behind by the killed corral
    other = tmp_path / "other"
    other.mkdir()
    assert corral_exec("true", ws=other).code == 0
    assert os.listdir(workspace) == []
    assert os.listdir(other) == []


def test_nested_repo_cannot_be_moved_aside_and_replaced(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    """Renaming a nested repository (or its parent) away and planting a
    look-alike with a hook at the old path must fail: the user's next commit
    in `a/sub` would run the look-alike's hook."""
    hits = tmp_path / "hits"
    hits.mkdir()
    (workspace / "a").mkdir()
    _repo(workspace / "a" / "sub")
    attack = (
        "mv a/sub a/sub.old || mv a a.old || rm -rf a/sub || rm -rf a\n"
        "mkdir -p a/sub && git init -q a/sub\n"
        f"printf '#!/bin/sh\\ntouch {hits}/hook\\n' > a/sub/.git/hooks/pre-commit\n"
        "chmod +x a/sub/.git/hooks/pre-commit\n"
        "true\n"
    )
    out = corral_exec("sh", "-c", attack)
    assert out.code == 0, out.stderr
    _git(workspace / "a" / "sub", "commit", "-q", "--allow-empty", "-m", "user")
    assert os.listdir(hits) == []
    assert not (workspace / "a.old").exists() and not (workspace / "a" / "sub.old").exists()
    assert "user" in _git(workspace / "a" / "sub", "log", "--format=%s", "-1").stdout


def test_placeholder_stays_while_a_second_sandbox_binds_it(workspace: Path, marker: str) -> None:
    """Sandbox A creates the `.envrc` placeholder; B, started in the same
    workspace meanwhile, binds it read-only. When A ends, removing the
    placeholder would detach B's mount and let B create `.envrc`."""

    def start(name: str, script: str) -> subprocess.Popen[bytes]:
        argv = corral_argv(
            "--workspace", str(workspace), "--", "sh", "-c", script, f"{marker}-{name}"
        )
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: _sandboxed_sh(f"{marker}-{name}"), 20)
        return proc

    wait = "while [ ! -e {0} ]; do sleep 0.02; done"
    a = start("a", wait.format("go-a"))
    b = start("b", wait.format("go-b") + "; echo 'touch /tmp/pwned' > .envrc; echo $? > b-rc")
    try:
        (workspace / "go-a").touch()
        assert a.wait(timeout=30) == 0
        (workspace / "go-b").touch()
        assert b.wait(timeout=30) == 0
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert (workspace / "b-rc").read_text().strip() != "0"
    assert not (workspace / ".envrc").exists()
    assert sorted(os.listdir(workspace)) == ["b-rc", "go-a", "go-b"]


def test_new_repository_below_the_top_is_reported(
    corral_exec: ExecFn, repos: Path, tmp_path: Path
) -> None:
    """Nothing exists at `newdir/.git` to protect when the command starts; a
    repository it creates there is named in the summary, on stderr and in
    the journal, so the user knows not to run git in it blindly."""
    journal = tmp_path / "j.sqlite"
    out = corral_exec(
        "sh",
        "-c",
        "git init -q newdir && echo 'touch x' > sub/.envrc && echo ok > sub/plain.txt",
        opts=("--journal", str(journal)),
    )
    assert out.code == 0, out.stderr
    layers = out.summary["layers"]
    assert isinstance(layers, dict)
    assert layers["protect"]["created_below_top"] == ["newdir/.git", "sub/.envrc"]
    assert "newdir/.git" in out.stderr and "warning" in out.stderr
    rows = [r for r in read_rows(journal) if "below the workspace top" in r.reason]
    assert len(rows) == 1 and rows[0].detail["paths"] == ["newdir/.git", "sub/.envrc"]
    quiet = corral_exec("sh", "-c", "echo more > sub/plain.txt")
    assert "warning" not in quiet.stderr


def test_pinned_parent_does_not_reopen_a_read_only_bind(
    corral_exec: ExecFn, workspace: Path
) -> None:
    """`a` is pinned (a nested repository lies below it); `--ro a/data` must
    stay read-only, not be covered by the pin's writable mount."""
    (workspace / "a").mkdir()
    _repo(workspace / "a" / "b")
    data = workspace / "a" / "data"
    data.mkdir()
    (data / "keep.txt").write_text("original\n")
    out = corral_exec(
        "sh",
        "-c",
        "echo changed > a/data/keep.txt; echo x > a/data/new.txt; true",
        opts=("--ro", str(data)),
    )
    assert out.code == 0, out.stderr
    assert (data / "keep.txt").read_text() == "original\n"
    assert not (data / "new.txt").exists()


def test_hooks_path_directories_are_protected(
    corral_exec: ExecFn, workspace: Path, tmp_path: Path
) -> None:
    """husky-style `core.hooksPath = .husky` (existing, tracked hooks) and a
    hooksPath whose directory does not exist yet (`sub`: `.hooks`)."""
    hits = tmp_path / "hits"
    hits.mkdir()
    _repo(workspace)
    assert _git(workspace, "config", "core.hooksPath", ".husky").returncode == 0
    (workspace / ".husky").mkdir()
    (workspace / ".husky" / "pre-commit").write_text("#!/bin/sh\ntrue\n")
    (workspace / ".husky" / "pre-commit").chmod(0o755)
    _repo(workspace / "sub")
    assert _git(workspace / "sub", "config", "core.hooksPath", ".hooks").returncode == 0
    attack = (
        f"echo 'touch {hits}/husky' >> .husky/pre-commit\n"
        "mkdir -p sub/.hooks\n"
        f"printf '#!/bin/sh\\ntouch {hits}/sub\\n' > sub/.hooks/pre-commit\n"
        "chmod +x sub/.hooks/pre-commit\n"
        "true\n"
    )
    out = corral_exec("sh", "-c", attack)
    assert out.code == 0, out.stderr
    for repo in (workspace, workspace / "sub"):
        _git(repo, "commit", "-q", "--allow-empty", "-m", "user")
    assert os.listdir(hits) == []
    assert (workspace / ".husky" / "pre-commit").read_text() == "#!/bin/sh\ntrue\n"
    assert not (workspace / "sub" / ".hooks").exists()


def test_dry_run_escapes_hostile_repository_names(workspace: Path) -> None:
    """A nested repository's name (written by an earlier sandbox, say) lands
    in the printed bwrap line; its control bytes must not reach the terminal."""
    name = os.fsencode(workspace) + b"/x\x1b]0;pwned\x07\xff"
    os.makedirs(name + b"/.git")
    argv = corral_argv("--workspace", str(workspace), "--dry-run", "true")
    proc = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert b"\x1b" not in proc.stdout and b"\x07" not in proc.stdout
    assert b"x\\x1b]0;pwned\\x07\\xff/.git" in proc.stdout


def test_linked_worktree_with_its_repository_in_a_rw_grant(tmp_path: Path) -> None:
    """The workspace is a `git worktree` of a repository passed as `--rw`:
    the repository's hooks (its common dir) and its top-level names are
    protected too, and `ws/.git` (the gitdir: file) cannot be redirected."""
    hits = tmp_path / "hits"
    hits.mkdir()
    main = tmp_path / "main"
    _repo(main)
    ws = tmp_path / "wt"
    assert _git(main, "worktree", "add", "-q", str(ws)).returncode == 0
    gitfile = (ws / ".git").read_text()
    attack = (
        f"printf '#!/bin/sh\\ntouch {hits}/hook\\n' > {main}/.git/hooks/pre-commit\n"
        f"chmod +x {main}/.git/hooks/pre-commit\n"
        f"echo 'touch {hits}/envrc' > {main}/.envrc\n"
        "echo 'gitdir: /tmp/elsewhere' > .git\n"
        "true\n"
    )
    argv = corral_argv("--workspace", str(ws), "--rw", str(main), "--", "sh", "-c", attack)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    _git(main, "commit", "-q", "--allow-empty", "-m", "user")  # the worktree shares these hooks
    assert os.listdir(hits) == []
    assert not (main / ".envrc").exists()
    assert (ws / ".git").read_text() == gitfile
