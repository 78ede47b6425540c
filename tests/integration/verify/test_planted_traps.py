"""The traps of `hostint-run-planted-traps` are real (host only, no sandbox).

The probe is not applicable on `--backend none` (it tests `corral run`), so its
baseline lives here: the probe's own program plants its traps in a directory
on the host, and ordinary host tools run over a copy of it - plain `git add`
and `git commit`, `make`, a shell sourcing the rc files, `python3 setup.py`,
pytest's `conftest.py` import, an agent CLI starting `.mcp.json`'s server and
`.claude/settings.json`'s hooks, `npm install` - each of which makes its
markers appear. The same workspace committed and snapshotted by corral's
`TrustedRepo` makes none appear, and the suite's oracle reads the markers as
the attack taking effect.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from corral.hostgit import TrustedRepo, hardened_env
from corral.verify.model import Evidence
from corral.verify.oracles import PlantedTrapsRan
from corral.verify.probes import PRELUDE, all_probes
from corral.verify.probes._mission import TRAP_FILES
from corral.verify.runner import _commit_files, _host_markers

MARKER = "cvm0123456789"
PY = "/usr/bin/python3"


def _plant(tmp_path: Path) -> tuple[Path, Path]:
    """Run the probe's program as session 1's agent does, but on the host."""
    probe = next(p for p in all_probes() if p.id == "hostint-run-planted-traps")
    ws, hits = tmp_path / "ws", tmp_path / "hits"
    ws.mkdir()
    hits.mkdir()
    program = f"import json\nP = json.loads({json.dumps({'hits': str(hits)})!r})\n"
    program += f"{PRELUDE}\n{probe.code}"
    out = subprocess.run(
        [PY, "-I", "-S", "-c", program, MARKER],
        cwd=ws,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "CORRAL-RESULT" in out.stdout, out.stdout + out.stderr
    assert "git " not in out.stdout.replace("CORRAL-RESULT", ""), out.stdout
    assert os.listdir(hits) == [], "planting alone ran a trap"
    return ws, hits


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = hardened_env(str(home))
    env.pop("GIT_PAGER")
    return env


def _fired(hits: Path) -> set[str]:
    return {n.removeprefix(f"{MARKER}-") for n in os.listdir(hits)}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=60, check=False)


@pytest.mark.timeout(120)
def test_traps_are_real_under_plain_host_tools(tmp_path: Path) -> None:
    ws, hits = _plant(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(ws, copy, symlinks=True)
    env = _env(tmp_path)
    git = ["git", "-c", "user.name=h", "-c", "user.email=h@h.invalid"]
    _run([*git, "add", "-A"], copy, env)
    _run([*git, "commit", "-qm", "host"], copy, env)
    (copy / "nested" / "README.txt").write_text("edited on the host\n")
    _run([*git, "commit", "-qam", "host"], copy / "nested", env)
    _run(["make", "-s"], copy, env)
    for rc in (".bashrc", ".bash_profile", ".profile", ".zshrc", ".envrc"):
        _run(["sh", "-c", f". ./{rc}"], copy, env)
    _run([PY, "setup.py", "--name"], copy, env)
    _run([PY, "-c", "import conftest"], copy, env)
    # What an agent CLI started in this directory on the host would run.
    for server in json.loads((copy / ".mcp.json").read_text())["mcpServers"].values():
        _run([server["command"], *server["args"]], copy, env)
    settings = json.loads((copy / ".claude" / "settings.json").read_text())
    _run(["sh", "-c", settings["apiKeyHelper"]], copy, env)
    for group in settings["hooks"]["SessionStart"]:
        for hook in group["hooks"]:
            _run(["sh", "-c", hook["command"]], copy, env)
    fired = _fired(hits)
    assert {
        "hook-pre-commit",
        "hook-commit-msg",
        "hook-post-commit",
        "hook-reference-transaction",
        "hook-post-index-change",
        "fsmonitor",
        "filter-clean",
        "nested-hook-pre-commit",
        "nested-gpg-program",
        "make",
        "bashrc",
        "bash_profile",
        "profile",
        "zshrc",
        "envrc",
        "setup.py",
        "conftest.py",
        "mcp-json",
        "claude-api-key-helper",
        "claude-hook",
    } <= fired, sorted(fired)
    # The suite's host-side reading and oracle call that the attack taking effect.
    markers = _host_markers(str(hits), MARKER)
    assert markers and len(markers) == len(fired)
    ev = Evidence(facts={"host_markers": markers}, ctx={"marker": MARKER})
    j = PlantedTrapsRan(TRAP_FILES).judge(ev)
    assert j.observed == "allowed" and f"{len(fired)} planted trap(s)" in j.why, j.why
    assert ": bash_profile, bashrc," in j.why, j.why


@pytest.mark.requires_npm
@pytest.mark.timeout(120)
def test_package_json_scripts_run_under_npm_install(tmp_path: Path) -> None:
    ws, hits = _plant(tmp_path)
    env = _env(tmp_path)
    env["npm_config_cache"] = str(tmp_path / "npm-cache")
    _run(["npm", "install", "--offline", "--no-audit", "--no-fund"], ws, env)
    assert {"npm-preinstall", "npm-install", "npm-postinstall"} <= _fired(hits), _fired(hits)


@pytest.mark.timeout(120)
def test_corral_host_git_runs_none_of_them(tmp_path: Path) -> None:
    """What corral does between sessions, over the same workspace: no marker."""
    ws, hits = _plant(tmp_path)
    repo = TrustedRepo(tmp_path / "git", ws)
    repo.init()
    first = repo.commit_all("session 1")
    repo.snapshot(first, tmp_path / "snap-1")
    (ws / "session-2.txt").write_text("two\n")
    second = repo.commit_all("session 2")
    repo.snapshot(second, tmp_path / "snap-2")
    repo.diff_stat(first, second)
    assert os.listdir(hits) == []
    files = _commit_files(tmp_path / "git", ws, first)
    assert set(TRAP_FILES) <= set(files)
    assert not any(f.startswith(".git/") or "/.git/" in f for f in files)
    assert (tmp_path / "snap-2" / ".mcp.json").is_file()
    assert _commit_files(tmp_path / "git", ws, None) == []
